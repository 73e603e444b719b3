"""brim's benchmarks: `python -m bench` (see docs/benchmarks.md). Not a test suite; not run in CI."""
