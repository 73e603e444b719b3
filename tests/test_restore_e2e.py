"""Nothing cut is lost, end to end: clients on the official SDKs (Gemini over plain HTTP, as the
Gemini CLI sends it) through a running brim, in front of a scripted provider that uses
`brim_restore` the way a model would — it calls the tool with a key it reads in the cut request,
then answers quoting what it got. The client sees only that answer; brim's span, metrics, audit
line and status record the restore. With `[cache] url` a restore is answered by any instance on
the same Redis, whichever one cut the request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from middleware.restore import RESTORE_TOOL
from policies.conversation import archive_key
from proxy.app import bound_port, start
from proxy.config import BrimConfig
from tests.fakes import LoopThread, start_app
from tests.restoring import (
    KEY_SHOWN,
    MODELS,
    QUOTE,
    Restoring,
    brim_config,
    chat_body,
    gemini_body,
    logs,
    messages_body,
    responses_body,
    restored,
)
from tests.scripted_provider import OUTPUT_TOKENS, tool_uses

ADMIN = "restore-admin-key-0123456789"


def original_of(key: str, texts: list[str]) -> str:
    """The one text of `texts` that `key` (`sha256:<16 hex>`) names."""
    (found,) = [t for t in texts if archive_key(t).startswith(key.removeprefix("sha256:"))]
    return found


@dataclass(frozen=True)
class Api:
    """One wire API as its clients speak it."""

    name: str  # the scripted provider's name of it
    send: Callable[[str, list[str]], Reply]

    @property
    def model(self) -> str:
        return MODELS[self.name]


@dataclass(frozen=True)
class Reply:
    text: str
    calls: list[str]  # names of the tool calls the client got
    usage: tuple[int, int]  # input, output
    headers: httpx.Headers
    dump: str  # the whole reply, for "nothing about brim_restore"


def _chat(base: str, texts: list[str]) -> Reply:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(**chat_body(texts))
    reply = raw.parse()
    message = reply.choices[0].message
    assert reply.usage is not None
    return Reply(
        message.content or "",
        [c.function.name for c in message.tool_calls or [] if c.type == "function"],
        (reply.usage.prompt_tokens, reply.usage.completion_tokens),
        raw.headers,
        reply.model_dump_json(),
    )


def _messages(base: str, texts: list[str]) -> Reply:
    sdk = anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0)
    raw = sdk.messages.with_raw_response.create(**messages_body(texts))
    reply = raw.parse()
    return Reply(
        "".join(b.text for b in reply.content if b.type == "text"),
        [b.name for b in reply.content if b.type == "tool_use"],
        (reply.usage.input_tokens, reply.usage.output_tokens),
        raw.headers,
        reply.model_dump_json(),
    )


def _responses(base: str, texts: list[str]) -> Reply:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
    raw = sdk.responses.with_raw_response.create(**responses_body(texts))
    reply = raw.parse()
    assert reply.usage is not None
    return Reply(
        reply.output_text,
        [item.name for item in reply.output if item.type == "function_call"],
        (reply.usage.input_tokens, reply.usage.output_tokens),
        raw.headers,
        reply.model_dump_json(),
    )


def _gemini(base: str, texts: list[str]) -> Reply:
    raw = httpx.post(
        f"{base}/v1beta/models/{MODELS['gemini']}:generateContent",
        json=gemini_body(texts),
        headers={"x-goog-api-key": "AIza-client"},
        timeout=60,
    )
    assert raw.status_code == 200, raw.text
    reply = raw.json()
    parts = reply["candidates"][0]["content"]["parts"]
    usage = reply["usageMetadata"]
    return Reply(
        "".join(p.get("text", "") for p in parts),
        [p["functionCall"]["name"] for p in parts if "functionCall" in p],
        (usage["promptTokenCount"], usage["candidatesTokenCount"]),
        raw.headers,
        raw.text,
    )


APIS = [
    Api("chat", _chat),
    Api("messages", _messages),
    Api("responses", _responses),
    Api("gemini", _gemini),
]
each_api = pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])


def config(url: str, tmp_path: Path, **sections: Any) -> BrimConfig:
    """brim in front of the scripted provider on all four APIs, restore on, audited."""
    return brim_config(
        url,
        server={"admin_keys_env": "RESTORE_ADMIN_KEYS"},
        audit={"path": str(tmp_path / "audit.jsonl")},
        **sections,
    )


@pytest.fixture
def serve(loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Starts a scripted provider's app, or a brim (a config, and span processors), on loopback;
    returns its base URL."""
    monkeypatch.setenv("RESTORE_ADMIN_KEYS", ADMIN)
    runners: list[Any] = []

    def make(what: Restoring | BrimConfig, processors: Any = ()) -> str:
        if isinstance(what, Restoring):
            runner, url = loop_thread.run(start_app(what.app()))
            runners.append(runner)
            what.url = url
            return str(url)
        runner = loop_thread.run(start(what, "127.0.0.1", 0, span_processors=processors))
        runners.append(runner)
        return f"http://127.0.0.1:{bound_port(runner)}"

    yield make
    for runner in reversed(runners):
        loop_thread.run(runner.cleanup())


def root_span(spans: InMemorySpanExporter) -> ReadableSpan:
    (root,) = [s for s in spans.get_finished_spans() if "brim.outcome" in (s.attributes or {})]
    return root


