"""The bench, at tiny sizes, so it cannot rot (the real run is `python -m bench`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import inprocess, procs
from bench.run import ways


def test_the_quick_bench_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--no-litellm",
            "--out",
            str(out),
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["latency"]) == {
        f"{kind}/{mode}"
        for kind in ("plain", "stream_ttfb")
        for mode in ("sequential", "c32", "c256")
    }
    for figures in report["latency"].values():
        assert figures["direct"]["n"] > 0 and figures["brim"]["n"] == figures["direct"]["n"]
        assert figures["brim"]["p50_ms"] > 0
        assert figures["bare"]["n"] == figures["direct"]["n"]  # the floor: a bare proxy
        assert set(figures["over_bare"]["brim"]) == {"p50_ms", "p99_ms", "p50_ratio", "p99_ratio"}
    assert report["throughput"]["brim"]["rps"] > 0 and report["throughput"]["bare"]["rps"] > 0
    assert report["throughput"]["brim"]["share_of_bare"] > 0
    assert report["throughput"]["brim"]["cpu_us_per_request"] > 0
    ways = report["latency"]["plain/sequential"]["ways"]  # split by the fake provider's stamps
    assert set(ways) >= {"bare", "brim"} and set(ways["brim"]) == {"in_ms", "back_ms"}
    assert all(
        "ways" not in report["latency"][s] for s in report["latency"] if s.startswith("stream")
    )
    assert "where the added p50 goes (plain/sequential, ms)" in result.stdout
    relayed = report["relay"]  # CPU per streamed event relayed: bare, brim and their ratio
    assert relayed["bare"]["us_per_event"] > 0 and relayed["brim"]["over_bare"] > 0
    assert "stream relay, CPU per event" in result.stdout
    scaled = report["scale_out"]  # --workers 1 against --workers 2, in the same run
    one, two = scaled["throughput_rps"]["1"], scaled["throughput_rps"]["2"]
    assert one > 0 and two > 0
    assert scaled["throughput_ratio"] == pytest.approx(two / one, rel=0.02)
    assert scaled["cpu_cores_used"]["2"]["brim"] > 0
    for figures in scaled["streamed"].values():
        assert figures["errors"] == 0 and figures["requests"] > 0 and figures["p99_ms"] > 0
    assert "scale-out at c=256" in result.stdout
    assert (
        report["guard_fitting"]["warm_ms"] > 0
        and report["compression"]["tokens_out"] <= report["compression"]["budget"]
    )
    assert report["startup"]["plain"]["ready_s"] < 30
    assert "throughput through brim" in result.stdout
    hostile = report["hostile"]  # behaviour only; its timings are figures, not checked here
    assert hostile["problems"] == []
    assert hostile["saturation"]["bursts"]["50"]["statuses"] == {"503": 50}
    assert hostile["slow_loris"]["got_408"] == hostile["slow_loris"]["connections"] == 300
    assert hostile["large_bodies"]["served_200"] >= 1
    assert "slow loris: 300 half-open connections" in result.stdout


def test_a_process_under_test_runs_the_code_of_its_own_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--base DIR` runs a brim from another checkout: started from this one, `python -m` would
    # import this checkout's code first (its working directory) unless told otherwise.
    for tree in ("measured", "started_from"):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / "probe_module.py").write_text(f"print({tree!r})\n")
    monkeypatch.chdir(tmp_path / "started_from")
    result = subprocess.run(
        [sys.executable, "-m", "probe_module"],
        capture_output=True,
        text=True,
        timeout=60,
        **procs.running_in(tmp_path / "measured"),
    )
    assert result.stdout.strip() == "measured", result.stderr


def test_the_agent_session_builder_makes_valid_tool_pairs() -> None:
    from tests.fakes import pairing_errors

    messages = inprocess.agent_session(5, 40)
    assert len(messages) == 2 + 2 * 5
    assert pairing_errors(messages) == []


def test_the_soak_runs_short_and_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--streams", "30", "--seconds", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["brim"]["errors"] == 0 and report["brim"]["requests"] > 100
    assert report["rss_mb"]["max"] < 400 and report["rss_flat"] is True
    assert report["p99_ratio"] > 0


def test_the_added_latency_is_split_into_the_way_in_and_the_way_back() -> None:
    legs = {
        "direct": [(0.2, 0.1), (0.3, 0.1), (0.25, 0.2)],
        "bare": [(0.45, 0.3), (0.5, 0.3), (0.4, 0.35)],
        "brim": [(0.6, 0.35), (0.55, 0.4), (0.65, 0.4)],
        "litellm": [],  # its reply did not carry the fake provider's stamps
    }
    assert ways(legs) == {
        "bare": {"in_ms": 0.2, "back_ms": 0.2},
        "brim": {"in_ms": 0.35, "back_ms": 0.3},
    }
    assert ways({"bare": [(0.4, 0.3)]}) == {}  # nothing to subtract without direct calls


def test_compression_against_a_base_runs_each_trees_own_code(tmp_path: Path) -> None:
    # `--base DIR`: the compression measure in a fresh process of each tree, alternating. A base
    # tree whose measure is a stub shows that the base's figures come from the base's code.
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "bench" / "inprocess.py").write_text(
        "def compression(calls, per, budget):\n"
        "    return {'cold_ms': 100.0, 'warm_ms': 10.0, 'carried_ms': 1.0, 'tokens_out': -calls}\n"
    )
    against = inprocess.compression_against(tmp_path, 40, 100, 4_000, rounds=2)
    assert against["base_ms"] == {"cold_ms": 100.0, "warm_ms": 10.0, "carried_ms": 1.0}
    this = against["this_ms"]
    assert 0 < this["cold_ms"] < 100  # this checkout's own work on 40 results: milliseconds
    assert against["ratio"]["cold_ms"] == round(this["cold_ms"] / 100, 2)
    assert against["same_output"] is False  # the stub "sent" a different size: not comparable
