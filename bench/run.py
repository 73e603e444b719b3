"""`python -m bench`: every scenario in one go, a table on stdout, the figures in a JSON file.
Among them, brim with `--workers 1` against `--workers 2` in the same run (`scale_out`).

python -m bench                 # the full run (creates LiteLLM's venv once, ~3 min)
python -m bench --quick         # tiny sizes: a smoke run (what the test suite runs)
python -m bench --no-litellm    # skip the LiteLLM comparison
python -m bench --base DIR      # also a brim running another checkout's code (e.g. `git archive`
                                # of main), interleaved: before and after in one run; and
                                # the compression measure in fresh processes of each tree,
                                # alternating (`compression_against_base`)
python -m bench.hostile         # only the hostile-client scenarios (saturation, slow loris,
                                # large bodies), which this runs too, last

Every latency scenario runs, interleaved: direct calls, a bare aiohttp pass-through proxy
(`bench.bare`, the floor of the stack), brim, and LiteLLM's proxy. brim's own cost is brim's
figure less the bare proxy's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson

from bench import hostile, inprocess, load, procs

T = TypeVar("T")

TARGETS = {
    "added_p50_ms": 0.3,
    "added_p99_ms": 1.0,
    "guard_warm_ms": 3.0,
    "guard_cold_ms": 60.0,
    "compress_cold_ms": 250.0,
    "compress_warm_ms": 40.0,
    "startup_s": 1.0,
    "idle_rss_mb": 120.0,
    "throughput_rps": 2000.0,
}
# brim against the bare pass-through proxy, same run (`over_bare`): added p50 and p99 at most
# these multiples of the bare proxy's, throughput at least this share of its.
BARE_TARGETS = {"p50_ratio": 1.3, "p99_ratio": 1.5, "throughput_share": 0.85}


def added(results: dict[str, list[float]], name: str) -> dict[str, float]:
    direct, through = load.summary(results["direct"]), load.summary(results[name])
    return {
        **through,
        "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 3),
        "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 3),
    }


def over_bare(figures: dict[str, Any], name: str) -> dict[str, float | None]:
    """`name`'s own cost: its added latency less the bare proxy's, and the ratios of the two."""
    own, bare = figures[name], figures["bare"]

    def ratio(key: str) -> float | None:  # None: the bare proxy added nothing to divide by
        return round(own[key] / bare[key], 2) if bare[key] > 0 else None

    return {
        "p50_ms": round(own["added_p50_ms"] - bare["added_p50_ms"], 3),
        "p99_ms": round(own["added_p99_ms"] - bare["added_p99_ms"], 3),
        "p50_ratio": ratio("added_p50_ms"),
        "p99_ratio": ratio("added_p99_ms"),
    }


def ways(legs: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Where each proxy's added p50 goes: on the way in (sent → the provider has it) and on
    the way back (the provider answered → the client has read it), each less a direct call's
    p50 of the same. For the proxies that relayed the fake provider's stamps (`load.one`)."""
    if not legs.get("direct"):
        return {}
    direct_in, direct_back = (statistics.median(leg) for leg in zip(*legs["direct"], strict=True))
    out = {}
    for name, measured in legs.items():
        if name != "direct" and measured:
            way_in, way_back = (statistics.median(leg) for leg in zip(*measured, strict=True))
            out[name] = {
                "in_ms": round(way_in - direct_in, 3),
                "back_ms": round(way_back - direct_back, 3),
            }
    return out


