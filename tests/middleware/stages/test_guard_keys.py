"""Every stand-in the guard sends names a key the content store answers with what it stands for:
evict's notice (the removed messages), truncate's marker (the whole text), each summary of
evicted messages (its batch's messages) and a tool result's summary (the whole result). Driven
through the guard stage itself, which puts each record's original into the store
(`keep_originals`) before the request goes on. On every wire API."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.credentials import Caller
from brim.adapters.exchange import ANONYMOUS, Exchange
from brim.middleware.services.store import MemoryStore
from brim.middleware.services.summarize import MemoryCache, Summarizer
from brim.middleware.stages.guard import Guard
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.policies.compress import Outcome
from brim.policies.conversation import Policy
from brim.policies.evict import GISTS_HEADER, Evict
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.truncate import Truncate
from brim.policies.wires import WIRES
from brim.policies.wires.base import NOTICE_PREFIX
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files
from tests.builders import exchange
from tests.policies.test_evict import LEADING
from tests.policies.test_information import BUILDERS, Builder

use_bundled_tiktoken_files()
COUNTER = TokenCounter()
MODEL = "m-keys"
KEY = re.compile(r"sha256:[0-9a-f]{16}")
NOTICE_KEY = re.compile(r"; restorable as (sha256:[0-9a-f]{16})\](?:\n|\Z)")
MARKER_KEY = re.compile(
    r"tokens cut from the middle by brim; the whole is (sha256:[0-9a-f]{16}) …\]"
)
SUMMARY_KEY = re.compile(
    r"\A\[brim: a summary of earlier messages, removed to fit the context window; "
    r"the originals are (sha256:[0-9a-f]{16})\]\n"
)
RESULT_KEY = re.compile(
    r"\A\[brim: a summary of this tool result, too large for the context window; "
    r"the whole is (sha256:[0-9a-f]{16})\]\n"
)
Items = list[dict[str, Any]]
# A request's body around its conversation, as each wire API has it (Gemini's model is in the URL).
BODIES: dict[str, dict[str, Any]] = {
    "openai.chat": {"model": MODEL, "max_tokens": 512},
    "anthropic.messages": {"model": MODEL, "max_tokens": 512},
    "openai.responses": {"model": MODEL, "max_output_tokens": 512},
    "gemini.generate": {"generationConfig": {"maxOutputTokens": 512}},
}


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> Builder:
    return BUILDERS[request.param]


def test_every_wire_has_a_body() -> None:
    assert set(BODIES) == set(WIRES)


class Shortening:
    """A summary model: the first words of what it is given, as many as the room allows."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(
        self, provider: str, messages: list[dict[str, str]], max_tokens: int, _: Caller
    ) -> str:
        self.calls += 1
        return " ".join(messages[1]["content"].split()[: max_tokens // 3])


def summarizer() -> tuple[Summarizer, Shortening]:
    model = Shortening()
    meter = CounterMeter(COUNTER, "o200k_base", "", CHAT)
    registry = LimitsRegistry({"cheap": ModelFacts(context_window=100_000, max_output=4_000)})
    made = Summarizer(model, ["cheap"], meter, registry, MemoryCache(1), max_retries=0)
    return made, model


def guard(policies: list[Policy], made: Summarizer | None = None) -> tuple[Guard, MemoryStore]:
    store = MemoryStore(1 << 24, 3600)
    stage = Guard(
        COUNTER, policies, low_water=0.85, repair_pairs=True, summarizer=made, store=store
    )
    return stage, store


async def send(
    stage: Guard, wire: Builder, messages: Items, window: int = 8_192
) -> tuple[Items, Outcome]:
    """The items the guard sent on for a request of `wire`'s API, and its outcome."""
    limits = ResolveLimits(
        LimitsRegistry({MODEL: ModelFacts(context_window=window, max_output=512)}),
        COUNTER,
        safety_margin=0.05,
        clients={},
    )
    sent: list[Exchange] = []

    async def upstream(ex: Exchange) -> UpstreamResponse:
        sent.append(ex)
        return UpstreamResponse(status=200, headers={}, body=b"{}")

    async def guarded(ex: Exchange) -> UpstreamResponse:
        return await stage(ex, upstream)

    api = WIRES[wire.api]
    body = api.with_conversation(BODIES[wire.api], messages)
    await limits(exchange(wire.api, MODEL, body), guarded)
    (out,) = sent
    assert out.body is not None and out.context is not None and out.context.outcome is not None
    return list(api.conversation(out.body)), out.context.outcome


def session(wire: Builder, turns: int, lines: int = 150, notes: bool = False) -> Items:
    """Tool turns of templated logs (`notes`: each with one line of its own in the middle)."""
    messages = [*LEADING.get(wire.api, []), wire.user("Deploy the service.")]
    for turn in range(turns):
        log = [f"log {turn}.{i}: deploy step output text" for i in range(lines)]
        if notes:
            log.insert(lines // 2, f"NOTE the canary of step {turn} was pinned by operations")
        messages += wire.turn(f"c{turn}", "read_file", {"step": turn}, "\n".join(log))
    messages.append(wire.user("What failed?"))
    return messages


def job(wire: Builder) -> tuple[Items, str]:
    """A question and one tool result too large for the window: the log it is."""
    log = "\n".join(f"worker {i}: processed batch without errors" for i in range(2_000))
    return [wire.user("Why did the job fail?"), *wire.turn("c0", "read_file", {}, log)], log


def contents(wire: Builder, messages: Items) -> list[str]:
    dialect = WIRES[wire.api].dialect
    return [dialect.text(m) for m in messages]


def result(wire: Builder, messages: Items) -> str:
    """The text of the last tool result, as the model will read it."""
    dialect = WIRES[wire.api].dialect
    (last,) = dialect.tool_results(messages[-1], dialect.tools_by_call(messages))
    return last.text


def test_the_notice_names_a_key_the_store_answers_with_every_message_it_removed(
    wire: Builder,
) -> None:
    stage, store = guard([Evict()])
    messages = session(wire, 10)
    sent, _ = asyncio.run(send(stage, wire, messages))
    (notice,) = [text for text in contents(wire, sent) if text.startswith(NOTICE_PREFIX)]
    shown = NOTICE_KEY.search(notice)
    assert shown is not None, notice
    original = asyncio.run(store.get(ANONYMOUS, shown[1]))
    assert original is not None
    # What a model gets back: the removed messages, as the client sent them, in order.
    assert orjson.loads(original) == [m for m in messages if m not in sent]
    again, _ = asyncio.run(send(guard([Evict()])[0], wire, orjson.loads(orjson.dumps(messages))))
    assert again == sent  # the same history: the same notice, byte for byte


@pytest.mark.parametrize("api", sorted(WIRES))
def test_the_marker_names_a_key_the_store_answers_with_the_whole_text(api: str) -> None:
    wire = BUILDERS[api]
    stage, store = guard([Truncate()])
    messages, log = job(wire)
    sent, outcome = asyncio.run(send(stage, wire, messages))
    assert outcome.tokens_out <= outcome.limit
    (shown,) = MARKER_KEY.findall(result(wire, sent))
    assert asyncio.run(store.get(ANONYMOUS, shown)) == log


def test_each_summary_names_a_key_the_store_answers_with_the_batch_it_condenses(
    wire: Builder,
) -> None:
    made, model = summarizer()
    stage, store = guard([Evict()], made)
    messages = session(wire, 14, lines=120)
    sent, outcome = asyncio.run(send(stage, wire, messages))
    texts = contents(wire, sent)
    summaries = [text for text in texts if text.startswith("[brim: a summary")]
    assert len(summaries) >= 2 and not any(text.startswith(NOTICE_PREFIX) for text in texts)
    batches: Items = []
    for summary in summaries:
        shown = SUMMARY_KEY.match(summary)
        assert shown is not None, summary[:200]
        assert len(KEY.findall(summary.split("\n", 1)[0])) == 1
        original = asyncio.run(store.get(ANONYMOUS, shown[1]))
        assert original is not None
        batch = orjson.loads(original)
        at = messages.index(batch[0])  # a run of the client's own messages
        assert batch == messages[at : at + len(batch)]
        batches += batch
    assert batches == [m for m in messages if m not in sent]  # every one, each once, in order
    assert not any(r.action == "notice" for r in outcome.records)  # the notice is gone
    # Summaries come from the cache by content; their keys are a function of it: same bytes.
    calls = model.calls
    assert calls >= len(summaries)  # summarized, not sent verbatim
    again, _ = asyncio.run(
        send(guard([Evict()], made)[0], wire, orjson.loads(orjson.dumps(messages)))
    )
    assert again == sent and model.calls == calls


def test_the_notices_quoted_lines_stay_after_the_summaries(wire: Builder) -> None:
    """The summaries take the notice's place; the lines it quoted from the latest removed
    results stay, word for word, at the end of the last summary — within the budget."""
    messages = session(wire, 14, lines=120, notes=True)
    plain, _ = asyncio.run(send(guard([Evict()])[0], wire, messages))
    (notice,) = [text for text in contents(wire, plain) if text.startswith(NOTICE_PREFIX)]
    _, header, lines = notice.partition("\n" + GISTS_HEADER)
    assert header and lines.count("\n> ") >= 2
    made, _ = summarizer()
    sent, outcome = asyncio.run(send(guard([Evict()], made)[0], wire, messages))
    summaries = [text for text in contents(wire, sent) if text.startswith("[brim: a summary")]
    assert len(summaries) >= 2
    assert summaries[-1].endswith(header + lines)
    assert not any(GISTS_HEADER in summary for summary in summaries[:-1])
    assert outcome.tokens_out <= outcome.limit


@pytest.mark.parametrize("api", sorted(WIRES))
def test_a_tool_results_summary_names_the_key_of_the_whole_result(api: str) -> None:
    wire = BUILDERS[api]
    made, _ = summarizer()
    stage, store = guard([Truncate()], made)
    messages, log = job(wire)
    sent, outcome = asyncio.run(send(stage, wire, messages))
    assert outcome.tokens_out <= outcome.limit
    shown = RESULT_KEY.match(result(wire, sent))
    assert shown is not None, result(wire, sent)[:200]
    assert asyncio.run(store.get(ANONYMOUS, shown[1])) == log
