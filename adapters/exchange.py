"""The unit of work that travels from the HTTP layer through the pipeline to an adapter."""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import re
import time
from dataclasses import dataclass, field
from typing import Any, overload

import orjson
from multidict import CIMultiDictProxy

from brim.policies.budget import TokenBudget
from brim.policies.compress import Outcome
from brim.policies.limits import ResolvedLimits, wants_long_context
from brim.policies.records import record
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires import BY_ENDPOINT
from brim.policies.wires.base import Usage, Wire
from brim.policies.wires.chat import CHAT

# The endpoint the client called, by wire API: "openai.chat", "anthropic.count_tokens", … (each
# wire's `serving` lists its own). Named by API, not provider: Azure and vLLM speak "openai.chat".
ClientApi = str

NO_USAGE = Usage()  # a reply's usage until it reports some (immutable: one serves every request)

# Whose a request is (`Exchange.owner`): what brim keeps from it — restore originals, archive
# entries, session memory, summaries — is that owner's alone. brim's edge (`proxy.owners`) names
# it: a keyed hash of the client's brim key (`key-<hex>`) or of its provider credentials
# (`cred-<hex>`), never the key itself; a request with neither is `ANONYMOUS`'s (a loopback brim
# without keys is one user's). Owners are short and safe as file and Redis key names.
ANONYMOUS = "anonymous"
OWNER_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,79}")


@record
class RequestTokens:
    """How many input tokens a request has: a free upper bound, and the exact count — known
    already, or (for a request the bound already cleared: no decision hangs on the count)
    `pending`, being counted beside the upstream call: a large request in a worker thread, a
    small one on the event loop as soon as the request first waits.

    Where brim can only estimate (Claude, Gemini) and its estimate was too close to the budget
    to decide, `exact` is the provider's own count and `estimate` keeps brim's.

    brim's counts are scaled by `ratio`, the model's learned token ratio (`policies.ratios`)
    or its tokenizer's prior (None: the prior), fixed once for the request: every later count
    of it (the guard's, the retry's) uses the same."""

    upper_bound: int
    exact: int | None = None
    pending: asyncio.Future[int] | None = field(default=None, compare=False)
    estimate: int | None = None  # brim's own count, when `exact` is the provider's
    ratio: float | None = None

    @property
    def provider_ratio(self) -> float | None:
        """The provider's count ÷ brim's estimate of this request (above 1: brim's estimate ran
        low), or None when the provider did not count it. Multiply brim's counts by it to
        calibrate them to the provider for this request."""
        if self.estimate is None or self.exact is None or self.estimate <= 0:
            return None
        return self.exact / self.estimate

    @property
    def brims(self) -> int | None:
        """brim's own count of the request, if it made one (the guard's units)."""
        return self.estimate if self.estimate is not None else self.exact

    def known(self) -> int:
        """The exact count if it is known by now (a pending count that has finished counts),
        else the bound — without waiting."""
        if self.exact is not None:
            return self.exact
        pending = self.pending
        finished = pending is not None and pending.done() and not pending.cancelled()
        if pending is not None and finished and pending.exception() is None:
            return pending.result()
        return self.upper_bound

    async def resolve(self) -> int:
        if self.exact is not None:
            return self.exact
        if self.pending is not None:
            return await self.pending
        return self.upper_bound


@record
class RequestContext:
    """What brim worked out about a request: its model's limits, its budget, its size."""

    limits: ResolvedLimits
    budget: TokenBudget
    tokens: RequestTokens
    client: str | None = None  # the `[clients.NAME]` rule that matched, if any
    outcome: Outcome | None = None  # what the guard did, when it had to act

    @property
    def fits(self) -> bool:
        tokens = self.tokens
        exact = tokens.exact
        return (exact if exact is not None else tokens.upper_bound) <= self.budget.effective


@dataclass(frozen=True, slots=True)
class Quota:
    """Whom a request counts against for `[server]` rate limits, and their limits: `holder` is a
    hash of the client's brim key (of its address when brim has no keys), never the key."""

    holder: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class Withheld:
    """A step brim did not take for a request because it would have sent the client's
    credential to another upstream than the one it addressed (`adapters.credentials`): which
    step ("summarize", "fallback", "native_count"), for which model, on which upstream."""

    step: str
    model: str
    upstream: str