def latency(targets: dict[str, str], size: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    brims = [name for name in targets if name.startswith("brim")]
    for stream in (False, True):
        kind = "stream_ttfb" if stream else "plain"
        legs: dict[str, list[tuple[float, float]]] = {}  # none from streams: they carry no stamps
        runs = {
            "sequential": asyncio.run(load.sequential(targets, size["sequential"], stream, legs))
        }
        for concurrency in (32, 256):
            runs[f"c{concurrency}"] = asyncio.run(
                load.concurrent(targets, size["concurrent"], concurrency, stream)
            )
        for mode, results in runs.items():
            figures: dict[str, Any] = {
                "direct": load.summary(results["direct"]),
                **{name: added(results, name) for name in targets if name != "direct"},
            }
            if "bare" in figures:
                figures["over_bare"] = {name: over_bare(figures, name) for name in brims}
            if mode == "sequential" and (split := ways(legs)):
                figures["ways"] = split
            out[f"{kind}/{mode}"] = figures
    return out


def throughputs(
    processes: dict[str, procs.Process], requests: int, concurrency: int, rounds: int
) -> dict[str, Any]:
    """Requests per second through each process at `concurrency`, in `rounds` alternating
    rounds (so drift hits all alike): the median round, the spread, and the CPU share of the
    process (of one core) in its median round."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in processes}
    for index in range(rounds):
        order = list(processes)
        order = order[index % len(order) :] + order[: index % len(order)]
        for name in order:
            process = processes[name]
            cpu_before = process.cpu_s()
            rps, wall = asyncio.run(load.throughput(process.url, requests // rounds, concurrency))
            runs[name].append((rps, (process.cpu_s() - cpu_before) / wall))
    out: dict[str, Any] = {"concurrency": concurrency, "rounds": rounds}
    for name, figures in runs.items():
        ordered = sorted(figures)
        rps, cpu = ordered[len(ordered) // 2]
        out[name] = {
            "rps": round(rps),
            "min_rps": round(ordered[0][0]),
            "max_rps": round(ordered[-1][0]),
            "cpu_share": round(cpu, 2),
            # the process's CPU time per request served (user and system, its median round):
            # steadier from run to run than the rates, which move with what else the machine does
            "cpu_us_per_request": round(cpu / rps * 1e6, 1),
        }
    if "bare" in out:
        for name in processes:
            if name.startswith("brim"):
                out[name]["share_of_bare"] = round(out[name]["rps"] / out["bare"]["rps"], 3)
    return out


def relay(
    processes: dict[str, procs.Process], streams: int, events: tuple[int, int], rounds: int
) -> dict[str, Any]:
    """CPU per streamed event relayed, by process: `streams` streams of `events[0]` content
    events and as many of `events[1]`, each event reaching the proxy as a read of its own; the
    difference in the process's CPU time over the difference in events (so what every stream
    costs whatever its length cancels out). Median of `rounds` alternating rounds."""
    short, long = events
    per_event: dict[str, list[float]] = {name: [] for name in processes}
    for index in range(rounds):
        order = list(processes)
        order = order[index % len(order) :] + order[: index % len(order)]
        for name in order:
            process = processes[name]
            spent = []
            for count in (short, long):
                before = procs.cpu_ns(process.popen.pid)
                asyncio.run(load.long_streams(process.url, streams, count))
                spent.append(procs.cpu_ns(process.popen.pid) - before)
            per_event[name].append((spent[1] - spent[0]) / (streams * (long - short)) / 1000)
    out: dict[str, Any] = {"streams": streams, "events": list(events), "rounds": rounds}
    for name, figures in per_event.items():
        out[name] = {"us_per_event": round(statistics.median(figures), 2)}
    if "bare" in out:
        for name in processes:
            if name.startswith("brim"):
                ratio = out[name]["us_per_event"] / out["bare"]["us_per_event"]
                out[name]["over_bare"] = round(ratio, 2)
    return out


class Cores:
    """The cores brim, the fake provider, this process (the load generator) and the whole
    machine (anyone's work) used while `measure` ran its calls, per second of their wall time."""

    NAMES = ("brim", "fake", "client", "machine")

    def __init__(self, brim: procs.Process | None, fake: procs.Process) -> None:
        self.brim, self.fake = brim, fake
        self.seconds = [0.0] * len(self.NAMES)
        self.wall = 0.0

    def _now(self) -> tuple[float, ...]:
        brim = self.brim.cpu_s() if self.brim else 0.0
        return (brim, self.fake.cpu_s(), time.process_time(), procs.machine_cpu_s())

    def measure(self, run: Coroutine[Any, Any, T]) -> T:
        """Run `run` (on a new event loop) and add what it took."""
        before, started = self._now(), time.perf_counter()
        result = asyncio.run(run)
        self.wall += time.perf_counter() - started
        for index, (a, b) in enumerate(zip(before, self._now(), strict=True)):
            self.seconds[index] += b - a
        return result

    def shares(self) -> dict[str, float]:
        return {
            name: round(s / self.wall, 2) for name, s in zip(self.NAMES, self.seconds, strict=True)
        }


def scale_out(
    fake: procs.Process, one: procs.Process, folder: Path, size: dict[str, Any]
) -> dict[str, Any]:
    """brim with one worker (`one`, running) against brim with two, in the same run: throughput
    at concurrency 256 in interleaved rounds (the median of each) and time to first byte with
    many concurrent streams (`size`: requests per round, rounds, streams, seconds per run, of
    which the first `warmup_s` are not timed). Every process shares this machine's cores — the
    load generator (this process: one core at most), the fake provider and brim — so the cores
    each used are reported, and the whole machine's (other work included)."""
    two = procs.start_brim(fake.url, folder, workers=2)
    brims = {"1": one, "2": two}
    clients, seconds, warmup = size["streams"], size["seconds"], size["warmup_s"]
    try:
        rates: dict[str, list[float]] = {workers: [] for workers in brims}
        rounds = {workers: Cores(brim, fake) for workers, brim in brims.items()}
        for _ in range(size["rounds"]):
            for workers, brim in brims.items():
                rps, _ = rounds[workers].measure(load.throughput(brim.url, size["requests"], 256))
                rates[workers].append(rps)
        streamed: dict[str, dict[str, Any]] = {}
        streaming: dict[str, Cores] = {}
        targets: list[tuple[str, procs.Process | None]] = [("direct", None), *brims.items()]
        for name, target in targets:
            url = fake.url if target is None else target.url
            streaming[name] = Cores(target, fake)
            streamed[name] = streaming[name].measure(
                load.streams(url, clients, seconds, warmup_s=warmup)
            )
    finally:
        two.stop()
    medians = {workers: statistics.median(values) for workers, values in rates.items()}
    return {
        "throughput_rps": {w: round(r) for w, r in medians.items()},
        "throughput_ratio": round(medians["2"] / medians["1"], 2),
        "cpu_cores_used": {w: cores.shares() for w, cores in rounds.items()},
        **{key: size[key] for key in ("rounds", "requests", "streams", "seconds", "warmup_s")},
        "streamed": {
            name: {
                **{k: figures[k] for k in ("requests", "errors", "p50_ms", "p99_ms")},
                "cpu_cores_used": streaming[name].shares(),
            }
            for name, figures in streamed.items()
        },
    }


def startup(fake_url: str, folder: Path) -> dict[str, Any]:
    out = {}
    for label, litellm_upstream in (("plain", False), ("with_litellm_upstream", True)):
        process = procs.start_brim(fake_url, folder, litellm_upstream)
        time.sleep(1.0)
        out[label] = {
            "ready_s": round(process.ready_s, 3),
            "idle_rss_mb": round(process.rss_mb(), 1),
        }
        process.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy")
    parser.add_argument("--out", default="bench/results/latest.json", help="where the JSON goes")
    parser.add_argument(
        "--dir",
        default=os.environ.get("BRIM_BENCH_DIR", str(Path.home() / ".cache" / "brim-bench")),
        help="where LiteLLM's venv is kept",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="also measure a brim running the code in this folder (another checkout), as brim@base",
    )
    args = parser.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    quick = args.quick
    size = {
        "sequential": 30 if quick else 2_000,
        "concurrent": 96 if quick else 3_000,
        "throughput": 300 if quick else 20_000,
        "relay_streams": 2 if quick else 30,
    }
    scaled = {
        "requests": 300 if quick else 4_000,
        "rounds": 1 if quick else 3,
        "streams": 50 if quick else 500,
        "seconds": 1.0 if quick else 6.0,
        "warmup_s": 0.0 if quick else 1.0,
    }
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": quick,
    }

    fake = procs.start_fake()
    scratch = Path(tempfile.mkdtemp(prefix="brim-bench-"))
    bare = procs.start_bare(fake.url)
    brim = procs.start_brim(fake.url, scratch)
    base = procs.start_brim(fake.url, scratch, root=args.base.resolve()) if args.base else None
    litellm = None
    try:
        targets = {"direct": fake.url, "bare": bare.url, "brim": brim.url}
        if base is not None:
            targets["brim@base"] = base.url
            report["base"] = str(args.base)
        if not args.no_litellm:
            binary = procs.litellm_venv(folder)
            if binary is None:
                report["litellm"] = "could not be installed; compared without it"
            else:
                litellm = procs.start_litellm(binary, fake.url, scratch)
                targets["litellm"] = litellm.url
                report["litellm"] = {
                    "version": procs.LITELLM_VERSION,
                    "ready_s": round(litellm.ready_s, 2),
                }
        report["latency"] = latency(targets, size)

        measured = {"bare": bare, "brim": brim, **({"brim@base": base} if base else {})}
        report["throughput"] = throughputs(measured, size["throughput"], 256, rounds=3)
        report["relay"] = relay(measured, size["relay_streams"], (10, 110), rounds=3)
        if litellm is not None:  # idle from here on: out of the way
            litellm.stop()
            litellm = None
        report["scale_out"] = scale_out(fake, brim, scratch, scaled)
    finally:
        for process in (litellm, base, brim, bare):
            if process is not None:
                process.stop()
    report["startup"] = startup(fake.url, scratch)
    fake.stop()

    report["guard_fitting"] = inprocess.guard_fitting(30 if quick else 300, 60 if quick else 480)
    report["compression"] = inprocess.compression(
        40 if quick else 1_000, 100 if quick else 990, 4_000 if quick else 128_000
    )
    if args.base:
        report["compression_against_base"] = inprocess.compression_against(
            args.base.resolve(),
            *((40, 100, 4_000) if quick else (1_000, 990, 128_000)),
            rounds=3 if quick else 5,
        )
    report["hostile"] = hostile.run(quick)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(render(report))
    print(f"\nfull results: {out}")
    return 0


