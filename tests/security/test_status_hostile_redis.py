"""`/admin/status` never fails on what another writer left in Redis.

Each instance sums the other instances' last status records (`brim:status:instance:<id>`, listed
in `brim:status:instances`) and the shared overflow events (`brim:status:events`). Anyone who can
write to the Redis can leave records brim never wrote: each such record is left out and counted
(`brim_shared_records_rejected_total{record="status" | "event", reason="malformed"}`), the well-formed ones are still summed,
and the status answers 200 — on every instance.
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
import redis

from tests.conftest import BrimFactory, RedisServer
from tests.fakes import FakeProvider, wait_for

ADMIN = "status-admin-key-0123456789"
ADMIN_ENV = "STATUS_HOSTILE_ADMIN_KEYS"

GOOD = {
    "id": "good",
    "host": "elsewhere",
    "pid": 42,
    "started_at": time.time() - 60,
    "totals": {"requests": 3, "ok": 3},
    "models": {"gpt-4o": {"requests": 3}},
    "tokens_removed": {"evict": 100},
    "series": {"bucket_s": 60, "fields": [], "series": []},
}
MALFORMED = {
    "not-json": b"{nope",
    "a-list": b"[1, 2, 3]",
    "models-a-list": orjson.dumps({**GOOD, "id": "models-a-list", "models": [1, 2]}),
    "usage-a-number": orjson.dumps({**GOOD, "id": "usage-a-number", "models": {"m": 5}}),
    "points-a-number": orjson.dumps(
        {**GOOD, "series": {"bucket_s": 60, "series": [{"model": "m", "points": 5}]}}
    ),
    "series-a-number": orjson.dumps({**GOOD, "series": {"bucket_s": 60, "series": 7}}),
    "totals-a-string": orjson.dumps({**GOOD, "totals": "many"}),
    "pid-a-string": orjson.dumps({**GOOD, "pid": "forty-two"}),
}


def status(base: str) -> httpx.Response:
    return httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN}, timeout=10)


def skipped(base: str, record: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics", headers={"x-brim-admin-key": ADMIN}).text.splitlines():
        if line.startswith("brim_shared_records_rejected_total{") and all(
            label in line for label in (f'record="{record}"', 'reason="malformed"')
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_malformed_status_records_are_skipped_counted_and_the_status_still_answers(
    brim: BrimFactory,
    provider: FakeProvider,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    sections = {
        "cache": {"url": redis_server.url, "refresh_s": 0.05, "retry_s": 0.2, "timeout_s": 1},
        "server": {"admin_keys_env": ADMIN_ENV},
    }
    a, b = brim(**sections), brim(**sections)
    client = redis.Redis.from_url(redis_server.url)
    now = time.time() + 3600  # listed as live for as long as the test runs
    records = {"good": orjson.dumps(GOOD), **MALFORMED}
    for instance, record in records.items():
        client.set(f"brim:status:instance:{instance}", record, ex=3600)
    client.zadd("brim:status:instances", {**dict.fromkeys(records, now), b"\xff\xfe": now})
    client.lpush(
        "brim:status:events",
        b"not json",
        orjson.dumps({"time": 5, "outcome": "compressed"}),
        orjson.dumps(["a", "list"]),
        orjson.dumps({"time": "2025-01-01T00:00:00.000+00:00", "outcome": "compressed"}),
    )
    for base in (a, b):
        httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
        )
    for base in (a, b):  # every instance answers
        reply = status(base)
        assert reply.status_code == 200, reply.text
        board = reply.json()
        assert wait_for(lambda base=base: status(base).json()["totals"]["requests"] == 3 + 2)
        ids = {instance["id"] for instance in status(base).json()["instances"]}
        assert "good" in ids and not ids & set(MALFORMED)
        assert board["models"]["gpt-4o"]["requests"] == 3
        events = board["recent_events"]
        assert [e["time"] for e in events if e.get("outcome") == "compressed"] == [
            "2025-01-01T00:00:00.000+00:00"
        ]
        # Each status request skips each malformed record (and the id that is not UTF-8).
        assert skipped(base, "status") >= len(MALFORMED) + 1
        assert skipped(base, "event") >= 3
    client.close()
