"""What operators see: spans, /metrics, the audit log, the archive, status — and never a key."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import tool_turn
from tests.conftest import BrimFactory, fake_upstream
from tests.fakes import FakeProvider

HELLO = [{"role": "user", "content": "ping"}]
CANARY = "sk-canary-LEAK-4242-do-not-log"
ADMIN = "admin-key-123456789"


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traced(
    brim: BrimFactory,
    spans: InMemorySpanExporter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: FakeProvider,
) -> str:
    monkeypatch.setenv("TEST_ADMIN_KEYS", ADMIN)
    return brim(
        span_processors=[SimpleSpanProcessor(spans)],
        server={"admin_keys_env": "TEST_ADMIN_KEYS"},
        models={
            "fake-model": {"context_window": 100_000, "max_output": 1_000},
            "small": {"context_window": 3_000, "max_output": 500},
            "tight-3000": {"context_window": 100_000},
        },
        audit={"path": str(tmp_path / "audit" / "brim.jsonl")},
        archive={"enabled": True, "dir": str(tmp_path / "archive")},
        guard={"warn_at": 0.5},
    )


def by_name(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in spans.get_finished_spans() if s.name == name]
    assert found, [s.name for s in spans.get_finished_spans()]
    return found[-1]


def big_session() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
    ]
    for n in range(8):
        messages += tool_turn(
            f"c{n}", "\n".join(f"line {i}: value value value" for i in range(80)), name="bash"
        )
    messages.append({"role": "user", "content": "so?"})
    return messages


def test_a_fitting_request_gets_a_genai_span_with_stage_and_upstream_children(
    traced: str, spans: InMemorySpanExporter, provider: FakeProvider
) -> None:
    parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    reply = httpx.post(
        f"{traced}/v1/chat/completions",
        json={"model": "fake-model", "messages": HELLO, "max_tokens": 50},
        headers={"traceparent": f"00-{parent_trace}-00f067aa0ba902b7-01"},
    )
    assert reply.status_code == 200
    root = by_name(spans, "chat fake-model")
    attributes = dict(root.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.system"] == "openai"
    assert attributes["gen_ai.request.model"] == "fake-model"
    assert attributes["gen_ai.request.max_tokens"] == 50
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        17,
        5,
    )
    assert (
        attributes["brim.tokens.in"]
        == attributes["brim.tokens.out"]
        == int(reply.headers["x-brim-tokens-in"])
    )
    assert attributes["brim.budget"] == int(reply.headers["x-brim-budget"])
    assert attributes["brim.context_window"] == 100_000
    assert attributes["brim.actions"] == "none" and attributes["brim.outcome"] == "ok"
    assert root.events == ()
    assert format(root.context.trace_id, "032x") == parent_trace  # the caller's trace continues
    upstream = by_name(spans, "upstream fake")
    assert upstream.parent is not None
    names = {s.name for s in spans.get_finished_spans()}
    assert {"brim ResolveLimits", "brim Guard", "brim RetryOnOverflow", "brim Forward"} <= names
    sent = provider.last.headers["traceparent"]
    assert sent.split("-")[1] == parent_trace
    assert sent.split("-")[2] == format(upstream.context.span_id, "016x")
    assert (
        float(reply.headers["x-brim-context-usage"]) < 0.5
        and "x-brim-context-warning" not in reply.headers
    )


def test_a_compressed_request_records_what_each_policy_did(
    traced: str, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    reply = httpx.post(
        f"{traced}/v1/chat/completions", json={"model": "small", "messages": big_session()}
    )
    assert reply.status_code == 200
    root = by_name(spans, "chat small")
    events = {event.name: dict(event.attributes or {}) for event in root.events}
    assert events["brim.overflow.predicted"]["brim.budget"] == int(reply.headers["x-brim-budget"])
    compressed = [dict(e.attributes or {}) for e in root.events if e.name == "brim.compressed"]
    assert {c["brim.policy"] for c in compressed} >= {"clear_tool_results"}
    assert all(c["brim.tokens.after"] < c["brim.tokens.before"] for c in compressed)
    assert dict(root.attributes or {})["brim.outcome"] == "compressed"
    assert "x-brim-context-warning" in reply.headers  # above warn_at = 0.5 of the window

    (line,) = (tmp_path / "audit" / "brim.jsonl").read_text().splitlines()
    audit = json.loads(line)
    assert audit["outcome"] == "compressed" and audit["model"] == "small"
    assert audit["trace_id"] == format(root.context.trace_id, "032x")
    assert audit["tokens_in"] > audit["tokens_out"] == int(reply.headers["x-brim-tokens-out"])
    assert audit["archive_keys"] and "line 0: value" not in line  # keys, never content

    key = audit["archive_keys"][0]
    folder = tmp_path / "archive"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / key[:2] / key).stat().st_mode) == 0o600
    original = httpx.get(f"{traced}/admin/archive/{key}", headers={"x-brim-admin-key": ADMIN})
    assert original.status_code == 200 and original.text.startswith("line 0: value value value")
    assert httpx.get(f"{traced}/admin/archive/{key}").status_code == 401
    assert (
        httpx.get(
            f"{traced}/admin/archive/{key}", headers={"Authorization": "Bearer wrong"}
        ).status_code
        == 401
    )

    status = httpx.get(
        f"{traced}/admin/status", headers={"Authorization": f"Bearer {ADMIN}"}
    ).json()
    assert status["totals"]["compressed"] == 1 and status["models"]["small"]["requests"] == 1
    assert status["recent_events"][-1]["request_id"] == audit["request_id"]


def test_a_retried_request_records_the_providers_overflow(
    traced: str, spans: InMemorySpanExporter
) -> None:
    messages = [{"role": "user", "content": "explain " + "this log line\n" * 1500}]
    reply = httpx.post(
        f"{traced}/v1/chat/completions", json={"model": "tight-3000", "messages": messages}
    )
    assert reply.status_code == 200 and reply.headers["x-brim-retries"] == "1"
    root = by_name(spans, "chat tight-3000")
    names = [event.name for event in root.events]
    assert names.count("brim.retry") == 1
    upstream_event = next(e for e in root.events if e.name == "brim.overflow.upstream")
    assert "maximum context length is 3000 tokens" in str(
        dict(upstream_event.attributes or {})["brim.provider_message"]
    )
    assert dict(root.attributes or {})["brim.outcome"] == "retried"
    assert len([s for s in spans.get_finished_spans() if s.name == "upstream fake"]) == 2


def test_a_stream_is_traced_to_its_end_with_the_providers_usage(
    traced: str, spans: InMemorySpanExporter
) -> None:
    sdk = openai.OpenAI(base_url=f"{traced}/v1", api_key="k", max_retries=0)
    chunks = list(
        sdk.chat.completions.create(
            model="fake-model", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )  # type: ignore[call-overload]
    assert chunks
    attributes = dict(by_name(spans, "chat fake-model").attributes or {})
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        17,
        5,
    )


def scrape(base: str) -> dict[str, list[Any]]:
    reply = httpx.get(f"{base}/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(reply.text)}


def test_metrics_are_served_for_prometheus(traced: str) -> None:
    httpx.post(f"{traced}/v1/chat/completions", json={"model": "fake-model", "messages": HELLO})
    httpx.post(f"{traced}/v1/chat/completions", json={"model": "small", "messages": big_session()})
    httpx.post(
        f"{traced}/v1/chat/completions",
        json={"model": "tight-3000", "messages": [{"role": "user", "content": "x " * 5000}]},
    )
    families = scrape(traced)
    requests = {
        (s.labels["model"], s.labels["outcome"]): s.value
        for s in families["brim_requests"]
        if s.name.endswith("_total")
    }
    assert requests == {
        ("fake-model", "ok"): 1,
        ("small", "compressed"): 1,
        ("tight-3000", "retried"): 1,
    }
    assert [s.value for s in families["brim_overflows_prevented"] if s.name.endswith("_total")] == [
        1
    ]
    assert [s.value for s in families["brim_overflows_survived"] if s.name.endswith("_total")] == [
        1
    ]
    removed = {
        s.labels["policy"]: s.value
        for s in families["brim_tokens_removed"]
        if s.name.endswith("_total")
    }
    assert removed.get("clear_tool_results", 0) > 0
    added = [s for s in families["brim_latency_added_milliseconds"] if s.name.endswith("_count")]
    assert sum(s.value for s in added) == 3
    learned = {s.labels["model"]: s.value for s in families["brim_limits_learned"]}
    assert learned == {"tight-3000": 3000}


def test_admin_endpoints_are_off_without_admin_keys(brim: BrimFactory) -> None:
    base = brim()
    reply = httpx.get(f"{base}/admin/status")
    assert reply.status_code == 403 and reply.json()["error"]["code"] == "admin_disabled"


def test_the_archive_expires_and_skips_corrupt_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from middleware.archive import ContentArchive
    from policies.conversation import archive_key

    archive = ContentArchive(tmp_path / "a", ttl_hours=1)
    old, fresh, bad = "old content", "fresh content", "will be corrupted"
    for text in (old, fresh, bad):
        archive.put(archive_key(text), text)
    path = tmp_path / "a" / archive_key(old)[:2] / archive_key(old)
    os.utime(path, (time.time() - 7200, time.time() - 7200))
    assert archive.cleanup() == 1
    assert archive.get(archive_key(old)) is None and archive.get(archive_key(fresh)) == fresh
    corrupt = tmp_path / "a" / archive_key(bad)[:2] / archive_key(bad)
    corrupt.write_text("tampered")
    with caplog.at_level(logging.WARNING, logger="brim.archive"):
        assert archive.get(archive_key(bad)) is None
    assert "corrupt" in caplog.text and not corrupt.exists()


def test_brim_archive_get_prints_the_original(tmp_path: Path) -> None:
    from middleware.archive import ContentArchive
    from policies.conversation import archive_key

    ContentArchive(tmp_path / "arch", ttl_hours=1).put(archive_key("the original"), "the original")
    (tmp_path / "proxy.toml").write_text(
        f'[archive]\nenabled = true\ndir = "{tmp_path / "arch"}"\n'
    )
    brim_cmd = str(Path(sys.executable).with_name("brim"))
    found = subprocess.run(
        [brim_cmd, "archive", "get", archive_key("the original")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert found.returncode == 0 and found.stdout == "the original"
    missing = subprocess.run(
        [brim_cmd, "archive", "get", "0" * 64],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert missing.returncode == 1 and "nothing is archived" in missing.stderr.lower()


def test_no_key_appears_in_logs_spans_metrics_or_the_audit_log(
    brim: BrimFactory,
    provider: FakeProvider,
    spans: InMemorySpanExporter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("CANARY_UPSTREAM_KEY", CANARY + "-upstream")
    audit = tmp_path / "audit.jsonl"
    base = brim(
        span_processors=[SimpleSpanProcessor(spans)],
        upstreams={
            "fake": fake_upstream(provider),
            "keyed": fake_upstream(provider, api_key_env="CANARY_UPSTREAM_KEY"),
        },
        routes={"tight-*": "keyed", "*": "fake"},
        models={"small": {"context_window": 3_000}, "tight-3000": {"context_window": 100_000}},
        audit={"path": str(audit)},
    )
    headers = {
        "Authorization": f"Bearer {CANARY}",
        "x-api-key": CANARY,
        "api-key": CANARY,
        "x-goog-api-key": CANARY,
        "x-brim-api-key": CANARY,
        "User-Agent": "canary-client/1.0",
    }
    replies: list[str] = []
    with caplog.at_level(logging.DEBUG):
        for model, messages in (
            ("small", big_session()),
            ("tight-3000", [{"role": "user", "content": "y " * 5000}]),
            ("fake-model", HELLO),
            ("error-429", HELLO),
            ("fake-model", "not a list"),
        ):
            reply = httpx.post(
                f"{base}/v1/chat/completions?key={CANARY}",
                json={"model": model, "messages": messages},
                headers=headers,
            )
            replies.append(reply.text + str(dict(reply.headers)))
        replies.append(
            httpx.post(
                f"{base}/v1beta/models/gem-x:generateContent?key={CANARY}",
                json={"contents": []},
                headers=headers,
            ).text
        )
        replies.append(
            httpx.post(f"{base}/v1/messages?key={CANARY}", content=b"{broken", headers=headers).text
        )
        # An over-long credential header: brim's own limit answers, naming only the header.
        padded = {"Authorization": f"Bearer {CANARY}" + "x" * 10_000}
        over = httpx.post(
            f"{base}/v1/chat/completions", json={"model": "fake-model"}, headers=padded
        )
        assert over.status_code == 431
        replies.append(over.text)
        # Past aiohttp's own parser limit its plain 400 quotes the line back to the sender (not
        # in `replies`: see README, Reliability); its log line must not.
        absurd = {"Authorization": f"Bearer {CANARY}" + "x" * 2_000_000}
        assert httpx.post(f"{base}/v1/chat/completions", headers=absurd).status_code == 400
        metrics_text = httpx.get(f"{base}/metrics").text
    assert (
        provider.requests[-1].headers["authorization"] == f"Bearer {CANARY}"
    )  # it did go upstream
    places = {
        # Everything brim's process logs, less the test's own HTTP client (httpx logs its URLs).
        "logs": "\n".join(
            f"{logging.Formatter().format(r)} {r.args}"  # with any traceback and exception text
            for r in caplog.records
            if not r.name.startswith(("httpx", "httpcore"))
        ),
        "spans": orjson.dumps(
            [
                {
                    "a": dict(s.attributes or {}),
                    "e": [dict(e.attributes or {}) for e in s.events],
                    "n": s.name,
                }
                for s in spans.get_finished_spans()
            ]
        ).decode(),
        "metrics": metrics_text,
        "audit": audit.read_text(),
        "replies": "\n".join(replies),
    }
    assert places["audit"] and places["spans"] != "[]"
    for where, text in places.items():
        assert "canary-LEAK" not in text, where