def render(report: dict[str, Any]) -> str:
    lines = [
        f"brim benchmarks — Python {report['machine']['python']}, {report['machine']['cpus']} CPUs{' (quick)' if report['quick'] else ''}",
        "",
        "latency: direct p50/p99 ms; the others: added over direct, p50/p99 ms",
    ]
    names = [
        name
        for name in next(iter(report["latency"].values()))
        if name not in ("direct", "over_bare", "ways")
    ]
    lines.append(f"{'':<24} {'direct':>15}" + "".join(f" {name:>15}" for name in names))
    for scenario, figures in report["latency"].items():
        direct = figures["direct"]
        row = f"{scenario:<24} {direct['p50_ms']:>7.3f}/{direct['p99_ms']:<7.3f}"
        for name in names:
            row += f" {figures[name]['added_p50_ms']:>7.3f}/{figures[name]['added_p99_ms']:<7.3f}"
        lines.append(row)
    if any("over_bare" in figures for figures in report["latency"].values()):
        lines += [
            "",
            "brim's own cost (brim − bare, ms) and brim's added ÷ bare's added "
            f"(targets ≤ {BARE_TARGETS['p50_ratio']} × p50, ≤ {BARE_TARGETS['p99_ratio']} × p99)",
        ]
        for scenario, figures in report["latency"].items():
            for name, own in figures.get("over_bare", {}).items():
                ratios = [
                    "  n/a" if own[key] is None else f"{own[key]:.2f} ×"
                    for key in ("p50_ratio", "p99_ratio")
                ]
                lines.append(
                    f"{scenario:<24} {name:<10} p50 {own['p50_ms']:>+7.3f} ({ratios[0]})"
                    f"   p99 {own['p99_ms']:>+7.3f} ({ratios[1]})"
                )
    for scenario, figures in report["latency"].items():
        if figures.get("ways"):
            lines.append(
                f"where the added p50 goes ({scenario}, ms), on the way in / on the way back: "
                + ", ".join(
                    f"{name} {way['in_ms']:+.3f} / {way['back_ms']:+.3f}"
                    for name, way in figures["ways"].items()
                )
            )
    throughput = report["throughput"]
    scaled = report["scale_out"]
    rates, used, streamed = scaled["throughput_rps"], scaled["cpu_cores_used"], scaled["streamed"]
    lines += [
        "",
        f"throughput at c={throughput['concurrency']}, median of {throughput['rounds']} rounds:",
    ]
    for name, figures in throughput.items():
        if not isinstance(figures, dict):
            continue
        share = figures.get("share_of_bare")
        lines.append(
            f"  throughput through {name}: {figures['rps']} req/s ({figures['min_rps']}–{figures['max_rps']}), "
            f"CPU {figures['cpu_share']:.0%} of a core, {figures['cpu_us_per_request']} µs a request"
            + (
                f", {share:.0%} of bare (target ≥ {BARE_TARGETS['throughput_share']:.0%})"
                if share
                else ""
            )
        )
    relayed = report["relay"]
    lines.append(
        f"stream relay, CPU per event ({relayed['streams']} streams of {relayed['events'][0]} "
        f"and of {relayed['events'][1]} events, median of {relayed['rounds']} rounds): "
        + ", ".join(
            f"{name} {figures['us_per_event']} µs"
            + (f" ({figures['over_bare']} × bare)" if "over_bare" in figures else "")
            for name, figures in relayed.items()
            if isinstance(figures, dict)
        )
    )
    lines += [
        "",
        f"scale-out at c=256: --workers 1 {rates['1']} req/s, --workers 2 {rates['2']} req/s: × {scaled['throughput_ratio']}",
        f"  cores used by brim / fake provider / load client / whole machine: {_cores(used['1'])} and {_cores(used['2'])} of {report['machine']['cpus']}",
        f"{scaled['streams']} concurrent streams, time to first byte p50 / p99: direct {streamed['direct']['p50_ms']} / {streamed['direct']['p99_ms']} ms, "
        f"--workers 1 {streamed['1']['p50_ms']} / {streamed['1']['p99_ms']} ms, --workers 2 {streamed['2']['p50_ms']} / {streamed['2']['p99_ms']} ms",
        f"  cores used: direct {_cores(streamed['direct']['cpu_cores_used'])}, --workers 1 {_cores(streamed['1']['cpu_cores_used'])}, --workers 2 {_cores(streamed['2']['cpu_cores_used'])}",
        f"guard, fitting {report['guard_fitting']['tokens']:,}-token request, {report['guard_fitting']['tool_calls']} tool calls: cold {report['guard_fitting']['cold_ms']} ms, warm {report['guard_fitting']['warm_ms']} ms",
        f"compression {report['compression']['tokens_in']:,} → {report['compression']['tokens_out']:,} tokens (budget {report['compression']['budget']:,}): cold {report['compression']['cold_ms']} ms, warm {report['compression']['warm_ms']} ms, next turn carried forward {report['compression']['carried_ms']} ms",
    ]
    if against := report.get("compression_against_base"):
        lines.append(
            f"compression against --base (median of {against['rounds']} fresh processes each, "
            "alternating): "
            + ", ".join(
                f"{time.removesuffix('_ms')} {against['this_ms'][time]:g} against "
                f"{against['base_ms'][time]:g} ms (× {against['ratio'][time]})"
                for time in inprocess.TIMES
            )
            + ("" if against["same_output"] else " — NOT the same output: different work")
        )
    for label, figures in report["startup"].items():
        lines.append(
            f"start-up ({label}): ready in {figures['ready_s']} s, idle RSS {figures['idle_rss_mb']} MB"
        )
    lines += ["", *hostile.render(report["hostile"])]
    return "\n".join(lines)


def _cores(shares: dict[str, float]) -> str:
    return " / ".join(f"{shares[name]:g}" for name in Cores.NAMES)
