"""`python -m bench`: every scenario in one go, a table on stdout, the figures in a JSON file.

python -m bench                 # the full run (creates LiteLLM's venv once, ~2 min)
python -m bench --quick         # tiny sizes: a smoke run (what the test suite runs)
python -m bench --no-litellm    # skip the LiteLLM comparison
python -m bench --base DIR      # also a brim running another checkout's code (e.g. `git archive`
                                # of main), interleaved: before and after in one run

Every latency scenario runs, interleaved: direct calls, a bare aiohttp pass-through proxy
(`bench.bare`, the floor of the stack), brim, and LiteLLM's proxy. brim's own cost is brim's
figure less the bare proxy's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench import inprocess, load, procs

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


def latency(targets: dict[str, str], size: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    brims = [name for name in targets if name.startswith("brim")]
    for stream in (False, True):
        kind = "stream_ttfb" if stream else "plain"
        runs = {"sequential": asyncio.run(load.sequential(targets, size["sequential"], stream))}
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
        }
    if "bare" in out:
        for name in processes:
            if name.startswith("brim"):
                out[name]["share_of_bare"] = round(out[name]["rps"] / out["bare"]["rps"], 3)
    return out


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
        if name not in ("direct", "over_bare")
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
    throughput = report["throughput"]
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
            f"CPU {figures['cpu_share']:.0%} of a core"
            + (
                f", {share:.0%} of bare (target ≥ {BARE_TARGETS['throughput_share']:.0%})"
                if share
                else ""
            )
        )
    lines += [
        "",
        f"guard, fitting {report['guard_fitting']['tokens']:,}-token request, {report['guard_fitting']['tool_calls']} tool calls: cold {report['guard_fitting']['cold_ms']} ms, warm {report['guard_fitting']['warm_ms']} ms",
        f"compression {report['compression']['tokens_in']:,} → {report['compression']['tokens_out']:,} tokens (budget {report['compression']['budget']:,}): cold {report['compression']['cold_ms']} ms, warm {report['compression']['warm_ms']} ms, next turn carried forward {report['compression']['carried_ms']} ms",
    ]
    for label, figures in report["startup"].items():
        lines.append(
            f"start-up ({label}): ready in {figures['ready_s']} s, idle RSS {figures['idle_rss_mb']} MB"
        )
    return "\n".join(lines)
