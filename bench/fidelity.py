"""`python -m bench.fidelity`: how much of a conversation survives being made to fit.

python -m bench.fidelity                   # the full run (a few minutes on 2 cores)
python -m bench.fidelity --quick           # the shortest session of each family, few turns
                                           # (the test's run)
python -m bench.fidelity --sessions DIR    # the sessions of DIR (`bench.corpus`), same measures

Families of sessions, each reported apart:

- generated (`bench.sessions`): long agent sessions written by the bench (file reads, JSON API
  results, build logs, test output, chatter, user corrections, follow-up steps acting on what an
  earlier result said, and planted facts — among them look-alike facts, each one line of a
  listing whose every line looks like it);
- the session files of `--sessions DIR` (default: the committed `bench/corpus/`, made by
  `python -m bench.capture`): real-text (an exploring agent on real checkouts, every tool result
  a real command's output at generation time) and real-cli (the real Claude Code and Codex CLIs
  making that agent's steps with their own tools; the requests they sent, in their own wire
  format), with facts planted as copies of the checkout's own lines; or any folder of sessions,
  a held-out set included, under the families its files name.

Measures, each per family, on all four wire APIs (a session file is sent as it is on its own
API and through the neutral form, `bench.corpus.neutral`, on the other three):

- Facts: each session cut whole to budgets 1.3×, 2.5×, 5× and 10× smaller than it is; facts
  kept (older ones, those in the last 8 messages, look-alike ones), and recoverable — kept, or
  in the stored original of a key the request names while it offers `brim_restore` (one restore
  round; facts only a later round reaches are listed apart, `further`). A cut whose system
  prompt and tools alone are over the budget is left out (n/a: nothing can be sent), and one
  whose newest turn cannot fit with them is left out of "newest kept".
- Next-action evidence (`bench.evidence`): sessions replayed as they grew (the request before
  each assistant turn, all through one brim as a client would send them): the generated
  family's growing sessions at 8K, 32K and 128K windows, each session file at the smallest of
  `REPLAY_WINDOWS` its fixed part leaves room in, to its end. At each request over the budget,
  which ids, numbers and paths the next assistant turn uses from earlier tool results the
  request kept (or could restore), per reduction band of that request (tokens in ÷ budget);
  a request the provider would refuse (invalid, over the budget) keeps none.
- Budget used: tokens sent ÷ budget of each compressed request, per band; and the requests whose
  cut went into text (a result cut to a digest or its relevant lines, or a message truncated)
  that used less than 80 % of it.
- Growing sessions: prefix kept between consecutive compressed requests (what a provider's prompt
  cache needs), beside the most any method can keep (`prefix_ceiling`); and the billed input per
  compressed turn with prompt caching (`billed`: cache reads at 0.1×, writes at 1.25× the input
  price), beside the ceiling method's.

Methods:

- brim, as deployed: the real `ResolveLimits` and `Guard` stages (default policies, low water
  0.85, pair repair on, session memory, `brim_restore` offered), in process; the window is chosen
  so that the guard's own budget is the target;
- brim + summarize (generated family only: its summarizer is a local stub that keeps the first
  words and every line's FACT sentence, within its max_tokens — a look-alike listing's decoys as
  well as its fact; on real text it would only keep first words);
- baselines taking Chat Completions messages (so Chat only): LiteLLM's `trim_messages`,
  LangChain's `trim_messages` (strategy "last", include_system, start_on "human", end_on
  human/tool, counted with brim's counter), keep-last-N (the system prompt and the newest
  messages that fit) and middle-out (messages dropped from the middle until it fits, as
  OpenRouter's transform does); they get the budget minus the tool definitions' tokens.
  LiteLLM runs on the generated family only (and on 6 turns of its growing session past 32K):
  it recounts every kept message for each one it adds, which takes minutes per long session
  (15 of the 24 minutes a full run took with it on the session files too), and its requests
  there are invalid or over the budget anyway (it drops a tool call's result from its call, and
  gives up on `content: null`);
- oldest-first, on all four APIs: whole turns (a user message, or an assistant turn with the
  results that answer it) dropped oldest first until the request fits; the system prompt and
  the newest turn stay, and the first user message (the task) goes only once everything between
  it and the newest turn has (`oldest_first`).

Validity is checked by the test suite's own provider rules (tests/fakes.py,
tests/fake_anthropic.py), written apart from brim's dialects; token counts are brim's own. The
report opens with one PASS/MISS line per target of the compression work
(`bench.fidelity_report`), then each family's tables; the JSON (`--out`) has every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import importlib
import logging
import math
import os
import platform
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from bench import corpus, sessions
from bench.evidence import Evidence, found, plain, plain_original
from bench.evidence import judge as judge_evidence
from bench.sessions import MODELS, RENDER, STATEMENT_PATTERN, Session
from brim.adapters.adapter import UpstreamResponse
from brim.adapters.credentials import Caller
from brim.adapters.errors import ContextTooLarge, NothingLeftToSend
from brim.adapters.exchange import ANONYMOUS, Exchange
from brim.middleware.services.sessions import SessionMemory
from brim.middleware.services.store import ContentStore
from brim.middleware.services.summarize import MemoryCache, Summarizer
from brim.middleware.settings import GuardConfig, RestoreConfig
from brim.middleware.stages.guard import Guard
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.middleware.stages.restore import RESTORE_TOOL
from brim.policies.budget import DEFAULT_SAFETY_MARGIN, budget_for, requested_output
from brim.policies.compress import DEFAULT_ORDER, Outcome, build_policies
from brim.policies.conversation import FidelityRecord
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.tokens import REPLY_PRIMING, CounterMeter, TokenCounter
from brim.policies.wires import WIRES
from brim.policies.wires.chat import CHAT
from brim.proxy.app import build_store
from brim.proxy.config import BrimConfig
from brim.proxy.resources import use_bundled_tiktoken_files

FACTORS = (1.3, 2.5, 5.0, 10.0)
WINDOWS = (8_192, 32_768, 131_072)
# Windows a session file may be replayed at: the smallest one its fixed part (system prompt,
# tools, newest turn) leaves room in (`replay_window`).
REPLAY_WINDOWS = (8_192, 16_384, 24_576, 32_768, 65_536, 131_072)
BANDS = ("≤ 2.5×", "2.5–5×", "5–10×", "> 10×")
APIS = tuple(MODELS)
MAX_OUTPUT = 4_096
GUARD = GuardConfig()  # brim's defaults, as deployed
LOW_WATER = GUARD.low_water
RECENT = 8  # "the last 8 messages" (of the Chat rendering, system prompt not counted)
SUMMARIZER_MODEL = "bench-summarizer"
LITELLM_TURNS_PAST_32K = 6
RESTORE_ROUNDS = RestoreConfig().max_rounds
# A key as brim's stand-ins name it (placeholders, shortened results, notices, summaries).
KEY_PATTERN = re.compile(r"sha256:([0-9a-f]{16,64})")
CACHE_READ = 0.1  # of the input price: a prompt-cache hit (Anthropic's and OpenAI's published)
CACHE_WRITE = 1.25  # of the input price: what a request writes to the cache beyond its hit
TEXT_CUT_FLOOR = 0.8  # a cut into text should use at least this share of the budget
GENERATED = "generated"
CORPUS = Path(__file__).parent / "corpus"

# The per-request columns of a row, and the Case field each is the share of.
REQUEST_SHARES = {
    "valid": "valid",
    "within_budget": "within",
    "system_kept": "system_kept",
    "newest_kept": "newest_kept",
    "restore_offered": "restore_offered",
}

BRIM = "brim"
BRIM_SUMMARIZE = "brim + summarize"
LITELLM = "LiteLLM trim_messages"
LANGCHAIN = "LangChain trim_messages"
KEEP_LAST = "keep-last-N"
MIDDLE_OUT = "middle-out"
OLDEST_FIRST = "oldest-first"
METHODS = (BRIM, BRIM_SUMMARIZE, LITELLM, LANGCHAIN, KEEP_LAST, MIDDLE_OUT, OLDEST_FIRST)
CHAT_ONLY = (LITELLM, LANGCHAIN, KEEP_LAST, MIDDLE_OUT)  # they take Chat Completions messages
BASELINES = (*CHAT_ONLY, OLDEST_FIRST)
BRIMS = (BRIM, BRIM_SUMMARIZE)
# Not a method: the most prefix any method can keep on a growing session (`prefix_ceiling`).
CEILING = "ceiling (newest turn whole, all else cut)"
GROWTH_ROWS = (*METHODS, CEILING)

Messages = list[dict[str, Any]]
Checker = Callable[[list[dict[str, Any]]], list[str]]


def band_of(reduction: float) -> str:
    """The reduction band a request falls in (`tokens in ÷ budget`)."""
    if reduction <= 2.5 + 1e-9:
        return BANDS[0]
    if reduction <= 5 + 1e-9:
        return BANDS[1]
    return BANDS[2] if reduction <= 10 + 1e-9 else BANDS[3]


def methods_for(family: str, api: str) -> tuple[str, ...]:
    """The methods measured on a family's sessions in one API. brim + summarize and LiteLLM
    run on the generated family only (see the module's docstring)."""
    own = BRIMS if family == GENERATED else (BRIM,)
    chat = CHAT_ONLY if family == GENERATED else CHAT_ONLY[1:]
    return (*own, *(chat if api == "openai.chat" else ()), OLDEST_FIRST)


def checkers() -> dict[str, Checker]:
    """The providers' validity rules as the test suite writes them, apart from brim's dialects.
    (Imported by name: they live in tests/, which is not type-checked with bench/.)"""
    fakes = importlib.import_module("tests.fakes")
    anthropic = importlib.import_module("tests.fake_anthropic")
    return {
        "openai.chat": fakes.pairing_errors,
        "anthropic.messages": anthropic.anthropic_errors,
        "openai.responses": fakes.responses_errors,
        "gemini.generate": fakes.gemini_errors,
    }


# ---------------------------------------------------------------- brim, as deployed


class StubSummarizerModel:
    """A local, deterministic stand-in for the summarizer model: the first words of what it is
    given, then every FACT sentence in it (a look-alike listing's decoys too: it cannot tell them
    from the planted fact), stopped at `max_tokens` as a model would be."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.calls = 0

    async def __call__(
        self,
        provider: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        caller: Caller,
    ) -> str:
        self.calls += 1
        text = messages[-1]["content"]
        lines = ["Earlier: " + " ".join(text.split()[:30])[:200]]
        lines += [f"- {fact}." for fact in dict.fromkeys(STATEMENT_PATTERN.findall(text))]
        kept: list[str] = []
        used = 0
        for line in lines:
            size = self.counter.text(line + "\n", "o200k_base")
            if used + size > max_tokens:
                break
            kept.append(line)
            used += size
        return "\n".join(kept)


@dataclass
class Forwarded:
    body: dict[str, Any] | None  # None: refused
    budget: int
    summarizer_calls: int = 0
    refusal: str = ""
    outcome: Outcome | None = None  # what the guard did (None: it let the request through)

    @property
    def cut_into_text(self) -> bool:
        """Whether a cut went into text: a tool result cut to its relevant lines or a digest
        (prune's lossy steps), or a message truncated — not a placeholder or an eviction."""
        records = self.outcome.records if self.outcome is not None else ()
        return any(cut_text(record) for record in records)


def cut_text(record: FidelityRecord) -> bool:
    return record.action == "truncated" or (
        record.action == "pruned" and record.archive_key is not None
    )


class Brim:
    """ResolveLimits → Guard → a capturing upstream, for one wire API and one window; kept
    across the turns of a growing session, as a running brim would be."""

    def __init__(
        self, counter: TokenCounter, api: str, window: int, summarize: bool = False
    ) -> None:
        self.counter = counter
        self.api = api
        self.model = MODELS[api]
        registry = LimitsRegistry(
            {self.model: ModelFacts(context_window=window, max_output=MAX_OUTPUT)}
        )
        self.limits = ResolveLimits(
            registry, counter, safety_margin=DEFAULT_SAFETY_MARGIN, clients={}
        )
        self.stub: StubSummarizerModel | None = None
        summarizer = None
        if summarize:
            self.stub = StubSummarizerModel(counter)
            summarizer = Summarizer(
                self.stub,
                [SUMMARIZER_MODEL],
                CounterMeter(counter, "o200k_base", "", CHAT),
                LimitsRegistry({SUMMARIZER_MODEL: ModelFacts(context_window=128_000)}),
                MemoryCache(24),
                retry_delay_s=0,
            )
        self.guard = Guard(
            counter,
            build_policies(DEFAULT_ORDER, {}),
            low_water=LOW_WATER,
            repair_pairs=True,
            summarizer=summarizer,
            sessions=SessionMemory(int(GUARD.session_memory_mb * 2**20))
            if GUARD.carry_forward
            else None,
            room_for_turns=GUARD.room_for_turns,
            store=build_store(BrimConfig()),  # brim_restore offered as deployed
        )

    def exchange(self, body: dict[str, Any]) -> Exchange:
        endpoints = {
            "openai.chat": "/chat/completions",
            "anthropic.messages": "/messages",
            "openai.responses": "/responses",
            "gemini.generate": f"/models/{self.model}:generateContent",
        }
        return Exchange(
            api=self.api,
            method="POST",
            endpoint=endpoints[self.api],
            query="",
            model=self.model,
            body=body,
            raw=orjson.dumps(body),
            headers=CIMultiDictProxy(CIMultiDict()),
            stream=False,
            upstream="bench",
            request_id="fidelity",
        )

    async def send(self, body: dict[str, Any]) -> Forwarded:
        seen: dict[str, Any] = {}

        async def upstream(exchange: Exchange) -> UpstreamResponse:
            seen["body"] = exchange.body
            seen["outcome"] = exchange.context.outcome if exchange.context else None
            return UpstreamResponse(status=200, headers={}, body=b"{}")

        async def guarded(exchange: Exchange) -> UpstreamResponse:
            assert exchange.context is not None
            seen["budget"] = exchange.context.budget.effective
            return await self.guard(exchange, upstream)

        calls = self.stub.calls if self.stub else 0
        refusal = ""
        try:
            await self.limits(self.exchange(body), guarded)
        except (ContextTooLarge, NothingLeftToSend) as exc:
            refusal = str(exc)
        return Forwarded(
            seen.get("body"),
            int(seen["budget"]),
            (self.stub.calls if self.stub else 0) - calls,
            refusal,
            seen.get("outcome"),
        )


def tokenizer_of(api: str) -> str:
    return LimitsRegistry().resolve(MODELS[api]).limits.tokenizer


def window_for(api: str, body: Mapping[str, Any], budget: int) -> int:
    """The context window whose guard budget (as `ResolveLimits` works it out) is `budget`."""
    window = math.ceil(budget / (1 - DEFAULT_SAFETY_MARGIN))
    while window_budget(api, body, window) > budget:
        window -= 1
    while window_budget(api, body, window) < budget:
        window += 1
    return window


def window_budget(api: str, body: Mapping[str, Any], window: int) -> int:
    """The guard's budget for a request of `api` to a model with this window."""
    model = MODELS[api]
    registry = LimitsRegistry({model: ModelFacts(context_window=window, max_output=MAX_OUTPUT)})
    return budget_for(
        registry.resolve(model), requested_output(body), safety_margin=DEFAULT_SAFETY_MARGIN
    ).effective


# ---------------------------------------------------------------- the baselines (Chat only)


class ChatCount:
    """Messages counted as brim counts a Chat request: per message, plus reply priming."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def one(self, message: Mapping[str, Any]) -> int:
        return self.counter.message(message, "o200k_base", MODELS["openai.chat"], CHAT)

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self.one(m) for m in messages) + REPLY_PRIMING


def litellm_trim(messages: Messages, limit: int, count: ChatCount) -> Messages:
    from litellm.utils import trim_messages

    # It logs a traceback when it gives up (see `baseline`): quiet here, counted there.
    logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
    trimmed = trim_messages(messages, model="gpt-4o", max_tokens=limit)
    return trimmed if isinstance(trimmed, list) else list(trimmed)


def langchain_trim(messages: Messages, limit: int, count: ChatCount) -> Messages:
    from langchain_core.messages import (
        BaseMessage,
        convert_to_messages,
        convert_to_openai_messages,
        trim_messages,
    )

    converted = convert_to_messages(messages)
    originals = {id(m): original for m, original in zip(converted, messages, strict=True)}

    def as_dicts(items: Sequence[BaseMessage]) -> Messages:
        out: Messages = []
        for item in items:
            original = originals.get(id(item))
            out.append(original if original is not None else convert_to_openai_messages(item))
        return out

    def counter(items: list[BaseMessage]) -> int:
        return count(as_dicts(items))

    trimmed = trim_messages(
        converted,
        max_tokens=limit,
        token_counter=counter,
        strategy="last",
        include_system=True,
        start_on="human",
        end_on=("human", "tool"),
        allow_partial=False,
    )
    return as_dicts(trimmed)


def keep_last(messages: Messages, limit: int, count: ChatCount) -> Messages:
    system = [m for m in messages[:1] if m.get("role") == "system"]
    total = count(system)
    kept: Messages = []
    for message in reversed(messages[len(system) :]):
        size = count.one(message)
        if total + size > limit:
            break
        kept.append(message)
        total += size
    return system + kept[::-1]


def middle_out(messages: Messages, limit: int, count: ChatCount) -> Messages:
    system = [m for m in messages[:1] if m.get("role") == "system"]
    rest = list(messages[len(system) :])
    total = count(system + rest)
    while rest and total > limit:
        total -= count.one(rest.pop(len(rest) // 2))
    return system + rest


BASELINE_RUN: dict[str, Callable[[Messages, int, ChatCount], Messages]] = {
    LITELLM: litellm_trim,
    LANGCHAIN: langchain_trim,
    KEEP_LAST: keep_last,
    MIDDLE_OUT: middle_out,
}


def baseline(
    method: str, body: dict[str, Any], budget: int, counter: TokenCounter
) -> tuple[dict[str, Any], str]:
    """`body` (Chat) with its messages cut by a baseline to the budget less the tools' cost,
    and a note when the baseline gave up: LiteLLM's `trim_messages` catches its own exceptions
    and returns the very list it was given."""
    tools_cost = (
        counter.request(
            CHAT, {"messages": [], "tools": body.get("tools") or []}, "o200k_base"
        ).total
        - REPLY_PRIMING
    )
    given = list(body["messages"])
    messages = BASELINE_RUN[method](given, budget - tools_cost, ChatCount(counter))
    note = (
        "untrimmed" if messages is given and count_over(given, budget - tools_cost, counter) else ""
    )
    return {**body, "messages": messages}, note


def count_over(messages: Messages, limit: int, counter: TokenCounter) -> bool:
    return ChatCount(counter)(messages) > limit


def oldest_first(
    api: str, body: dict[str, Any], budget: int, counter: TokenCounter
) -> dict[str, Any]:
    """`body` with whole turns dropped, oldest first, until it fits `budget`: a turn is a user
    message or an assistant turn with the results that answer it (the wire's units, so calls
    and results go together). The system prompt and the newest turn stay; so does the first
    user message (the task) until everything between it and the newest turn is gone — an agent
    session has one user message and then tool turns, and a conversation starts with a user
    turn (Anthropic's rule). If the task must go too, so does any assistant turn that would
    then come first. What is left may still be over the budget when nothing more can go."""
    wire, tokenizer, model = WIRES[api], tokenizer_of(api), MODELS[api]
    items = wire.conversation(body)
    units = wire.dialect.units(items)
    rest = [n for n, unit in enumerate(units[:-1]) if unit.kind != "system"]
    task = next((n for n in rest if units[n].kind == "user"), None)
    # The order they go in: the turns after the task, oldest first, then the task, then any
    # turn that would come before it.
    order = [n for n in rest if task is not None and n > task]
    order += [task] if task is not None else []
    order += [n for n in rest if task is None or n < task]
    sizes = {
        n: sum(counter.message(items[i], tokenizer, model, wire) for i in units[n].indices)
        for n in rest
    }
    dropped: set[int] = set()

    def request() -> dict[str, Any]:
        kept = [i for n, unit in enumerate(units) if n not in dropped for i in unit.indices]
        return wire.with_conversation(body, [items[i] for i in kept])

    def first_is_user() -> None:
        for n in rest:
            if n in dropped:
                continue
            if units[n].kind == "user":
                return
            dropped.add(n)

    total = counter.request(wire, body, tokenizer, model).total
    for n in order:
        if total <= budget:
            break
        dropped.add(n)
        total -= sizes[n]
        if total <= budget:  # an estimate (per-item counts): checked whole
            first_is_user()
            total = counter.request(wire, request(), tokenizer, model).total
    first_is_user()
    return request()


# ---------------------------------------------------------------- the sessions measured


@dataclass(frozen=True)
class Facts:
    older: tuple[str, ...]
    recent: tuple[str, ...]
    lookalike: tuple[str, ...] = ()

    def all(self) -> tuple[str, ...]:
        return (*self.older, *self.recent, *self.lookalike)


def fact_id(fact: str) -> str:
    """How a fact is named in the results: a generated fact by its id ("FACT-0042"), a planted
    needle by itself."""
    return fact.split()[0]


def facts_of(session: Session) -> Facts:
    """A generated session's facts: the look-alike ones (`Session.lookalikes`) apart, the
    others split by where they are — any copy in the last 8 messages of the Chat rendering makes
    a fact recent."""
    return split_facts(session, session.facts(), session.is_lookalike)


def split_facts(
    session: Session, facts: Sequence[str], lookalike: Callable[[str], bool] = lambda f: False
) -> Facts:
    messages = sessions.chat_body(session)["messages"][1:]
    recent_text = plain(messages[-RECENT:])
    older: list[str] = []
    recent: list[str] = []
    lookalikes: list[str] = []
    for fact in facts:
        if lookalike(fact):
            lookalikes.append(fact)
        else:
            (recent if found(fact, recent_text) else older).append(fact)
    return Facts(tuple(older), tuple(recent), tuple(lookalikes))


@dataclass
class Subject:
    """One session under measure: its neutral form, and for a session file, the body as it
    came in its own API (`native`), which that API is sent instead of the rendering."""

    name: str
    family: str
    session: Session
    facts: Facts
    native: str | None = None
    body: dict[str, Any] | None = None
    starts: tuple[int, ...] = ()  # where each neutral turn starts among the body's items
    seed: int = 0

    def request(self, api: str, turns: int | None = None) -> dict[str, Any]:
        """The request a client sends with the first `turns` turns (all: None)."""
        if api == self.native and self.body is not None:
            wire = WIRES[api]
            items = wire.conversation(self.body)
            if turns is None or turns >= len(self.session.turns):
                return self.body
            return wire.with_conversation(self.body, items[: self.starts[turns]])
        return RENDER[api](self.session, turns)

    def points(self) -> list[int]:
        """Where a client sends a request: before each assistant turn (after the first turn),
        and at the end; as turn counts."""
        turns = self.session.turns
        before = [n for n, turn in enumerate(turns) if turn.role == "assistant" and n > 0]
        return sorted({*before, len(turns)})

    @functools.cached_property
    def evidence(self) -> Evidence:
        return Evidence(self.session)

    @functools.cached_property
    def places(self) -> dict[str, str]:
        """Where each fact was planted: the tool whose result first holds it, else "user
        message" (generated sessions: `sessions.fact_places`' kinds)."""
        if self.family == GENERATED:
            return {fact_id(f): kind for f, kind in sessions.fact_places(self.session).items()}
        places: dict[str, str] = {}
        for fact in self.facts.all():
            for turn in self.session.turns:
                texts = [(call.name, call.result) for call in turn.calls]
                texts.append(
                    ("user message" if turn.role == "user" else "assistant", turn.text or "")
                )
                where = next((name for name, text in texts if found(fact, text)), None)
                if where is not None:
                    places[fact] = where
                    break
        return places


def generated_subject(seed: int, tokens: int) -> Subject:
    session = sessions.generate(seed, tokens)
    return Subject(f"generated-{seed}", GENERATED, session, facts_of(session), seed=seed)


def file_subject(made: corpus.SessionFile) -> Subject:
    parsed = corpus.neutral(made.api, made.body)
    facts = split_facts(parsed.session, made.facts)
    return Subject(
        made.name, made.family, parsed.session, facts, made.api, made.body, parsed.starts
    )


def least_tokens(api: str, body: dict[str, Any], counter: TokenCounter, newest: bool = True) -> int:
    """The least a method that keeps the system prompt (and with `newest`, the newest turn)
    can send."""
    least = least_request(api, body, newest)
    return counter.request(WIRES[api], least, tokenizer_of(api), MODELS[api]).total


def least_request(api: str, body: dict[str, Any], newest: bool = True) -> dict[str, Any]:
    """`body` cut to its system prompt, its tools and (with `newest`) its newest turn (its last
    unit) alone."""
    wire = WIRES[api]
    items = wire.conversation(body)
    units = wire.dialect.units(items)
    kept = [i for unit in units if unit.kind == "system" for i in unit.indices]
    kept += list(units[-1].indices) if newest else []
    return wire.with_conversation(body, [items[i] for i in sorted(set(kept))])


def system_kept(api: str, original: dict[str, Any], sent: dict[str, Any]) -> bool:
    """The system prompt as the client sent it: the API's system field, and the system items
    the conversation starts with (Codex's developer messages, Chat's system message)."""
    if sessions.system_of(api, sent) != sessions.system_of(api, original):
        return False
    wire = WIRES[api]
    before, after = wire.conversation(original), wire.conversation(sent)
    leading = 0
    for unit in wire.dialect.units(before):
        if unit.kind != "system":
            break
        leading = unit.end
    return len(after) >= leading and all(
        orjson.dumps(a) == orjson.dumps(b) for a, b in zip(before[:leading], after, strict=False)
    )


# ---------------------------------------------------------------- measuring one cut


@dataclass
class Case:
    method: str
    api: str
    factor: float
    seed: int
    budget: int
    tokens_in: int
    tokens_out: int | None
    refused: bool
    valid: bool
    within: bool
    system_kept: bool
    newest_kept: bool
    facts_older: int
    facts_older_kept: int
    facts_recent: int
    facts_recent_kept: int
    facts_lookalike: int
    facts_lookalike_kept: int
    # Kept, or in the original of a key the request names while it offers brim_restore.
    facts_older_recoverable: int
    facts_recent_recoverable: int
    facts_lookalike_recoverable: int
    restore_offered: bool  # brim_restore is among the request's tools
    keys_named: int  # distinct sha256:<hex> keys in the request
    keys_stored: int  # ...whose original the store holds (counted only where restore is offered)
    summarizer_calls: int
    seconds: float
    errors: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # the facts' ids ("FACT-0042")
    note: str = ""  # "untrimmed": the baseline gave up and returned its input
    recovered: list[str] = field(default_factory=list)  # lost, but recoverable: the facts' ids
    # Not recoverable, but in an original that a key named by a restored original leads to (a
    # second or later restore round, up to brim's default rounds): not counted, shown apart.
    further: list[str] = field(default_factory=list)
    session: str = ""
    family: str = GENERATED
    band: str = ""
    # The system prompt and tools alone are over the budget: nothing can be sent (left out).
    impossible: bool = False
    # ...and with the newest turn: no method can keep it whole (left out of "newest kept").
    newest_too_big: bool = False
    cut_into_text: bool = False


def named_keys(text: str) -> list[str]:
    """The distinct keys (`sha256:<16+ hex>`) `text` names, in order."""
    return list(dict.fromkeys(KEY_PATTERN.findall(text)))


async def stored_originals(
    store: ContentStore, keys: Sequence[str], rounds: int
) -> list[list[str]]:
    """The originals `store` holds under `keys` (as `brim_restore` looks them up, for the owner
    of the bench's exchanges, `ANONYMOUS`), then those under the keys they name in turn, and so
    on: what each of `rounds` restore rounds can fetch."""
    found_rounds: list[list[str]] = []
    seen = set(keys)
    for _ in range(rounds):
        texts = [text for key in keys if (text := await store.get(ANONYMOUS, key)) is not None]
        if not texts:
            break
        found_rounds.append(texts)
        keys = [key for key in named_keys("\n".join(texts)) if key not in seen]
        seen.update(keys)
    return found_rounds


@dataclass(frozen=True)
class Sent:
    """A request as sent, read once: its text as a model reads it, the keys it names, and
    what one (and every later) restore round could fetch."""

    text: str
    offered: bool
    keys: list[str]
    originals: list[str]
    further: list[str]


def read_sent(api: str, sent: dict[str, Any] | None, store: ContentStore | None) -> Sent:
    if sent is None:
        return Sent("", False, [], [], [])
    wire = WIRES[api]
    text = plain(sent)
    offered = RESTORE_TOOL.name in wire.tool_names(sent)
    keys = named_keys(orjson.dumps(sent).decode())
    rounds = (
        asyncio.run(stored_originals(store, keys, RESTORE_ROUNDS))
        if store is not None and offered and keys
        else []
    )
    originals = [plain_original(t) for t in rounds[0]] if rounds else []
    further = [plain_original(t) for later in rounds[1:] for t in later]
    return Sent(text, offered, keys, originals, further)


def judge(
    method: str,
    api: str,
    factor: float,
    subject: Subject,
    original: dict[str, Any],
    sent: dict[str, Any] | None,
    budget: int,
    counter: TokenCounter,
    check: Checker,
    seconds: float,
    summarizer_calls: int = 0,
    store: ContentStore | None = None,
) -> Case:
    """How `sent` (None: refused) keeps `original`, the whole of `subject` in `api`. `store`:
    the content store of the brim that sent it, through which the keys `sent` names are
    resolved when it offers brim_restore (None for a method that has none: what it keeps is all
    it has)."""
    wire = WIRES[api]
    tokenizer = tokenizer_of(api)
    facts = subject.facts
    tokens_in = counter.request(wire, original, tokenizer, MODELS[api]).total
    # A refused request (`sent` None) is judged as an empty one: nothing kept, nothing valid.
    items = wire.conversation(sent) if sent is not None else []
    errors = (check(items) if items else ["nothing left to send"]) if sent is not None else []
    tokens_out = None if sent is None else counter.request(wire, sent, tokenizer, MODELS[api]).total
    before = wire.conversation(original)
    read = read_sent(api, sent, store)
    # Each fact looked for once: in the request as sent, else in what one restore round fetches.
    kept = {fact for fact in facts.all() if found(fact, read.text)}
    recoverable = kept | {
        fact
        for fact in facts.all()
        if fact not in kept and any(found(fact, text) for text in read.originals)
    }
    return Case(
        method=method,
        api=api,
        factor=factor,
        seed=subject.seed,
        budget=budget,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        refused=sent is None,
        valid=sent is not None and not errors,
        within=tokens_out is not None and tokens_out <= budget,
        system_kept=sent is not None and system_kept(api, original, sent),
        newest_kept=bool(items) and orjson.dumps(items[-1]) == orjson.dumps(before[-1]),
        facts_older=len(facts.older),
        facts_older_kept=sum(fact in kept for fact in facts.older),
        facts_recent=len(facts.recent),
        facts_recent_kept=sum(fact in kept for fact in facts.recent),
        facts_lookalike=len(facts.lookalike),
        facts_lookalike_kept=sum(fact in kept for fact in facts.lookalike),
        facts_older_recoverable=sum(fact in recoverable for fact in facts.older),
        facts_recent_recoverable=sum(fact in recoverable for fact in facts.recent),
        facts_lookalike_recoverable=sum(fact in recoverable for fact in facts.lookalike),
        restore_offered=read.offered,
        keys_named=len(read.keys),
        keys_stored=len(read.originals),
        summarizer_calls=summarizer_calls,
        seconds=round(seconds, 4),
        errors=errors[:3],
        lost=[fact_id(f) for f in facts.all() if f not in kept],
        recovered=[fact_id(f) for f in facts.all() if f in recoverable and f not in kept],
        further=[
            fact_id(f)
            for f in facts.all()
            if f not in recoverable and any(found(f, later) for later in read.further)
        ],
        session=subject.name,
        family=subject.family,
        band=band_of(factor),
    )


def fidelity_cases(
    subject: Subject,
    counter: TokenCounter,
    check: Mapping[str, Checker],
    factors: Sequence[float] = FACTORS,
) -> list[Case]:
    """Every method at every reduction factor, on one session, in every API."""
    cases: list[Case] = []
    for factor in factors:
        for api in APIS:
            body = subject.request(api)
            tokens = counter.request(WIRES[api], body, tokenizer_of(api), MODELS[api]).total
            budget = int(tokens / factor)
            impossible = least_tokens(api, body, counter, newest=False) > budget
            newest_too_big = least_tokens(api, body, counter) > budget
            window = window_for(api, body, budget)
            judged = functools.partial(
                judge,
                api=api,
                factor=factor,
                subject=subject,
                original=body,
                budget=budget,
                counter=counter,
                check=check[api],
            )
            for method in methods_for(subject.family, api):
                started = time.perf_counter()
                if method in BRIMS:
                    brim = Brim(counter, api, window, method == BRIM_SUMMARIZE)
                    forwarded = asyncio.run(brim.send(body))
                    seconds = time.perf_counter() - started
                    assert forwarded.budget == budget, (forwarded.budget, budget)
                    case = judged(
                        method,
                        sent=forwarded.body,
                        seconds=seconds,
                        summarizer_calls=forwarded.summarizer_calls,
                        store=brim.guard.store,  # this cut's own brim: its own store
                    )
                    case.cut_into_text = forwarded.cut_into_text
                elif method == OLDEST_FIRST:
                    sent = oldest_first(api, body, budget, counter)
                    case = judged(method, sent=sent, seconds=time.perf_counter() - started)
                else:
                    sent, note = baseline(method, body, budget, counter)
                    case = judged(method, sent=sent, seconds=time.perf_counter() - started)
                    case.note = note
                case.impossible, case.newest_too_big = impossible, newest_too_big
                cases.append(case)
    return cases


# ---------------------------------------------------------------- growing sessions


@dataclass
class Point:
    """One compressed request of a growing session (`Growth`)."""

    turns: int  # the request carries this many turns
    tokens_in: int
    tokens_out: int | None  # None: refused
    band: str
    valid: bool
    within: bool
    system_kept: bool
    newest_kept: bool
    cut_into_text: bool
    evidence: int  # the next assistant turn's evidence tokens (`bench.evidence`)
    evidence_kept: int
    evidence_recoverable: int
    prefix_kept: bool | None  # the previous compressed request is its prefix (None: first)
    cached: int  # tokens a prompt cache holds from the previous request sent
    billed: float  # input billed, in input-token prices, with prompt caching (`billed`)
    lost: list[str] = field(default_factory=list)  # evidence neither kept nor recoverable
    unkept: list[str] = field(default_factory=list)  # evidence the request did not keep
    newest_too_big: bool = False  # the system prompt, tools and newest turn are over the budget
    # Tokens the client's request grew by since its previous one (the model's reply, the tool
    # results, the user's message): new to the provider, so no prompt cache can hold them.
    grew: int = 0

    @classmethod
    def plain(
        cls,
        turns: int,
        tokens_in: int,
        budget: int,
        tokens_out: int | None,
        sent: bool,
        grew: int = 0,
    ) -> Point:
        """A request with no evidence judged: refused (`sent` False), or the ceiling's, which
        is valid, within budget and keeps the newest turn by its definition."""
        return cls(
            turns=turns,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            band=band_of(tokens_in / budget),
            valid=sent,
            within=sent,
            system_kept=sent,
            newest_kept=sent,
            cut_into_text=False,
            evidence=0,
            evidence_kept=0,
            evidence_recoverable=0,
            prefix_kept=None,
            cached=0,
            billed=0.0,
            grew=grew,
        )


@dataclass
class Growth:
    """One method on one session growing turn by turn past its window's budget."""

    method: str
    api: str
    window: int
    budget: int
    session: str = ""
    family: str = GENERATED
    turns: int = 0  # compressed turns measured
    pairs: int = 0  # consecutive compressed requests compared
    prefix_kept: int = 0  # ...where the earlier one is a byte-identical prefix of the later
    valid: int = 0
    within: int = 0
    newest_kept: int = 0  # requests that end with the client's newest item, byte for byte
    newest_fits: int = 0  # ...of those sent whose newest turn fits the budget (with the system's)
    refused: int = 0
    untrimmed: int = 0  # the baseline gave up and returned its input
    calls_per_turn: list[int] = field(default_factory=list)
    resend_calls: int | None = None
    seconds: float = 0.0
    points: list[Point] = field(default_factory=list)


def is_prefix(api: str, before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the earlier compressed request is, byte for byte, where the later one starts:
    the same fields outside the conversation, and its items as the later one's first items."""
    wire = WIRES[api]
    old, new = wire.conversation(before), wire.conversation(after)
    return shared_items(api, before, after) == len(old) and len(new) >= len(old)


def shared_items(api: str, before: dict[str, Any], after: dict[str, Any]) -> int:
    """How many of the later request's first items are the earlier one's, byte for byte (0 if
    anything outside the conversation differs: tools, system prompt, settings)."""
    wire = WIRES[api]
    rest_old = orjson.dumps(wire.with_conversation(before, []), option=orjson.OPT_SORT_KEYS)
    rest_new = orjson.dumps(wire.with_conversation(after, []), option=orjson.OPT_SORT_KEYS)
    if rest_old != rest_new:
        return -1
    shared = 0
    for a, b in zip(wire.conversation(before), wire.conversation(after), strict=False):
        if orjson.dumps(a) != orjson.dumps(b):
            break
        shared += 1
    return shared


def billed(
    api: str, previous: dict[str, Any] | None, sent: dict[str, Any], counter: TokenCounter
) -> tuple[int, float]:
    """(cached tokens, input billed in input-token prices) of `sent` after `previous` went to
    the same provider: what both start with (the fields outside the conversation and the same
    first items) is read from the prompt cache at `CACHE_READ`; the rest is written to it at
    `CACHE_WRITE` — as if the provider cached every request whole (OpenAI's automatic caching;
    Anthropic's with a cache breakpoint on the last message, as Claude Code sets one)."""
    wire, tokenizer, model = WIRES[api], tokenizer_of(api), MODELS[api]
    total = counter.request(wire, sent, tokenizer, model).total
    shared = -1 if previous is None else shared_items(api, previous, sent)
    if shared < 0:
        return 0, CACHE_WRITE * total
    prefix = wire.with_conversation(sent, wire.conversation(sent)[:shared])
    cached = min(total, counter.request(wire, prefix, tokenizer, model).total - REPLY_PRIMING)
    return cached, CACHE_READ * cached + CACHE_WRITE * (total - cached)


def first_over(
    subject: Subject, api: str, budget: int, counter: TokenCounter, points: Sequence[int]
) -> int:
    """The index (in `points`) of the first request of the session over the budget."""
    wire, tokenizer = WIRES[api], tokenizer_of(api)
    low, high = 0, len(points) - 1
    while low < high:
        middle = (low + high) // 2
        body = subject.request(api, points[middle])
        if counter.request(wire, body, tokenizer, MODELS[api]).total > budget:
            high = middle
        else:
            low = middle + 1
    return low


def send(
    method: str,
    api: str,
    body: dict[str, Any],
    budget: int,
    counter: TokenCounter,
    brim: Brim | None,
    growth: Growth,
) -> tuple[dict[str, Any] | None, bool]:
    """One request through a method: what it sent (None: refused), and whether it cut into
    text."""
    if brim is not None:
        forwarded = asyncio.run(brim.send(body))
        if method == BRIM_SUMMARIZE:
            growth.calls_per_turn.append(forwarded.summarizer_calls)
        return forwarded.body, forwarded.cut_into_text
    if method == OLDEST_FIRST:
        return oldest_first(api, body, budget, counter), False
    sent, note = baseline(method, body, budget, counter)
    growth.untrimmed += note == "untrimmed"
    return sent, False


def grow(
    subject: Subject,
    method: str,
    api: str,
    window: int,
    turns: int | None,
    counter: TokenCounter,
    check: Checker,
) -> Growth:
    """`subject` growing request by request through `method` at `window`, from its first
    request over the budget, for `turns` requests (None: to its end)."""
    wire, tokenizer = WIRES[api], tokenizer_of(api)
    brim = (
        Brim(counter, api, window, summarize=method == BRIM_SUMMARIZE) if method in BRIMS else None
    )
    probe = subject.request(api, 1)
    budget = window_budget(api, probe, window)
    points = subject.points()
    start = first_over(subject, api, budget, counter, points)
    growth = Growth(method, api, window, budget, subject.name, subject.family)
    # The client's last request before it went over the budget: every method sent it as it was.
    previous: dict[str, Any] | None = subject.request(api, points[start - 1]) if start > 0 else None
    client_before = (
        0 if previous is None else counter.request(wire, previous, tokenizer, MODELS[api]).total
    )
    last_sent: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    started = time.perf_counter()
    for point in points[start : None if turns is None else start + turns]:
        body = subject.request(api, point)
        tokens_in = counter.request(wire, body, tokenizer, MODELS[api]).total
        if tokens_in <= budget:
            break  # the session ended before passing the budget: nothing to measure
        grew, client_before = max(0, tokens_in - client_before), tokens_in
        sent, cut = send(method, api, body, budget, counter, brim, growth)
        growth.turns += 1
        last = body
        if sent is None:
            growth.refused += 1
            last_sent = previous = None
            growth.points.append(Point.plain(point, tokens_in, budget, None, False, grew))
            continue
        items = wire.conversation(sent)
        tokens_out = counter.request(wire, sent, tokenizer, MODELS[api]).total
        valid = not check(items)
        within = tokens_out <= budget
        newest = bool(items) and orjson.dumps(items[-1]) == orjson.dumps(
            wire.conversation(body)[-1]
        )
        too_big = least_tokens(api, body, counter) > budget
        growth.valid += valid
        growth.within += within
        growth.newest_fits += not too_big
        growth.newest_kept += newest and not too_big
        prefix: bool | None = None
        if last_sent is not None:
            growth.pairs += 1
            prefix = is_prefix(api, last_sent, sent)
            growth.prefix_kept += prefix
        cached, cost = billed(api, previous, sent, counter)
        evidence = subject.evidence.of(point) if point < len(subject.session.turns) else ()
        read = read_sent(api, sent, brim.guard.store if brim is not None else None)
        # A request the provider would refuse (invalid, over the budget) leads to no next turn.
        accepted = valid and within
        kept = judge_evidence(
            evidence, read.text if accepted else "", read.originals if accepted else []
        )
        growth.points.append(
            Point(
                turns=point,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                band=band_of(tokens_in / budget),
                valid=valid,
                within=within,
                system_kept=system_kept(api, body, sent),
                newest_kept=newest,
                cut_into_text=cut,
                evidence=len(evidence),
                evidence_kept=len(kept.kept),
                evidence_recoverable=len(kept.recoverable),
                prefix_kept=prefix,
                cached=cached,
                billed=round(cost, 1),
                lost=[t for t in evidence if t not in kept.recoverable],
                unkept=[t for t in evidence if t not in kept.kept],
                newest_too_big=too_big,
                grew=grew,
            )
        )
        last_sent = previous = sent
    if method == BRIM_SUMMARIZE and last is not None and brim is not None:
        growth.resend_calls = asyncio.run(brim.send(last)).summarizer_calls
    growth.seconds = round(time.perf_counter() - started, 2)
    return growth


def prefix_ceiling(
    subject: Subject | Session,
    api: str,
    window: int,
    turns: int | None,
    counter: TokenCounter,
) -> Growth:
    """The most prefix any method can keep over the turns `grow` measures, if it keeps the
    newest turn whole (its last unit: the user message, or a tool call with its results) and
    sends valid requests: whenever the next turn does not fit on top of the previous request,
    cut down to the system prompt, the tools and that newest turn alone, no lower bound being
    lower; otherwise send the previous request plus the new items. Cutting to the least leaves
    the most room for the turns after it, so no method keeps the prefix on more turns. Its
    requests are billed as `grow`'s are (`billed`): the ceiling method's cost."""
    if isinstance(subject, Session):
        subject = Subject(f"session-{subject.seed}", GENERATED, subject, Facts((), ()))
    wire, tokenizer = WIRES[api], tokenizer_of(api)
    budget = window_budget(api, subject.request(api, 1), window)
    points = subject.points()
    start = first_over(subject, api, budget, counter, points)
    growth = Growth(CEILING, api, window, budget, subject.name, subject.family)
    previous: dict[str, Any] | None = subject.request(api, points[start - 1]) if start > 0 else None
    sent: dict[str, Any] | None = None  # the ceiling method's request
    before: list[Any] = []  # the client's previous request's items
    for point in points[start : None if turns is None else start + turns]:
        body = subject.request(api, point)
        items = wire.conversation(body)
        total = counter.request(wire, body, tokenizer, MODELS[api]).total
        if total <= budget:
            break
        growth.turns += 1
        growth.newest_kept += 1  # by its definition
        growth.newest_fits += 1
        candidate = None
        if sent is not None:
            growth.pairs += 1
            added = items[len(before) :]
            candidate = wire.with_conversation(sent, [*wire.conversation(sent), *added])
            if counter.request(wire, candidate, tokenizer, MODELS[api]).total > budget:
                candidate = None
            else:
                growth.prefix_kept += 1
        sent = candidate if candidate is not None else least_request(api, body)
        before = items
        cached, cost = billed(api, previous, sent, counter)
        tokens_out = counter.request(wire, sent, tokenizer, MODELS[api]).total
        made = Point.plain(point, total, budget, tokens_out, True)
        made.prefix_kept = candidate is not None if growth.pairs else None
        made.cached, made.billed = cached, round(cost, 1)
        growth.points.append(made)
        previous = sent
    return growth


def growth_runs(
    windows: Sequence[int], turns: int, counter: TokenCounter, check: Mapping[str, Checker]
) -> list[Growth]:
    """The generated family's growing sessions, one per window."""
    runs: list[Growth] = []
    for n, window in enumerate(windows):
        # Long enough to pass the budget and go on for `turns` more requests (~2 000 tokens each).
        session = sessions.generate(500 + n, int(window * 0.95) + turns * 2_500)
        subject = Subject(f"growing-{500 + n}", GENERATED, session, facts_of(session), seed=500 + n)
        for api in APIS:
            for method in (*BRIMS, OLDEST_FIRST):
                runs.append(grow(subject, method, api, window, turns, counter, check[api]))
            runs.append(prefix_ceiling(subject, api, window, turns, counter))
        for method in CHAT_ONLY:
            # LiteLLM recounts every kept message for each one it adds (~8 s a call at 128K).
            count = (
                min(turns, LITELLM_TURNS_PAST_32K)
                if method == LITELLM and window > 32_768
                else turns
            )
            runs.append(
                grow(subject, method, "openai.chat", window, count, counter, check["openai.chat"])
            )
    return runs


def replay_window(subject: Subject, api: str, counter: TokenCounter) -> int | None:
    """The smallest of `REPLAY_WINDOWS` whose budget the session's least request (system
    prompt, tools, last turn) takes at most four fifths of, and that the whole session is more
    than 1.3× over (None: none is)."""
    body = subject.request(api)
    total = counter.request(WIRES[api], body, tokenizer_of(api), MODELS[api]).total
    least = least_tokens(api, body, counter)
    for window in REPLAY_WINDOWS:
        budget = window_budget(api, body, window)
        if budget * 0.8 >= least and total > 1.3 * budget:
            return window
    return None


def replay_runs(
    subjects: Sequence[Subject],
    counter: TokenCounter,
    check: Mapping[str, Checker],
    turns: int | None,
) -> list[Growth]:
    """Each session file replayed as it grew, at its `replay_window` in each API, by every
    method and the ceiling, for `turns` compressed requests (None: to the end)."""
    runs: list[Growth] = []
    for subject in subjects:
        for api in APIS:
            window = replay_window(subject, api, counter)
            if window is None:
                continue
            for method in methods_for(subject.family, api):
                runs.append(grow(subject, method, api, window, turns, counter, check[api]))
            runs.append(prefix_ceiling(subject, api, window, turns, counter))
    return runs


# ---------------------------------------------------------------- the run


def session_files(folders: Sequence[Path], families: set[str] | None) -> list[Subject]:
    subjects = [file_subject(made) for folder in folders for made in corpus.load(folder)]
    return [s for s in subjects if families is None or s.family in families]


def describe(subject: Subject, counter: TokenCounter) -> dict[str, Any]:
    chat = subject.request("openai.chat")
    evidence = [subject.evidence.of(n) for n in range(len(subject.session.turns))]
    return {
        "name": subject.name,
        "family": subject.family,
        "api": subject.native or "generated",
        "seed": subject.seed,
        "tokens": counter.request(CHAT, chat, "o200k_base").total,
        "messages": len(chat["messages"]),
        "facts": len(subject.facts.older) + len(subject.facts.recent),
        "lookalike_facts": len(subject.facts.lookalike),
        "evidence_turns": sum(bool(e) for e in evidence),
        "evidence_tokens": sum(len(e) for e in evidence),
        "places": dict(Counter(subject.places.values())),
    }


def quick_pick(subjects: Sequence[Subject], counter: TokenCounter) -> list[Subject]:
    """For the quick run: the shortest session of each family."""
    shortest: dict[str, Subject] = {}
    for subject in subjects:
        size = counter.request(CHAT, subject.request("openai.chat"), "o200k_base").total
        best = shortest.get(subject.family)
        if (
            best is None
            or size < counter.request(CHAT, best.request("openai.chat"), "o200k_base").total
        ):
            shortest[subject.family] = subject
    return list(shortest.values())


def main(argv: list[str] | None = None) -> int:
    from bench import fidelity_report as report_of

    parser = argparse.ArgumentParser(
        prog="python -m bench.fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a small run (what the test runs)")
    parser.add_argument("--out", default="bench/results/fidelity.json", help="where the JSON goes")
    parser.add_argument(
        "--sessions",
        action="append",
        type=Path,
        help="a folder of session files (bench.corpus); repeatable; default: bench/corpus",
    )
    parser.add_argument(
        "--families",
        help="only these families, comma-separated (e.g. generated,real-cli, or a held-out set's)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch at import
    use_bundled_tiktoken_files()
    counter = TokenCounter()
    counter.warm()
    check = checkers()
    started = time.perf_counter()
    families = set(args.families.split(",")) if args.families else None
    try:
        files = session_files(args.sessions or ([CORPUS] if CORPUS.is_dir() else []), families)
    except corpus.SessionFileError as exc:
        parser.error(str(exc))

    seeds, tokens = ((1,), 24_000) if args.quick else ((1, 2, 3, 4, 5), 60_000)
    windows = WINDOWS[:2] if args.quick else WINDOWS
    turns = 6 if args.quick else 24
    generated = families is None or GENERATED in families
    subjects = [generated_subject(seed, tokens) for seed in seeds] if generated else []
    if args.quick:
        files = quick_pick(files, counter)
    subjects += files
    cases: list[Case] = []
    places: dict[tuple[str, str], str] = {}
    for subject in subjects:
        places |= {(subject.name, fact_id(f)): kind for f, kind in subject.places.items()}
        cases += fidelity_cases(subject, counter, check)
    fidelity_s = time.perf_counter() - started
    runs = growth_runs(windows, turns, counter, check) if generated else []
    runs += replay_runs(files, counter, check, 6 if args.quick else None)
    report: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": args.quick,
        "factors": FACTORS,
        "windows": windows,
        "bands": BANDS,
        "growth_turns": turns,
        "sessions": [describe(subject, counter) for subject in subjects],
        "fidelity": report_of.summarize_cases(cases),
        "facts_by_place": report_of.summarize_places(cases, places),
        "evidence": report_of.summarize_evidence(runs),
        "budget": report_of.summarize_budget(cases, runs),
        "growth": report_of.summarize_growth(runs),
        "cases": [dataclasses.asdict(c) for c in cases],
        "growth_runs": [dataclasses.asdict(g) for g in runs],
        "seconds": {
            "fidelity": round(fidelity_s, 1),
            "total": round(time.perf_counter() - started, 1),
        },
    }
    report["targets"] = [dataclasses.asdict(t) for t in report_of.targets(report)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(report_of.render(report))
    print(f"\nrun in {report['seconds']['total']} s; full results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
