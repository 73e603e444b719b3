"""`brim status`: fetch a running brim's `GET /admin/status` and print the figures the `/ui`
dashboard shows, as plain-text tables. (`admin_call` also serves `brim limits` and
`brim reload`.)"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

ADMIN_KEY_ENV = "BRIM_ADMIN_KEY"
OVERFLOW_KINDS = ("prevented", "survived", "refused", "blocked")
SPARKS = "▁▂▃▄▅▆▇█"
EVENTS_SHOWN = 10
TIMELINE_SHOWN = 15


def open_direct(request: urllib.request.Request | str, timeout_s: float) -> Any:
    """Open a URL of brim's straight, never through the user's HTTP proxy (`HTTP_PROXY` would
    send a request for 127.0.0.1 to the proxy)."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        request, timeout=timeout_s
    )


class StatusError(Exception):
    """brim could not be asked, or refused (the message says why)."""


def admin_call(
    url: str, admin_key: str, path: str, *, method: str = "GET", timeout_s: float = 10.0
) -> dict[str, Any]:
    """`{method} {url}{path}` with the admin key in the `x-brim-admin-key` header: the JSON
    object brim answers, or `StatusError` saying why there is none."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}{path}", headers={"x-brim-admin-key": admin_key}, method=method
    )
    try:
        with open_direct(request, timeout_s) as reply:
            value = json.loads(reply.read())
    except urllib.error.HTTPError as error:
        try:
            message = json.loads(error.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = error.reason
        raise StatusError(f"{url} answered {error.code}: {message}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise StatusError(f"cannot reach brim at {url}: {reason}") from None
    except ValueError:
        raise StatusError(f"{url}{path} did not answer JSON") from None
    if not isinstance(value, dict):
        raise StatusError(f"{url}{path} did not answer a JSON object")
    return value


def fetch_status(url: str, admin_key: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """`GET {url}/admin/status` with the admin key in the `x-brim-admin-key` header."""
    return admin_call(url, admin_key, "/admin/status", timeout_s=timeout_s)


def _clients(ratio: dict[str, Any]) -> str:
    """How many clients taught a token ratio, and how many of them settled theirs."""
    clients, settled = ratio.get("clients", 0), ratio.get("settled", 0)
    return f"{clients:,} ({settled:,} settled)" if settled < clients else f"{clients:,}"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{round(seconds / 86400)} d"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, empty: str) -> list[str]:
    """Left-aligned columns (numbers right-aligned), two spaces apart, indented by two."""
    cells = [[str(c) for c in row] for row in rows]
    if not cells:
        return [f"  ({empty})"]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        return "  " + "  ".join(parts).rstrip()

    return [line(list(headers)), *(line(row) for row in cells)]


def _is_number(text: str) -> bool:
    return text.replace(",", "").replace("%", "").replace(".", "").isdigit()


def _spark(values: Sequence[float]) -> str:
    top = max(values, default=0) or 1
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1)))] for v in values)


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M")


def render_status(status: dict[str, Any], url: str) -> str:
    """The dashboard's figures: totals, usage per model and client, the overflow timeline,
    tokens removed per policy, learned limits and token ratios, the loop guard and the recent
    events."""
    totals = status.get("totals") or {}
    removed = status.get("tokens_removed") or {}
    instances = status.get("instances")
    shared = f" · {len(instances)} instance(s)" if instances else ""
    out = [
        f"brim at {url} — up {duration(status.get('uptime_s') or 0)}{shared}",
        "",
        f"requests {totals.get('requests', 0):,} · overflows prevented "
        f"{totals.get('prevented', 0):,} · survived {totals.get('survived', 0):,} · refused "
        f"{totals.get('refused', 0):,} · loop guard 429s {totals.get('blocked', 0):,} · "
        f"tokens removed {sum(removed.values()):,}",
    ]
    series = status.get("series") or {}
    fields: list[str] = series.get("fields") or []
    bucket_s = series.get("bucket_s") or 60
    usage_rows: list[tuple[object, ...]] = []
    buckets: dict[float, dict[str, int]] = {}
    for entry in series.get("series") or []:
        points = [dict(zip(fields, p, strict=False)) for p in entry.get("points") or []]
        if not points:
            continue
        last = points[-1]
        usage_rows.append(
            (
                entry.get("model"),
                entry.get("client"),
                f"{sum(p['requests'] for p in points):,}",
                f"{last['usage_max']:.0%}",
                f"{last['demand_max']:.0%}",
                f"{sum(p['usage_sum'] for p in points) / sum(p['requests'] for p in points):.0%}",
                _spark([p["usage_max"] for p in points[-30:]]),
            )
        )
        for point in points:
            counts = buckets.setdefault(point["t"], dict.fromkeys(OVERFLOW_KINDS, 0))
            for kind in OVERFLOW_KINDS:
                counts[kind] += point.get(kind, 0)
    out += [
        "",
        f"Context usage per model and client (of the window; peaks per {duration(bucket_s)})",
        *table(
            ("model", "client", "requests", "last peak sent", "received", "mean", "trend"),
            usage_rows,
            empty="no requests yet",
        ),
        "",
        f"Overflow timeline (per {duration(bucket_s)})",
        *table(
            ("time", *OVERFLOW_KINDS),
            [
                (_clock(t), *(counts[k] for k in OVERFLOW_KINDS))
                for t, counts in sorted(buckets.items())
                if any(counts.values())
            ][-TIMELINE_SHOWN:],
            empty="no overflows",
        ),
        "",
        "Tokens removed per policy",
        *table(
            ("policy", "tokens"),
            [(p, f"{n:,}") for p, n in sorted(removed.items(), key=lambda item: -item[1])],
            empty="nothing removed yet",
        ),
        "",
        "Learned limits",
        *table(
            ("model", "fact", "expires in"),
            [
                (
                    fact.get("model"),
                    f"window {fact.get('value', 0):,}"
                    if fact.get("kind") == "window"
                    else "output counts against the window",
                    duration(fact.get("expires_in_s") or 0),
                )
                for fact in status.get("learned") or []
            ],
            empty="nothing learned from providers yet",
        ),
        "",
        "Token ratios (the provider's input tokens per token of brim's count; shared: the median"
        " of the clients that settled their own)",
        *table(
            ("model", "upstream", "shared", "clients", "replies", "updated"),
            [
                (
                    ratio.get("model"),
                    ratio.get("upstream"),
                    "learning" if ratio.get("ratio") is None else f"× {ratio['ratio']:.3f}",
                    _clients(ratio),
                    f"{ratio.get('replies', 0):,}",
                    f"{duration(ratio.get('updated_s_ago') or 0)} ago",
                )
                for ratio in status.get("token_ratios") or []
            ],
            empty="no usage reported yet",
        ),
        "",
    ]
    guard = status.get("loop_guard") or {}
    if guard.get("limit"):
        out.append(
            f"Loop guard: {guard['limit']} identical failures within "
            f"{duration(guard.get('window_s') or 0)}; {totals.get('blocked', 0):,} refused"
        )
    else:
        out.append("Loop guard: off")
    out += table(
        ("request", "failures", "lifts in"),
        [
            (b.get("request"), b.get("failures"), duration(b.get("lifts_in_s") or 0))
            for b in guard.get("blocked") or []
        ],
        empty="no request blocked now",
    )
    events = (status.get("recent_events") or [])[-EVENTS_SHOWN:]
    out += [
        "",
        f"Recent events (latest {EVENTS_SHOWN})",
        *table(
            ("time", "model", "client", "outcome", "in → out / budget", "actions", "archive"),
            [_event_row(event) for event in reversed(events)],
            empty="no overflow events yet",
        ),
    ]
    return "\n".join(out)


def _event_row(event: dict[str, Any]) -> tuple[str, ...]:
    when = str(event.get("time", ""))
    with contextlib.suppress(ValueError):
        when = datetime.fromisoformat(when).astimezone().strftime("%H:%M:%S")
    budget = event.get("budget")
    keys = event.get("archive_keys") or []
    archive = " ".join(f"sha256:{key[:12]}" for key in keys[:2])
    if len(keys) > 2:
        archive += f" +{len(keys) - 2}"
    return (
        when,
        str(event.get("model")),
        str(event.get("client") or "-")[:30],
        str(event.get("outcome")),
        f"{event.get('tokens_in') or 0:,} → {event.get('tokens_out') or 0:,} / "
        + ("-" if budget is None else f"{budget:,}"),
        str(event.get("actions")),
        archive,
    )


def local_url(host: str, port: int) -> str:
    """Where a brim serving on `host:port` is reached from this machine."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
