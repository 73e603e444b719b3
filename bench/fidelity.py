"""`python -m bench.fidelity`: how much of a conversation survives being made to fit.

python -m bench.fidelity            # the full run (~1 min on 2 cores)
python -m bench.fidelity --quick    # one small session, short growing sessions (the test's run)

Long agent sessions (`bench.sessions`: file reads, JSON API results, build logs, test output,
chatter, user corrections, and planted facts — among them look-alike facts, each one line of a
listing whose every line looks like it, which a method keeping rare lines cannot single out) are
cut to budgets 1.3×, 2.5×, 5× and 10× smaller than they are, by:

- brim, as deployed: the real `ResolveLimits` and `Guard` stages (default policies, low water
  0.85, pair repair on), in process, on all four wire APIs; the window is chosen so that the
  guard's own budget is the target;
- brim + summarize: the same with a `Summarizer` whose model is a local stub (it keeps the first
  words and every line's FACT sentence, within its max_tokens — a look-alike listing's decoys as
  well as its fact: a summarizer cannot know which line the bench tracks) and the default memory
  cache;
- baselines, which take Chat Completions messages (so they run on the Chat rendering only):
  LiteLLM's `trim_messages`, LangChain's `trim_messages` (strategy "last", include_system,
  start_on "human", end_on human/tool, counted with brim's counter), keep-last-N (the system
  prompt and the newest messages that fit) and middle-out (messages dropped from the middle until
  it fits, as OpenRouter's transform does). They get the budget minus the tool definitions'
  tokens, since they only see messages.

Facts kept are reported apart for the ordinary facts (older, and in the last 8 messages) and the
look-alike ones (wherever they are). A fact is recoverable if it is kept, or if the request offers
`brim_restore` and names a key (`sha256:<16 hex>`: a placeholder's, a shortened result's, a
notice's or a summary's) whose original, as the content store brim's guard put it in holds it
right after the request, contains the fact: a model could fetch it back with one call. Each cut
has its own brim, so its own store; the baselines name no keys, so theirs is what they kept. Facts
only reachable in a later round (through a key a restored original names) are not counted as
recoverable; each case lists them apart in the JSON (`further`).

Validity is checked by the test suite's own provider rules (tests/fakes.py,
tests/fake_anthropic.py), written apart from brim's dialects; token counts are brim's own.
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

from adapters.base import UpstreamResponse
from adapters.credentials import Caller
from adapters.errors import ContextTooLarge, NothingLeftToSend
from adapters.exchange import ANONYMOUS, Exchange
from bench import sessions
from bench.sessions import API_LABELS, MODELS, RENDER, STATEMENT_PATTERN, Session
from middleware.guard import Guard
from middleware.limits import ResolveLimits
from middleware.restore import RESTORE_TOOL
from middleware.sessions import SessionMemory
from middleware.settings import GuardConfig, RestoreConfig
from middleware.store import ContentStore
from middleware.summarize import MemoryCache, Summarizer
from policies.budget import DEFAULT_SAFETY_MARGIN, budget_for, requested_output
from policies.compress import DEFAULT_ORDER, build_policies
from policies.limits import LimitsRegistry, ModelFacts
from policies.tokens import REPLY_PRIMING, CounterMeter, TokenCounter
from policies.wires import WIRES
from policies.wires.chat import CHAT
from proxy.app import build_store
from proxy.config import BrimConfig
from proxy.resources import use_bundled_tiktoken_files

FACTORS = (1.3, 2.5, 5.0, 10.0)
WINDOWS = (8_192, 32_768, 131_072)
APIS = tuple(MODELS)
MAX_OUTPUT = 4_096
GUARD = GuardConfig()  # brim's defaults, as deployed
LOW_WATER = GUARD.low_water
RECENT = 8  # "the last 8 messages" (of the Chat rendering, system prompt not counted)
SUMMARIZER_MODEL = "bench-summarizer"
LITELLM_TURNS_PAST_32K = 6
# A key as brim's stand-ins name it (placeholders, shortened results, notices, summaries).
KEY_PATTERN = re.compile(r"sha256:([0-9a-f]{16,64})")
RESTORE_ROUNDS = RestoreConfig().max_rounds

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
METHODS = (BRIM, BRIM_SUMMARIZE, LITELLM, LANGCHAIN, KEEP_LAST, MIDDLE_OUT)
# Not a method: the most prefix any method can keep on a growing session (`prefix_ceiling`).
CEILING = "ceiling (newest turn whole, all else cut)"
GROWTH_ROWS = (*METHODS, CEILING)
BASELINES = (LITELLM, LANGCHAIN, KEEP_LAST, MIDDLE_OUT)

Messages = list[dict[str, Any]]
Checker = Callable[[list[dict[str, Any]]], list[str]]


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


@dataclass(frozen=True)
class Facts:
    older: tuple[str, ...]
    recent: tuple[str, ...]
    lookalike: tuple[str, ...] = ()

    def all(self) -> tuple[str, ...]:
        return (*self.older, *self.recent, *self.lookalike)


def facts_of(session: Session) -> Facts:
    """The session's facts: the look-alike ones (`Session.lookalikes`) apart, the others split
    by where they are — any copy in the last 8 messages of the Chat rendering makes a fact
    recent."""
    messages = sessions.chat_body(session)["messages"][1:]
    recent_text = [orjson.dumps(m).decode() for m in messages[-RECENT:]]
    older: list[str] = []
    recent: list[str] = []
    lookalike: list[str] = []
    for fact in session.facts():
        if session.is_lookalike(fact):
            lookalike.append(fact)
        else:
            (recent if any(fact in text for text in recent_text) else older).append(fact)
    return Facts(tuple(older), tuple(recent), tuple(lookalike))


def named_keys(text: str) -> list[str]:
    """The distinct keys (`sha256:<16+ hex>`) `text` names, in order."""
    return list(dict.fromkeys(KEY_PATTERN.findall(text)))


async def stored_originals(
    store: ContentStore, keys: Sequence[str], rounds: int
) -> list[list[str]]:
    """The originals `store` holds under `keys` (as `brim_restore` looks them up, for the owner
    of the bench's exchanges, `ANONYMOUS`), then those under the keys they name in turn, and so
    on: what each of `rounds` restore rounds can fetch."""
    found: list[list[str]] = []
    seen = set(keys)
    for _ in range(rounds):
        texts = [text for key in keys if (text := await store.get(ANONYMOUS, key)) is not None]
        if not texts:
            break
        found.append(texts)
        keys = [key for key in named_keys("\n".join(texts)) if key not in seen]
        seen.update(keys)
    return found


def judge(
    method: str,
    api: str,
    factor: float,
    session: Session,
    original: dict[str, Any],
    sent: dict[str, Any] | None,
    budget: int,
    counter: TokenCounter,
    facts: Facts,
    check: Checker,
    seconds: float,
    summarizer_calls: int = 0,
    store: ContentStore | None = None,
) -> Case:
    """How `sent` (None: refused) keeps `original`. `store`: the content store of the brim that
    sent it, through which the keys `sent` names are resolved when it offers brim_restore (None
    for a method that has none: what it keeps is all it has)."""
    wire = WIRES[api]
    tokenizer = tokenizer_of(api)
    tokens_in = counter.request(wire, original, tokenizer, MODELS[api]).total
    # A refused request (`sent` None) is judged as an empty one: nothing kept, nothing valid.
    items = wire.conversation(sent) if sent is not None else []
    errors = (check(items) if items else ["nothing left to send"]) if sent is not None else []
    tokens_out = None if sent is None else counter.request(wire, sent, tokenizer, MODELS[api]).total
    before = wire.conversation(original)
    text = orjson.dumps(sent).decode() if sent is not None else ""
    offered = sent is not None and RESTORE_TOOL.name in wire.tool_names(sent)
    keys = named_keys(text)
    rounds = (
        asyncio.run(stored_originals(store, keys, RESTORE_ROUNDS))
        if store is not None and offered and keys
        else []
    )
    originals = rounds[0] if rounds else []
    further = [later for found in rounds[1:] for later in found]
    # Each fact looked for once: in the request as sent, else in what one restore round fetches.
    kept = {fact for fact in facts.all() if fact in text}
    recoverable = kept | {
        fact
        for fact in facts.all()
        if fact not in kept and any(fact in stored for stored in originals)
    }

    return Case(
        method=method,
        api=api,
        factor=factor,
        seed=session.seed,
        budget=budget,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        refused=sent is None,
        valid=sent is not None and not errors,
        within=tokens_out is not None and tokens_out <= budget,
        system_kept=sent is not None
        and sessions.system_of(api, sent) == sessions.system_of(api, original),
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
        restore_offered=offered,
        keys_named=len(keys),
        keys_stored=len(originals),
        summarizer_calls=summarizer_calls,
        seconds=round(seconds, 4),
        errors=errors[:3],
        lost=[f.split()[0] for f in facts.all() if f not in kept],
        recovered=[f.split()[0] for f in facts.all() if f in recoverable and f not in kept],
        further=[
            f.split()[0]
            for f in facts.all()
            if f not in recoverable and any(f in later for later in further)
        ],
    )


def fidelity_cases(
    session: Session, counter: TokenCounter, check: Mapping[str, Checker]
) -> list[Case]:
    """Every method at every reduction factor, on one session."""
    cases: list[Case] = []
    facts = facts_of(session)
    for factor in FACTORS:
        for api in APIS:
            body = RENDER[api](session, None)
            tokens = counter.request(WIRES[api], body, tokenizer_of(api), MODELS[api]).total
            budget = int(tokens / factor)
            window = window_for(api, body, budget)
            judged = functools.partial(
                judge,
                api=api,
                factor=factor,
                session=session,
                original=body,
                budget=budget,
                counter=counter,
                facts=facts,
                check=check[api],
            )
            for method, summarize in ((BRIM, False), (BRIM_SUMMARIZE, True)):
                brim = Brim(counter, api, window, summarize)
                started = time.perf_counter()
                forwarded = asyncio.run(brim.send(body))
                seconds = time.perf_counter() - started
                assert forwarded.budget == budget, (forwarded.budget, budget)
                cases.append(
                    judged(
                        method,
                        sent=forwarded.body,
                        seconds=seconds,
                        summarizer_calls=forwarded.summarizer_calls,
                        store=brim.guard.store,  # this cut's own brim: its own store
                    )
                )
            if api != "openai.chat":
                continue
            for method in BASELINES:
                started = time.perf_counter()
                sent, note = baseline(method, body, budget, counter)
                seconds = time.perf_counter() - started
                cases.append(judged(method, sent=sent, seconds=seconds))
                cases[-1].note = note
    return cases


# ---------------------------------------------------------------- growing sessions


@dataclass
class Growth:
    """One method on one session growing turn by turn past its window's budget."""

    method: str
    api: str
    window: int
    budget: int
    turns: int = 0  # compressed turns measured
    pairs: int = 0  # consecutive compressed requests compared
    prefix_kept: int = 0  # ...where the earlier one is a byte-identical prefix of the later
    valid: int = 0
    within: int = 0
    newest_kept: int = 0  # requests that end with the client's newest item, byte for byte
    refused: int = 0
    untrimmed: int = 0  # the baseline gave up and returned its input
    calls_per_turn: list[int] = field(default_factory=list)
    resend_calls: int | None = None
    seconds: float = 0.0


def is_prefix(api: str, before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the earlier compressed request is, byte for byte, where the later one starts:
    the same fields outside the conversation, and its items as the later one's first items."""
    wire = WIRES[api]
    old, new = wire.conversation(before), wire.conversation(after)
    rest_old = orjson.dumps(wire.with_conversation(before, []), option=orjson.OPT_SORT_KEYS)
    rest_new = orjson.dumps(wire.with_conversation(after, []), option=orjson.OPT_SORT_KEYS)
    return (
        rest_old == rest_new
        and len(new) >= len(old)
        and all(orjson.dumps(a) == orjson.dumps(b) for a, b in zip(old, new, strict=False))
    )


def first_over(
    session: Session, api: str, budget: int, counter: TokenCounter, points: Sequence[int]
) -> int:
    """The index (in `points`) of the first request of the session over the budget."""
    wire, tokenizer = WIRES[api], tokenizer_of(api)
    low, high = 0, len(points) - 1
    while low < high:
        middle = (low + high) // 2
        body = RENDER[api](session, points[middle])
        if counter.request(wire, body, tokenizer, MODELS[api]).total > budget:
            high = middle
        else:
            low = middle + 1
    return low


def grow(
    session: Session,
    method: str,
    api: str,
    window: int,
    turns: int,
    counter: TokenCounter,
    check: Checker,
) -> Growth:
    wire, tokenizer = WIRES[api], tokenizer_of(api)
    brim = Brim(counter, api, window, summarize=method == BRIM_SUMMARIZE)
    probe = RENDER[api](session, 1)
    budget = window_budget(api, probe, window)
    points = session.request_points()
    start = first_over(session, api, budget, counter, points)
    growth = Growth(method, api, window, budget)
    previous: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    started = time.perf_counter()
    for point in points[start : start + turns]:
        body = RENDER[api](session, point)
        if counter.request(wire, body, tokenizer, MODELS[api]).total <= budget:
            break  # the session ended before passing the budget: nothing to measure
        if method in (BRIM, BRIM_SUMMARIZE):
            forwarded = asyncio.run(brim.send(body))
            sent, calls = forwarded.body, forwarded.summarizer_calls
            if method == BRIM_SUMMARIZE:
                growth.calls_per_turn.append(calls)
        else:
            sent, note = baseline(method, body, budget, counter)
            growth.untrimmed += note == "untrimmed"
        growth.turns += 1
        last = body
        if sent is None:
            growth.refused += 1
            previous = None
            continue
        growth.valid += not check(wire.conversation(sent))
        growth.within += counter.request(wire, sent, tokenizer, MODELS[api]).total <= budget
        items = wire.conversation(sent)
        growth.newest_kept += bool(items) and orjson.dumps(items[-1]) == orjson.dumps(
            wire.conversation(body)[-1]
        )
        if previous is not None:
            growth.pairs += 1
            growth.prefix_kept += is_prefix(api, previous, sent)
        previous = sent
    if method == BRIM_SUMMARIZE and last is not None:
        growth.resend_calls = asyncio.run(brim.send(last)).summarizer_calls
    growth.seconds = round(time.perf_counter() - started, 2)
    return growth


def prefix_ceiling(
    session: Session, api: str, window: int, turns: int, counter: TokenCounter
) -> Growth:
    """The most prefix any method can keep over the turns `grow` measures, if it keeps the
    newest turn whole (its last unit: the user message, or a tool call with its results) and
    sends valid requests: whenever the next turn does not fit on top of the previous request,
    cut down to the system prompt, the tools and that newest turn alone, no lower bound being
    lower; otherwise send the previous request plus the new items. Cutting to the least leaves
    the most room for the turns after it, so no method keeps the prefix on more turns."""
    wire, tokenizer = WIRES[api], tokenizer_of(api)
    budget = window_budget(api, RENDER[api](session, 1), window)
    points = session.request_points()
    start = first_over(session, api, budget, counter, points)
    growth = Growth(CEILING, api, window, budget)
    sent: int | None = None  # the ceiling method's request, in tokens
    before = 0  # the client's previous request, in tokens
    for point in points[start : start + turns]:
        body = RENDER[api](session, point)
        total = counter.request(wire, body, tokenizer, MODELS[api]).total
        if total <= budget:
            break
        growth.turns += 1
        growth.newest_kept += 1  # by its definition
        if sent is not None:
            growth.pairs += 1
            if sent + total - before <= budget:
                growth.prefix_kept += 1
                sent, before = sent + total - before, total
                continue
        items = wire.conversation(body)
        units = wire.dialect.units(items)
        kept = [i for unit in units if unit.kind == "system" for i in unit.indices]
        kept += list(units[-1].indices)
        least = wire.with_conversation(body, [items[i] for i in sorted(set(kept))])
        sent, before = counter.request(wire, least, tokenizer, MODELS[api]).total, total
    return growth


def growth_runs(
    windows: Sequence[int], turns: int, counter: TokenCounter, check: Mapping[str, Checker]
) -> list[Growth]:
    runs: list[Growth] = []
    for n, window in enumerate(windows):
        # Long enough to pass the budget and go on for `turns` more requests (~2 000 tokens each).
        session = sessions.generate(500 + n, int(window * 0.95) + turns * 2_500)
        for api in APIS:
            for method in (BRIM, BRIM_SUMMARIZE):
                runs.append(grow(session, method, api, window, turns, counter, check[api]))
            runs.append(prefix_ceiling(session, api, window, turns, counter))
        for method in BASELINES:
            # LiteLLM recounts every kept message for each one it adds (~8 s a call at 128K).
            count = (
                min(turns, LITELLM_TURNS_PAST_32K)
                if method == LITELLM and window > 32_768
                else turns
            )
            runs.append(
                grow(session, method, "openai.chat", window, count, counter, check["openai.chat"])
            )
    return runs


# ---------------------------------------------------------------- the report


def percent(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 1) if whole else None


def summarize_cases(cases: Sequence[Case]) -> list[dict[str, Any]]:
    """One row per (factor, method, API): shares over the sessions measured."""
    rows: list[dict[str, Any]] = []
    for factor in FACTORS:
        for method in METHODS:
            for api in APIS:
                group = [c for c in cases if (c.factor, c.method, c.api) == (factor, method, api)]
                if not group:
                    continue
                sent = [c for c in group if not c.refused]
                rows.append(
                    {
                        "factor": factor,
                        "method": method,
                        "api": api,
                        "cases": len(group),
                        "refused": len(group) - len(sent),
                        **{
                            f"{column}_pct": percent(sum(getattr(c, name) for c in sent), len(sent))
                            for column, name in REQUEST_SHARES.items()
                        },
                        **{
                            f"facts_{where}_{how}_pct": percent(
                                sum(getattr(c, f"facts_{where}_{how}") for c in group),
                                sum(getattr(c, f"facts_{where}") for c in group),
                            )
                            for where in ("older", "recent", "lookalike")
                            for how in ("kept", "recoverable")
                        },
                        "facts_in_later_rounds": sum(len(c.further) for c in group),
                        "tokens_out_share": round(
                            sum((c.tokens_out or 0) / c.budget for c in sent) / len(sent), 3
                        )
                        if sent
                        else None,
                        "summarizer_calls": sum(c.summarizer_calls for c in group),
                        "untrimmed": sum(c.note == "untrimmed" for c in group),
                        "ms": round(1000 * sum(c.seconds for c in group) / len(group), 1),
                    }
                )
    return rows


def summarize_places(
    cases: Sequence[Case], places: Mapping[tuple[int, str], str]
) -> list[dict[str, Any]]:
    """Per method (on Chat, every reduction together): the share of facts kept by where they
    were planted."""
    kinds = sorted(set(places.values()))
    rows: list[dict[str, Any]] = []
    for method in METHODS:
        group = [c for c in cases if c.method == method and c.api == "openai.chat"]
        row: dict[str, Any] = {"method": method}
        for kind in kinds:
            planted = lost = 0
            for case in group:
                mine = [f for (seed, f), k in places.items() if seed == case.seed and k == kind]
                planted += len(mine)
                lost += sum(f in case.lost for f in mine)
            row[kind] = percent(planted - lost, planted)
        rows.append(row)
    return rows


def summarize_growth(runs: Sequence[Growth]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for method in GROWTH_ROWS:
        for api in APIS:
            group = {g.window: g for g in runs if (g.method, g.api) == (method, api)}
            if not group:
                continue
            row: dict[str, Any] = {"method": method, "api": api}
            for window, g in group.items():
                calls = g.calls_per_turn
                row[str(window)] = {
                    "budget": g.budget,
                    "turns": g.turns,
                    "pairs": g.pairs,
                    "prefix_kept_pct": percent(g.prefix_kept, g.pairs),
                    "valid_pct": percent(g.valid, g.turns - g.refused),
                    "within_budget_pct": percent(g.within, g.turns - g.refused),
                    "newest_kept_pct": percent(g.newest_kept, g.turns - g.refused),
                    "refused": g.refused,
                    "untrimmed": g.untrimmed,
                    "summarizer_calls_first_turn": calls[0] if calls else None,
                    "summarizer_calls_per_later_turn": round(sum(calls[1:]) / len(calls[1:]), 2)
                    if calls[1:]
                    else None,
                    "summarizer_calls_max": max(calls) if calls else None,
                    "resend_calls": g.resend_calls,
                    "seconds": g.seconds,
                }
            rows.append(row)
    return rows


def cell(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def cells(values: Sequence[float | None]) -> str:
    """One figure per reduction factor, or one figure where they are all the same."""
    shown = [cell(value) for value in values]
    return shown[0] if len(set(shown)) == 1 else " · ".join(shown)


def render_summary(report: Mapping[str, Any]) -> str:
    """Everything in one table: per method and API, a figure per reduction factor (or one, if
    the same at all four), prefix kept per window."""
    factors = " · ".join(f"{f:g}×" for f in FACTORS)
    windows = [str(w) for w in report["windows"]]
    sizes = report["sessions"]
    lines = [
        f"brim context fidelity — {len(sizes)} session(s) of "
        + ", ".join(f"{s['tokens']:,}" for s in sizes)
        + f" tokens (Chat, o200k), {sum(s['facts'] for s in sizes)} facts planted "
        + f"and {sum(s['lookalike_facts'] for s in sizes)} look-alike facts"
        + (" (quick)" if report["quick"] else ""),
        "",
        f"Per reduction ({factors}; one figure when all are equal), % of requests or of facts; "
        "prefix kept per window ("
        + " · ".join(f"{int(w) // 1024}K" for w in windows)
        + "). Baselines take Chat Completions messages: n/a on Messages, Responses, Gemini.",
        "",
        "| method | API | valid | within budget | system kept | newest kept "
        "| facts kept, older | facts recoverable, older | facts kept, last 8 "
        "| look-alike facts kept | look-alike facts recoverable | prefix kept |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    growth = {(g["method"], g["api"]): g for g in report["growth"]}
    for method in METHODS:
        for api in APIS:
            rows = {
                r["factor"]: r
                for r in report["fidelity"]
                if (r["method"], r["api"]) == (method, api)
            }
            if not rows:
                continue
            ordered = [rows.get(f) for f in FACTORS]

            def column(key: str, ordered: list[dict[str, Any] | None] = ordered) -> str:
                return cells([r[key] if r else None for r in ordered])

            g = growth.get((method, api), {})
            prefix = cells([g[w]["prefix_kept_pct"] if w in g else None for w in windows])
            label = API_LABELS[api] + (" (others n/a)" if method in BASELINES else "")
            lines.append(
                f"| {method} | {label} | {column('valid_pct')} | {column('within_budget_pct')} "
                f"| {column('system_kept_pct')} | {column('newest_kept_pct')} "
                f"| {column('facts_older_kept_pct')} | {column('facts_older_recoverable_pct')} "
                f"| {column('facts_recent_kept_pct')} | {column('facts_lookalike_kept_pct')} "
                f"| {column('facts_lookalike_recoverable_pct')} | {prefix} |"
            )
    return "\n".join(lines)


def render(report: Mapping[str, Any]) -> str:
    sizes = report["sessions"]
    lines = [
        f"brim context fidelity — {len(sizes)} session(s) of "
        + ", ".join(f"{s['tokens']:,}" for s in sizes)
        + f" tokens (Chat, o200k), {sum(s['facts'] for s in sizes)} facts planted "
        + f"and {sum(s['lookalike_facts'] for s in sizes)} look-alike facts"
        + (" (quick)" if report["quick"] else ""),
        "",
        "Baselines take Chat Completions messages: they run on the Chat rendering only, n/a on "
        "Messages, Responses and Gemini.",
        "Figures are % of requests (valid … newest kept) or of planted facts; refused = brim "
        "answered 400 instead. Look-alike facts: each one line of a listing whose other lines "
        "look like it (bench.sessions); older and last 8 count the other facts. Recoverable = "
        "kept, or in the stored original of a key the request names while it offers "
        "brim_restore (baselines name none: recoverable = kept).",
    ]
    header = (
        "| method | API | valid | within budget | system kept | newest kept "
        "| facts kept, older | facts recoverable, older | facts kept, last 8 "
        "| look-alike facts kept | look-alike facts recoverable | tokens / budget | refused |"
    )
    rule = "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    for factor in FACTORS:
        rows = [r for r in report["fidelity"] if r["factor"] == factor]
        budget = ", ".join(
            f"{API_LABELS[c['api']]} {c['budget']:,}"
            for c in report["cases"]
            if c["factor"] == factor and c["method"] == BRIM and c["seed"] == sizes[0]["seed"]
        )
        lines += [
            "",
            f"**{factor:g}× reduction** (budgets, first session: {budget})",
            "",
            header,
            rule,
        ]
        for row in rows:
            lines.append(
                f"| {row['method']} | {API_LABELS[row['api']]} | {cell(row['valid_pct'])} "
                f"| {cell(row['within_budget_pct'])} | {cell(row['system_kept_pct'])} "
                f"| {cell(row['newest_kept_pct'])} | {cell(row['facts_older_kept_pct'])} "
                f"| {cell(row['facts_older_recoverable_pct'])} "
                f"| {cell(row['facts_recent_kept_pct'])} "
                f"| {cell(row['facts_lookalike_kept_pct'])} "
                f"| {cell(row['facts_lookalike_recoverable_pct'])} "
                f"| {cell(row['tokens_out_share'])} "
                f"| {row['refused']} |"
            )
            if row["method"] in BASELINES:
                lines[-1] = lines[-1].replace("| Chat |", "| Chat (others n/a) |")
    litellm = [r for r in report["fidelity"] if r["method"] == LITELLM]
    gave_up = sum(r["untrimmed"] for r in litellm)
    if gave_up:
        lines += [
            "",
            f"LiteLLM's trim_messages returned the messages untrimmed in {gave_up} of "
            f"{sum(r['cases'] for r in litellm)} cases: it raised on an assistant message with "
            "`content: null` (a tool call) and caught its own exception.",
        ]
    kinds = [k for k in report["facts_by_place"][0] if k != "method"]
    planted = {k: sum(s["places"].get(k, 0) for s in report["sessions"]) for k in kinds}
    lines += [
        "",
        "**Facts kept by where they were planted** (Chat, all four reductions together; "
        "facts planted: " + ", ".join(f"{k} {planted[k]}" for k in kinds) + ")",
        "",
        "| method | " + " | ".join(kinds) + " |",
        "|---|" + "--:|" * len(kinds),
    ]
    for row in report["facts_by_place"]:
        lines.append(f"| {row['method']} | " + " | ".join(cell(row[k]) for k in kinds) + " |")
    windows = [str(w) for w in report["windows"]]
    labels = [f"{int(w) // 1024}K" for w in windows]
    lines += [
        "",
        f"**Growing sessions** ({report['growth_turns']} compressed turns per window; LiteLLM "
        f"{LITELLM_TURNS_PAST_32K} past 32K, as it is slow there): prefix kept = share of "
        "consecutive compressed requests where the earlier one is a byte-identical prefix of the "
        "later one (what a provider's prompt cache needs); newest kept = share of those requests "
        "that end with the client's newest item whole. The ceiling is the most any method "
        "keeping the newest turn whole can reach on these sessions (`prefix_ceiling`).",
        "",
        "| method | API | "
        + " | ".join(f"prefix kept {label}" for label in labels)
        + " | newest kept "
        + " · ".join(labels)
        + " |",
        "|---|---|" + "--:|" * (len(windows) + 1),
    ]
    for row in report["growth"]:
        api = API_LABELS[row["api"]] + (" (others n/a)" if row["method"] in BASELINES else "")
        prefix = " | ".join(cell(row[w]["prefix_kept_pct"]) if w in row else "—" for w in windows)
        newest = cells([row[w]["newest_kept_pct"] if w in row else None for w in windows])
        lines.append(f"| {row['method']} | {api} | {prefix} | {newest} |")
    lines += [
        "",
        "**Summarizer calls** (brim + summarize, growing sessions): on the first compressed turn, "
        "per later turn (mean), and for an identical resend of the last request.",
        "",
        "| API | " + " | ".join(f"{label} first · later · resend" for label in labels) + " |",
        "|---|" + "--:|" * len(windows),
    ]
    for row in report["growth"]:
        if row["method"] != BRIM_SUMMARIZE:
            continue
        figures = []
        for w in windows:
            f = row.get(w)
            figures.append(
                "—"
                if f is None
                else f"{f['summarizer_calls_first_turn']} · "
                f"{cell(f['summarizer_calls_per_later_turn'])} · {f['resend_calls']}"
            )
        lines.append(f"| {API_LABELS[row['api']]} | " + " | ".join(figures) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a small run (what the test runs)")
    parser.add_argument("--out", default="bench/results/fidelity.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch at import
    use_bundled_tiktoken_files()
    counter = TokenCounter()
    counter.warm()
    check = checkers()
    started = time.perf_counter()

    seeds, tokens = ((1,), 24_000) if args.quick else ((1, 2, 3, 4, 5), 60_000)
    windows = WINDOWS[:2] if args.quick else WINDOWS
    turns = 6 if args.quick else 24
    cases: list[Case] = []
    described = []
    places: dict[tuple[int, str], str] = {}
    for seed in seeds:
        session = sessions.generate(seed, tokens)
        for fact, kind in sessions.fact_places(session).items():
            places[(seed, fact.split()[0])] = kind
        chat = sessions.chat_body(session)
        facts = facts_of(session)
        described.append(
            {
                "seed": seed,
                "tokens": counter.request(CHAT, chat, "o200k_base").total,
                "messages": len(chat["messages"]),
                "facts": len(facts.older) + len(facts.recent),
                "lookalike_facts": len(facts.lookalike),
                "places": dict(Counter(sessions.fact_places(session).values())),
            }
        )
        cases += fidelity_cases(session, counter, check)
    fidelity_s = time.perf_counter() - started
    runs = growth_runs(windows, turns, counter, check)
    report: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": args.quick,
        "factors": FACTORS,
        "windows": windows,
        "growth_turns": turns,
        "sessions": described,
        "fidelity": summarize_cases(cases),
        "facts_by_place": summarize_places(cases, places),
        "growth": summarize_growth(runs),
        "cases": [dataclasses.asdict(c) for c in cases],
        "growth_runs": [dataclasses.asdict(g) for g in runs],
        "seconds": {
            "fidelity": round(fidelity_s, 1),
            "total": round(time.perf_counter() - started, 1),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(render_summary(report))
    print("\n\nIn detail\n")
    print(render(report))
    print(f"\nrun in {report['seconds']['total']} s; full results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
