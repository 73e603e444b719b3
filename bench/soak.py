"""`python -m bench.soak`: concurrent streams through brim for a while, loopback only, bounded
in streams and seconds. Reports errors, time-to-first-byte (direct and through brim, in the same
run) and brim's RSS sampled every second. Exits 1 on any error, or if RSS grew by more than the
larger of 10 MB and 5 % after settling (at 10 s, or half a shorter run).

    python -m bench.soak                         # 500 streams for 60 s
    python -m bench.soak --streams 50 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench import load, procs


def soak(streams: int, seconds: float) -> dict[str, Any]:
    fake = procs.start_fake()
    brim = procs.start_brim(fake.url, Path(tempfile.mkdtemp(prefix="brim-soak-")))
    try:
        direct = asyncio.run(load.streams(fake.url, streams, max(1.0, seconds / 6)))
        through = asyncio.run(load.streams(brim.url, streams, seconds, brim.rss_mb))
    finally:
        brim.stop()
        fake.stop()
    rss = [mb for _, mb in through["rss_mb"]]
    settle = min(10.0, seconds / 2)
    settled = next((mb for t, mb in through["rss_mb"] if t >= settle), None)
    growth = round(rss[-1] - settled, 1) if settled is not None else None
    return {
        "streams": streams,
        "seconds": seconds,
        "direct": {k: direct[k] for k in ("requests", "errors", "p50_ms", "p99_ms")},
        "brim": {k: through[k] for k in ("requests", "errors", "error_kinds", "p50_ms", "p99_ms")},
        "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 2),
        "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 2),
        "p99_ratio": round(through["p99_ms"] / direct["p99_ms"], 2) if direct["p99_ms"] else None,
        "rss_mb": {
            "first": rss[0] if rss else None,
            f"at_{settle:g}s": settled,
            "last": rss[-1] if rss else None,
            "max": max(rss) if rss else None,
            "growth_after_settling": growth,
        },
        # Flat: after settling, growth within the larger of 10 MB and 5 % (allocator noise).
        "rss_flat": growth is not None and growth <= max(10.0, 0.05 * (settled or 0)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args(argv)
    if not 1 <= args.streams <= 2_000 or not 1 <= args.seconds <= 600:
        parser.error("streams must be 1-2000 and seconds 1-600 (this is a bounded loopback test)")
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    report = soak(args.streams, args.seconds)
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0 if report["brim"]["errors"] == 0 and report["rss_flat"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