def counters(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every counter at /metrics: family → its own labels (not the scope's) → value."""
    text = httpx.get(f"{base}/metrics").text
    return {
        family.name: {
            tuple(sorted((k, v) for k, v in s.labels.items() if not k.startswith("otel_"))): s.value
            for s in family.samples
            if s.name.endswith("_total")
        }
        for family in text_string_to_metric_families(text)
    }


@each_api
def test_a_restore_is_answered_hidden_and_recorded(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    fake = Restoring()
    spans = InMemorySpanExporter()
    base = serve(config(serve(fake), tmp_path), [SimpleSpanProcessor(spans)])
    texts = logs("build")

    reply = api.send(base, texts)

    # Upstream: the cut request offered brim_restore and named keys; the model asked for the
    # first; the second round carries the original as that call's result, validly paired.
    assert [c.reply for c in fake.calls] == ["read 1", "final"], fake.rejections
    first, second = fake.calls
    assert RESTORE_TOOL.name in orjson.dumps(first.body).decode()
    (asked,) = tool_uses(api.name, second.body, RESTORE_TOOL.name)
    key = str(asked.arguments["key"])
    original = original_of(key, texts)
    assert original not in orjson.dumps(first.body).decode()  # it was cut...
    assert restored(api.name, second.body) == [original]  # ...and came back whole
    # The client: only the final answer, quoting it; no trace of the hidden round.
    assert reply.text == QUOTE + original
    assert reply.calls == []
    assert RESTORE_TOOL.name not in reply.dump and key not in reply.dump
    assert reply.usage == (first.tokens + second.tokens, 2 * OUTPUT_TOKENS)
    assert reply.headers["x-brim-restored"] == "1"
    assert reply.headers["x-brim-actions"] != "none"

    # The span: offered, one restore event naming the key; usage summed there too.
    root = root_span(spans)
    attributes = dict(root.attributes or {})
    assert attributes["brim.restore_offered"] is True
    assert attributes["gen_ai.usage.input_tokens"] == first.tokens + second.tokens
    events = [dict(e.attributes or {}) for e in root.events if e.name == "brim.restore"]
    assert events == [{"brim.restore.key": key, "brim.restore.found": True}]
    # Metrics, labelled like the others.
    metrics = counters(base)
    assert metrics["brim_restores"] == {(("found", "true"), ("model", api.model)): 1}
    assert metrics["brim_restores_offered"] == {(("model", api.model),): 1}
    # The audit line names the key, never the content.
    (line,) = (tmp_path / "audit.jsonl").read_text().splitlines()
    audit = json.loads(line)
    assert audit["restored"] == [key] and audit["restore_missing"] == []
    assert "compiled module" not in line
    # The status board.
    status = httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN}).json()
    assert (status["totals"]["restore_offered"], status["totals"]["restored"]) == (1, 1)
    assert status["models"][api.model]["restored"] == 1
    assert status["recent_events"][-1]["restored"] == [key]


@each_api
def test_a_request_that_fits_is_not_offered_restore_and_records_none(
    api: Api, serve: Callable[..., str], tmp_path: Path
) -> None:
    fake = Restoring()
    spans = InMemorySpanExporter()
    base = serve(config(serve(fake), tmp_path), [SimpleSpanProcessor(spans)])

    reply = api.send(base, logs("build", turns=2))

    assert [c.reply for c in fake.calls] == ["text"]  # not offered: nothing to call
    assert reply.text == "ok" and "x-brim-restored" not in reply.headers
    root = root_span(spans)
    assert dict(root.attributes or {})["brim.restore_offered"] is False
    assert [e for e in root.events if e.name == "brim.restore"] == []
    metrics = counters(base)
    assert "brim_restores" not in metrics and "brim_restores_offered" not in metrics


# --- two instances, one Redis ------------------------------------------------------------------


@each_api
def test_a_restore_arriving_at_another_instance_is_answered_from_redis(
    api: Api, serve: Callable[..., str], tmp_path: Path, redis_url: str
) -> None:
    fake = Restoring(reads=0)  # the model answers A without asking for anything
    url = serve(fake)
    shared = {"cache": {"url": redis_url}}
    first = serve(config(url, tmp_path / "a", **shared))
    second = serve(config(url, tmp_path / "b", **shared))
    alone = serve(config(url, tmp_path / "c"))  # its own store only

    texts = logs("first")
    assert api.send(first, texts).text == "ok"
    key = KEY_SHOWN.findall(orjson.dumps(fake.calls[-1].body).decode())[0]
    original = original_of(key, texts)

    # The model's call of A's key comes back in a request that B cut (other content).
    fake.key, fake.reads = key, fake.steps + 1
    others = logs("second")
    reply = api.send(second, others)
    assert [c.reply for c in fake.calls[-2:]] == ["read 1", "final"]
    cut_by_b = orjson.dumps(fake.calls[-2].body).decode()
    assert original not in cut_by_b and key not in cut_by_b  # B never had it
    assert reply.text == QUOTE + original
    assert reply.headers["x-brim-restored"] == "1"

    # An instance without the shared store cannot know it.
    fake.reads = fake.steps + 1
    lost = api.send(alone, logs("third"))
    assert "no longer available" in lost.text and key in lost.text
    assert "x-brim-restored" not in lost.headers
