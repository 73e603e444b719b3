"""Summaries instead of forgetting: what `evict` removed, condensed by a cheap model.

Levels: condensed (~50 % of the original), key_points (~25 %), headline (~10 %). The first level
whose share fits the room is tried; a summary still over its target is made again at the next
level, and past the last one it is cut (`truncate_fallback`). An input larger than the summarizer
model's own window is summarized in chunks, then the chunk summaries together (map-reduce).

Providers are tried in order, each with retries; if every one fails the caller gets None and the
request goes on with evict's notice — a summarizer failure never fails a request. A provider is
any routed model on any wire API (`upstream_caller`), called with its upstream's own key, or with
the client's where it is the very upstream the client addressed; on another upstream without a
key of its own it is skipped for that request (`adapters.credentials`). Summaries are cached by
owner (the client whose request they were made for, `Caller.owner`: a summary of one client's
content is never served to another), content, conversation context, level, provider and prompt
version — never by the room left, which moves every turn — so the next turn of the same session
reuses the very same bytes (and the provider's prompt cache stays warm).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from cachetools import TTLCache
from multidict import CIMultiDict, CIMultiDictProxy

from brim.adapters.credentials import Caller, CredentialWithheld, brings_own_key, may_call, withhold
from brim.adapters.exchange import Exchange
from brim.adapters.registry import Upstreams
from brim.middleware.services.shared import RedisLink, Unavailable
from brim.policies.limits import LimitsRegistry
from brim.policies.lines import cut_middle
from brim.policies.tokens import CounterMeter
from brim.policies.wires import WIRES
from brim.policies.wires.chat import CHAT

log = logging.getLogger("brim.summarize")

LEVELS: dict[str, float] = {"condensed": 0.5, "key_points": 0.25, "headline": 0.1}
INSTRUCTIONS = {
    "condensed": "Condense it to about half its length, keeping every fact that matters.",
    "key_points": "Reduce it to its key points as a short bulleted list.",
    "headline": "Reduce it to a few lines: the essential facts and open tasks only.",
}
PROMPT_V1 = (
    "You summarize an earlier part of a conversation between a user and an AI assistant (with "
    "its tool calls and results), so the assistant can continue without it. Keep facts, "
    "decisions, names, numbers, file paths, errors, and tasks still open. Do not add anything. "
    "The conversation's task: {task}\n\n{instruction}"
)
PROMPTS = {"v1": PROMPT_V1}

# (provider model id, [system, user] messages, max_tokens, the requesting client) -> the summary
# text; raises `CredentialWithheld` where the client's key may not go and the upstream has none.
CallModel = Callable[[str, list[dict[str, str]], int, Caller], Awaitable[str]]


class SummaryCache(Protocol):
    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str) -> None: ...


class MemoryCache:
    def __init__(self, ttl_hours: float, size: int = 10_000) -> None:
        self._entries: TTLCache[str, str] = TTLCache(maxsize=size, ttl=ttl_hours * 3600)

    async def get(self, key: str) -> str | None:
        return self._entries.get(key)

    async def set(self, key: str, value: str) -> None:
        self._entries[key] = value


class RedisCache:
    """Shared by every brim instance that points at the same Redis, through `link` (its outage
    policy: `middleware.services.shared.RedisLink`); `local` answers first, and alone while Redis is
    down. Keys: `brim:summary:` + the summary's key (owner, digests, level, provider, prompt
    version). A value that is not UTF-8 text is not used, and reported (`on_rejected`)."""

    def __init__(
        self,
        link: RedisLink,
        ttl_hours: float,
        local: MemoryCache | None = None,
        *,
        on_rejected: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.link = link
        self.local = local if local is not None else MemoryCache(ttl_hours)
        self._ttl = max(1, int(ttl_hours * 3600))
        self.on_rejected = on_rejected

    async def get(self, key: str) -> str | None:
        found = await self.local.get(key)
        if found is not None:
            return found
        try:
            value = await self.link.run(lambda client: client.get(f"brim:summary:{key}"))
        except Unavailable:
            return None
        if value is None:
            return None
        text = _utf8(value)
        if text is None:
            self.on_rejected("malformed")
            return None
        await self.local.set(key, text)
        return text

    async def set(self, key: str, value: str) -> None:
        await self.local.set(key, value)
        data = value.encode("utf-8", "surrogatepass")
        # Off the summarizing path, as the other shared writes (the local copy answers now).
        self.link.spawn(lambda client: client.set(f"brim:summary:{key}", data, ex=self._ttl))


def _utf8(value: object) -> str | None:
    """`value` as text, if it is UTF-8 bytes."""
    if not isinstance(value, bytes):
        return None
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    level: str
    provider: str
    tokens_before: int
    tokens_after: int
    cache_hit: bool
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Job:
    """One request's summary: which model, its task and level, and the requesting client (its
    API, the upstream it addressed, its own credentials, its owner: the cache's scope) — passed
    down the calls, never stored on the shared summarizer."""

    provider: str
    task: str
    level: str
    caller: Caller


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class Summarizer:
    def __init__(
        self,
        call: CallModel,
        providers: Sequence[str],
        meter: CounterMeter,
        registry: LimitsRegistry,
        cache: SummaryCache | None,
        *,
        max_retries: int = 2,
        retry_delay_s: float = 3.0,
        timeout_s: float = 120.0,
        prompt_version: str = "v1",
        truncate_fallback: bool = True,
    ) -> None:
        if not providers:
            raise ValueError("a summarizer needs at least one provider")
        if prompt_version not in PROMPTS:
            raise ValueError(f"unknown prompt_version {prompt_version!r}; known: {list(PROMPTS)}")
        self.call = call
        self.providers = list(providers)
        self.meter = meter
        self.registry = registry
        self.cache = cache
        self.max_retries = max_retries
        self.retry_delay_s = retry_delay_s
        self.timeout_s = timeout_s
        self.prompt_version = prompt_version
        self.truncate_fallback = truncate_fallback

    async def summarize(
        self, text: str, target: int, task: str, caller: Caller | None = None
    ) -> Summary | None:
        """`text` in at most `target` tokens — the text itself when it is that short already —
        or None if no provider could make one. `caller` is the requesting client, with its own
        credentials: they travel down as arguments, never kept on this shared object, so
        concurrent requests never lend each other their keys. A provider the client's key may
        not reach (and that has no key of its own) is skipped, and that is recorded on the
        caller's report (`withhold`). Only the caller's owner reuses the summary from the cache."""
        caller = caller if caller is not None else Caller(api=CHAT.name)
        size = self.meter.text_tokens(text)
        if size <= target:
            return Summary(text, "verbatim", "", size, size, cache_hit=False)
        level = next((name for name, share in LEVELS.items() if size * share <= target), "headline")
        for provider in self.providers:
            try:
                return await self._with(Job(provider, task, level, caller), text, size, target)
            except CredentialWithheld as exc:
                withhold(caller, "summarize", provider, exc.upstream)
            except Exception as exc:
                log.warning("summarizer %r failed: %s", provider, exc or type(exc).__name__)
        log.warning("every summarizer failed; keeping the eviction notice")
        return None

    async def _with(self, job: Job, text: str, size: int, target: int) -> Summary:
        # By content, not by target: the same text asks for the same summary every turn, so a
        # session's next request reuses it byte for byte (the target follows from its size).
        key = "|".join(
            (
                job.caller.owner,
                _digest(text),
                _digest(job.task),
                job.level,
                job.provider,
                self.prompt_version,
            )
        )
        cached = await self.cache.get(key) if self.cache is not None else None
        if cached is not None and (after := self.meter.text_tokens(cached)) <= target:
            return Summary(cached, job.level, job.provider, size, after, True)
        levels = list(LEVELS)
        summary = ""
        for name in levels[levels.index(job.level) :]:
            job = dataclasses.replace(job, level=name)
            summary = await self._reduce(job, text, target)
            if self.meter.text_tokens(summary) <= target:
                break
        truncated = False
        if self.meter.text_tokens(summary) > target:
            if not self.truncate_fallback:
                raise ValueError(f"the summary stays over {target} tokens at every level")
            summary, _ = cut_middle(summary, max(16, target - 24), self.meter)
            truncated = True
        if self.cache is not None:
            await self.cache.set(key, summary)
        return Summary(
            summary,
            job.level,
            job.provider,
            size,
            self.meter.text_tokens(summary),
            False,
            truncated,
        )

    async def _reduce(self, job: Job, text: str, target: int) -> str:
        """Map-reduce when `text` is larger than the summarizer's own window allows."""
        window = self.registry.resolve(job.provider).limits.context_window
        chunk_tokens = max(256, int(window * 0.6))
        tokens = self.meter.tokens(text)
        if len(tokens) <= chunk_tokens:
            return await self._once(job, text, target)
        chunks = [
            self.meter.decode(tokens[i : i + chunk_tokens])
            for i in range(0, len(tokens), chunk_tokens)
        ]
        share = max(64, target // len(chunks))
        parts = await asyncio.gather(*(self._once(job, chunk, share) for chunk in chunks))
        joined = "\n\n".join(parts)
        if self.meter.text_tokens(joined) > target:
            return await self._reduce(job, joined, target)
        return joined

    async def _once(self, job: Job, text: str, target: int) -> str:
        prompt = PROMPTS[self.prompt_version].format(
            task=job.task or "(not stated)", instruction=INSTRUCTIONS[job.level]
        )
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": text}]
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            try:
                call = self.call(job.provider, messages, max(64, target), job.caller)
                return await asyncio.wait_for(call, self.timeout_s)
            except CredentialWithheld:  # not a failure: this client may not call it at all
                raise
            except Exception as exc:  # retried, then the caller moves to the next provider
                last = exc
                if attempt < self.max_retries:
                    await asyncio.sleep(self.retry_delay_s)
        assert last is not None
        raise last


def upstream_caller(upstreams: Upstreams) -> CallModel:
    """Summaries made by any model behind one of brim's own upstreams, on whichever wire API
    it is routed on (`Upstreams.route_own_call`: the client's own API where the model's route
    speaks it). The call carries that upstream's own key; the client's credentials only where
    it is the upstream the client addressed and has no key of its own; on any other upstream
    without a key the call is not made (`CredentialWithheld`)."""

    async def call(
        provider: str, messages: list[dict[str, str]], max_tokens: int, caller: Caller
    ) -> str:
        name, api = upstreams.route_own_call(provider, caller.api)
        wire = WIRES[api]
        config = upstreams.configs[name]
        if not may_call(name, config, caller.upstream):
            raise CredentialWithheld(name, caller.upstream)
        own = brings_own_key(config)  # else the client's, to the upstream it addressed
        request = wire.model_call(
            provider, messages[0]["content"], messages[1]["content"], max_tokens
        )
        headers = CIMultiDict({"Content-Type": "application/json", **request.headers})
        if not own:
            headers.update(caller.headers)
        exchange = Exchange(
            api=wire.name,
            method="POST",
            endpoint=request.endpoint,
            query="" if own else caller.query,
            model=provider,
            body=request.body,
            raw=orjson.dumps(request.body),
            headers=CIMultiDictProxy(headers),
            stream=False,
            upstream=name,
            request_id="brim-summary",
            addressed=None if own else name,
        )
        reply = await upstreams[name].send(exchange)
        if not 200 <= reply.status < 300:
            raise ValueError(f"{provider} answered HTTP {reply.status}")
        payload = reply.payload if reply.payload is not None else orjson.loads(reply.body or b"{}")
        content = wire.reply_text(payload) if isinstance(payload, dict) else ""
        if not content.strip():
            raise ValueError(f"{provider} returned no summary text")
        return content

    return call
