"""brim's benchmarks: `python -m bench` (see the README). Not a test suite; not run in CI."""