@dataclass(slots=True)
class RequestReport:
    """What happened to one request: facts the stages record as they act, read at the end for
    the `x-brim-*` headers (`middleware.services.reply_headers`), traces, metrics, the audit log and
    status. Every copy of an exchange shares it."""

    started: float = field(default_factory=time.perf_counter)
    upstream_seconds: float = 0.0
    upstream_calls: int = 0
    context: RequestContext | None = None
    outcome: Outcome | None = None  # the guard's
    retries: int = 0
    # Tuples, not lists: most requests record none of these, and an empty tuple is one shared
    # object where a list is made per request (writers add with `+= (item,)`).
    overflow_messages: tuple[str, ...] = ()
    retry_outcomes: tuple[Outcome, ...] = ()
    fallbacks: tuple[str, ...] = ()
    archive_keys: tuple[str, ...] = ()
    usage: Usage = NO_USAGE  # what the provider's reply reported
    response_model: str | None = None  # the model the provider's reply said answered
    restore_offered: bool = False  # brim added `brim_restore` to the request's tools
    restored: tuple[str, ...] = ()  # keys the model fetched back
    restore_missing: tuple[str, ...] = ()  # asked for, unknown or expired
    withheld: tuple[Withheld, ...] = ()  # steps not taken: the client's key may not go there
    # The request as the retry last sent it, where that is not the one it was given (cut, or
    # another model) and brim_restore was offered: restore rounds go on from it, and take it.
    sent: Exchange | None = None

    @property
    def outcomes(self) -> list[Outcome]:
        """Every compression, in order: the guard's, then each retry's cut."""
        return [o for o in (self.outcome, *self.retry_outcomes) if o is not None]

    @overload
    def tokens_sent(self, received: int) -> int: ...

    @overload
    def tokens_sent(self, received: None) -> int | None: ...

    def tokens_sent(self, received: int | None) -> int | None:
        """What went to the provider last: the last cut's size, else `received`."""
        if self.retry_outcomes:
            return self.retry_outcomes[-1].tokens_out
        return received if self.outcome is None else self.outcome.tokens_out

    def tokens_received(self) -> int | None:
        """The request's size as the client sent it, without waiting for a pending count."""
        if self.outcome is not None:
            return self.outcome.tokens_in
        return None if self.context is None else self.context.tokens.known()


@record
class Exchange:
    """One client request as brim sees it.

    `raw` holds the body bytes to forward: the client's, exactly as received, unless a stage
    changed the request; `body` is the same request parsed. An unchanged request is never
    re-serialized.
    """

    api: ClientApi
    method: str
    endpoint: str  # the path after the API root, e.g. "/chat/completions"
    query: str
    model: str
    body: dict[str, Any] | None
    raw: bytes
    headers: CIMultiDictProxy[str]
    stream: bool
    upstream: str
    request_id: str
    user_agent: str = ""
    owner: str = ANONYMOUS  # whose it is, named once at brim's edge (see `ANONYMOUS`)
    # The upstream the client's request was routed to: the only one its own credentials (in
    # `headers`, and Gemini's `key=` in `query`) may go to. A stage that sends the request
    # elsewhere (a fallback) changes `upstream`, never this; None: brim's own request, which
    # carries no client credential to anyone.
    addressed: str | None = None
    context: RequestContext | None = None
    quota: Quota | None = None  # None: no rate limits are configured
    report: RequestReport = field(default_factory=RequestReport, compare=False)

    @property
    def wire(self) -> Wire:
        return _WIRE_OF(self.api, CHAT)  # `wire_for`, without a call of its own (read often)

    @property
    def long_context(self) -> bool:
        """Whether the client opted into Anthropic's 1M-token window (`anthropic-beta`)."""
        betas = self.headers.getall("anthropic-beta", None)
        return betas is not None and wants_long_context(betas)

    def meter(self, counter: TokenCounter) -> CounterMeter:
        """`counter` measuring this request as the guard, the retry and restore rounds do: its
        tokenizer, model and wire, at the ratio it is counted at (needs its context)."""
        assert self.context is not None
        context = self.context
        tokenizer = context.limits.limits.tokenizer
        return CounterMeter(counter, tokenizer, self.model, self.wire, context.tokens.ratio)

    def with_body(self, body: dict[str, Any]) -> Exchange:
        """The same exchange carrying a changed request, serialized once, here."""
        return dataclasses.replace(self, body=body, raw=orjson.dumps(body))

    def for_model(self, model: str, upstream: str, context: RequestContext) -> Exchange:
        """The same request sent to `model` on `upstream` (a fallback), with `context` (that
        model's limits and budget): the model named where its wire API names it (the body, or
        Gemini's path); the body re-serialized only if that changed it. `addressed` stays: the
        client's credentials go to the upstream it addressed, not to the new one."""
        assert self.body is not None
        body, endpoint = self.wire.with_model(self.body, self.endpoint, model)
        raw = self.raw if body is self.body else orjson.dumps(body)
        return dataclasses.replace(
            self,
            model=model,
            upstream=upstream,
            body=body,
            raw=raw,
            endpoint=endpoint,
            context=context,
        )

    def with_context(self, context: RequestContext) -> Exchange:
        """The same exchange with `context`: `dataclasses.replace(self, context=context)`, at
        half its cost (every request takes this step)."""
        values = list(_EXCHANGE_VALUES(self))
        values[_CONTEXT_AT] = context
        return Exchange(*values)


_WIRE_OF = BY_ENDPOINT.get

# Every field of an `Exchange` in order, read at once; where its context is among them.
_EXCHANGE_FIELDS = tuple(f.name for f in dataclasses.fields(Exchange))
_EXCHANGE_VALUES = operator.attrgetter(*_EXCHANGE_FIELDS)
_CONTEXT_AT = _EXCHANGE_FIELDS.index("context")
