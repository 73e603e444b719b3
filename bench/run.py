"""`python -m bench`: every scenario in one go, a table on stdout, the figures in a JSON file.

python -m bench                 # the full run (creates LiteLLM's venv once, ~2 min)
python -m bench --quick         # tiny sizes: a smoke run (what the test suite runs)
python -m bench --no-litellm    # skip the LiteLLM comparison
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


def added(results: dict[str, list[float]], name: str) -> dict[str, float]:
    direct, through = load.summary(results["direct"]), load.summary(results[name])
    return {
        **through,
        "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 3),
        "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 3),
    }


def latency(targets: dict[str, str], size: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stream in (False, True):
        kind = "stream_ttfb" if stream else "plain"
        runs = {"sequential": asyncio.run(load.sequential(targets, size["sequential"], stream))}
        for concurrency in (32, 256):
            runs[f"c{concurrency}"] = asyncio.run(
                load.concurrent(targets, size["concurrent"], concurrency, stream)
            )
        for mode, results in runs.items():
            out[f"{kind}/{mode}"] = {
                "direct": load.summary(results["direct"]),
                **{name: added(results, name) for name in targets if name != "direct"},
            }
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
    brim = procs.start_brim(fake.url, scratch)
    litellm = None
    try:
        targets = {"direct": fake.url, "brim": brim.url}
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

        cpu_before = brim.cpu_s()
        rps, wall = asyncio.run(load.throughput(brim.url, size["throughput"], 256))
        report["throughput"] = {
            "rps": round(rps),
            "concurrency": 256,
            "brim_cpu_share": round((brim.cpu_s() - cpu_before) / wall, 2),
        }
    finally:
        for process in (litellm, brim):
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
    ]
    lines.append(
        f"{'latency':<24} {'direct p50/p99':>16} {'brim added p50/p99':>20} {'litellm added p50/p99':>22} {'brim : litellm':>15}"
    )
    for scenario, figures in report["latency"].items():
        direct = figures["direct"]
        brim = figures["brim"]
        row = f"{scenario:<24} {direct['p50_ms']:>7.3f}/{direct['p99_ms']:<8.3f} {brim['added_p50_ms']:>9.3f}/{brim['added_p99_ms']:<10.3f}"
        if "litellm" in figures:
            other = figures["litellm"]
            ratio = (
                other["added_p50_ms"] / brim["added_p50_ms"]
                if brim["added_p50_ms"] > 0
                else float("inf")
            )
            row += f" {other['added_p50_ms']:>10.3f}/{other['added_p99_ms']:<11.3f} {'1 : ' + format(ratio, '.1f'):>15}"
        lines.append(row)
    throughput = report["throughput"]
    lines += [
        "",
        f"throughput through brim at c=256: {throughput['rps']} req/s (brim CPU {throughput['brim_cpu_share']:.0%} of a core)",
        f"guard, fitting {report['guard_fitting']['tokens']:,}-token request, {report['guard_fitting']['tool_calls']} tool calls: cold {report['guard_fitting']['cold_ms']} ms, warm {report['guard_fitting']['warm_ms']} ms",
        f"compression {report['compression']['tokens_in']:,} → {report['compression']['tokens_out']:,} tokens (budget {report['compression']['budget']:,}): cold {report['compression']['cold_ms']} ms, warm {report['compression']['warm_ms']} ms, next turn carried forward {report['compression']['carried_ms']} ms",
    ]
    for label, figures in report["startup"].items():
        lines.append(
            f"start-up ({label}): ready in {figures['ready_s']} s, idle RSS {figures['idle_rss_mb']} MB"
        )
    return "\n".join(lines)
