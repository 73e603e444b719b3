"""Cross-format forwarding through litellm (`api = "litellm"`): Bedrock, Vertex, and the rest.

The client speaks OpenAI Chat Completions; litellm translates to the provider and back. litellm
costs seconds and hundreds of MB to import, so it is imported on the first request that needs it
and never by brim's start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from multidict import CIMultiDict

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import (
    ContextOverflow,
    UpstreamError,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
    hide_addresses,
    past_max_duration,
)
from brim.adapters.exchange import Exchange
from brim.adapters.overflow import Overflow, classify
from brim.adapters.raw import MAX_PEEK, first_event
from brim.adapters.upstream_config import UpstreamConfig
from brim.policies.wires import wire_for
from brim.policies.wires.base import ErrorInfo
from brim.policies.wires.chat import CHAT
from brim.policies.wires.messages import MESSAGES

# Messages fields only Anthropic itself accepts; another provider behind litellm would refuse them.
ANTHROPIC_ONLY_FIELDS = ("context_management", "container", "mcp_servers", "betas")
log = logging.getLogger("brim.upstream")
_JSON = CIMultiDict({"Content-Type": "application/json"})
_SSE = CIMultiDict({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
_END = object()  # what `_peek` reads from a stream that ended before its first chunk


def _error_body(status: int, message: str, error_type: str, code: str | None, api: str) -> bytes:
    """An error in the client's own wire shape (litellm's exceptions carry no body)."""
    return wire_for(api).error_body(ErrorInfo(status, error_type, message, code))


def import_litellm() -> Any:
    # Offline by default: litellm otherwise fetches its model map from the internet on import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    # Messages requests to OpenAI-family models go to chat/completions, which every
    # OpenAI-compatible server has, rather than to the Responses API, which few do.
    litellm.use_chat_completions_url_for_anthropic_messages = True
    return litellm


def _bearer(exchange: Exchange, upstream: str) -> str | None:
    """The client's own key, for the upstream its request addressed only."""
    if exchange.addressed != upstream:
        return None
    value = exchange.headers.get("Authorization", "")
    if value.lower().startswith("bearer "):
        return value[7:].strip() or None
    return exchange.headers.get("x-api-key")


class LitellmAdapter:
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        self.name = name
        self.config = config

    async def aclose(self) -> None:
        return None

    def _key(self, exchange: Exchange) -> str | None:
        """The configured key, else the client's own (`_bearer`)."""
        if self.config.api_key is not None:
            return self.config.api_key.get_secret_value()
        return _bearer(exchange, self.name)

    def _failure(self, exc: Exception, api: str = CHAT.name) -> UpstreamFailure:
        """The documented failure for litellm's exception; its message, which may name the
        provider's address, with no address in it (the log has it)."""
        litellm = import_litellm()
        said = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        message = hide_addresses(said)
        if message != said:
            log.warning("upstream %r (litellm): %s", self.name, said)
        if isinstance(exc, litellm.Timeout):  # litellm's `timeout`: one read, not the request
            return UpstreamTimeout(
                f"upstream {self.name!r} did not answer within {self.config.timeout_s:g} s",
                upstream=self.name,
            )
        if isinstance(exc, TimeoutError):  # brim's own deadline (`_deadline`) ran out
            return past_max_duration(self.name, self.config.max_duration_s)
        if isinstance(exc, litellm.APIConnectionError):
            return UpstreamUnreachable(
                f"upstream {self.name!r} is unreachable: {message}", upstream=self.name
            )
        status = getattr(exc, "status_code", None)
        if isinstance(exc, litellm.ContextWindowExceededError):
            body = _error_body(
                400, message, "invalid_request_error", "context_length_exceeded", api
            )
            overflow = classify(400, body) or Overflow(message=message)
            return ContextOverflow(
                upstream=self.name, status=400, headers=_JSON, body=body, overflow=overflow
            )
        if isinstance(status, int) and 400 <= status < 600:
            error_type = "invalid_request_error" if status < 500 else "api_error"
            return UpstreamError.from_reply(
                upstream=self.name,
                status=status,
                headers=_JSON,
                body=_error_body(status, message, error_type, None, api),
            )
        return UpstreamProtocolError(
            f"upstream {self.name!r} failed: {message}", upstream=self.name
        )

    async def send(self, exchange: Exchange) -> UpstreamResponse:
        if exchange.api == MESSAGES.name and exchange.body is not None:
            return await self._messages(exchange)
        if exchange.api != CHAT.name or exchange.body is None:
            raise UpstreamProtocolError(
                f"upstream {self.name!r} (litellm) serves chat completions and messages only",
                upstream=self.name,
            )
        litellm = import_litellm()
        request = {key: value for key, value in exchange.body.items() if key != "model"}
        key = self._key(exchange)
        deadline = self._deadline()
        try:
            async with asyncio.timeout_at(deadline):
                result = await litellm.acompletion(
                    model=f"{self.config.model_prefix}{exchange.model}",
                    api_base=self.config.base_url,
                    api_key=key,
                    timeout=self.config.timeout_s,
                    max_retries=0,
                    **request,
                )
                if exchange.stream:
                    rest, first = await self._peek(result)
        except UpstreamFailure:  # an empty stream (`_peek`)
            raise
        except Exception as exc:
            raise self._failure(exc) from exc
        if not exchange.stream:
            return UpstreamResponse(
                status=200, headers=_JSON, body=result.model_dump_json().encode()
            )
        return UpstreamResponse(
            status=200,
            headers=_SSE,
            chunks=self._events(first, rest, deadline),
            closer=_closer(result),
        )

    async def _peek(self, stream: Any) -> tuple[AsyncIterator[Any], Any]:
        """The stream's first chunk, read before the client is told 200 (as `RawHttpAdapter`
        reads the first event): litellm raises a provider's refusal — a context overflow among
        them — only when a stream is first read, and a stream that ends before its first chunk
        is how some servers answer a prompt longer than their context. Either becomes a
        `ContextOverflow` here, where the retry stage can still act on it. So does an overflow
        sent as the first event of a stream litellm relays as bytes (Anthropic's own, for a
        Messages request), as `RawHttpAdapter` finds it. Returns the iterator and the chunk to
        replay; closes the stream when it raises."""
        iterator = aiter(stream)
        try:
            first = await anext(iterator, _END)
            if isinstance(first, bytes | bytearray | str):
                first, iterator = await self._first_event(first, iterator)
        except BaseException:
            await _close(stream)
            raise
        if first is _END:
            await _close(stream)
            raise ContextOverflow(
                upstream=self.name,
                status=200,
                headers=_SSE,
                body=b"",
                overflow=Overflow(message="the provider sent an empty stream", empty_stream=True),
            )
        return iterator, first

    async def _first_event(
        self, first: bytes | bytearray | str, iterator: AsyncIterator[Any]
    ) -> tuple[bytes, AsyncIterator[Any]]:
        """A stream of raw server-sent event bytes, read up to its first event with data: an
        overflow there raises `ContextOverflow`. Returns the bytes read (one chunk to replay)
        and the rest of the stream."""
        seen = first.encode() if isinstance(first, str) else bytes(first)
        while (event := first_event(seen)) is None and len(seen) <= MAX_PEEK:
            chunk = await anext(iterator, _END)
            if not isinstance(chunk, bytes | bytearray | str):  # the end, or not bytes after all
                if chunk is not _END:
                    iterator = _chain(chunk, iterator)
                break
            seen += chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        overflow = None if event is None else event[1]
        if overflow is not None:
            raise ContextOverflow(
                upstream=self.name, status=200, headers=_SSE, body=seen, overflow=overflow
            )
        return seen, iterator

    def _deadline(self) -> float:
        """When this request must be over, streaming included (`max_duration_s`)."""
        return asyncio.get_running_loop().time() + self.config.max_duration_s

    @staticmethod
    def _check(deadline: float) -> None:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError

    async def _messages(self, exchange: Exchange) -> UpstreamResponse:
        """An Anthropic Messages request served by any provider litellm knows (so Claude Code
        can run on another provider's model). Anthropic-only fields are left out."""
        assert exchange.body is not None
        litellm = import_litellm()
        request = {
            key: value
            for key, value in exchange.body.items()
            if key not in ("model", *ANTHROPIC_ONLY_FIELDS)
        }
        key = self._key(exchange)
        deadline = self._deadline()
        try:
            async with asyncio.timeout_at(deadline):
                result = await litellm.anthropic.messages.acreate(
                    model=f"{self.config.model_prefix}{exchange.model}",
                    api_base=self.config.base_url,
                    api_key=key,
                    timeout=self.config.timeout_s,
                    **request,
                )
                if exchange.stream:
                    rest, first = await self._peek(result)
        except UpstreamFailure:  # an empty stream (`_peek`)
            raise
        except Exception as exc:
            raise self._failure(exc, exchange.api) from exc
        if not exchange.stream:
            return UpstreamResponse(status=200, headers=_JSON, body=orjson.dumps(result))
        return UpstreamResponse(
            status=200,
            headers=_SSE,
            chunks=self._anthropic_events(first, rest, deadline),
            closer=_closer(result),
        )

    async def _anthropic_events(
        self, first: Any, rest: AsyncIterator[Any], deadline: float
    ) -> AsyncIterator[bytes]:
        try:
            yield _anthropic_sse(first)
            async for event in rest:
                self._check(deadline)
                yield _anthropic_sse(event)
        except Exception as exc:
            raise self._failure(exc, MESSAGES.name) from exc

    async def _events(
        self, first: Any, rest: AsyncIterator[Any], deadline: float
    ) -> AsyncIterator[bytes]:
        try:
            yield _chat_sse(first)
            async for chunk in rest:
                self._check(deadline)
                yield _chat_sse(chunk)
        except Exception as exc:
            raise self._failure(exc) from exc
        yield b"data: [DONE]\n\n"


def _chat_sse(chunk: Any) -> bytes:
    data: str = chunk.model_dump_json(exclude_none=True)
    return b"data: " + data.encode() + b"\n\n"


def _anthropic_sse(event: Any) -> bytes:
    if isinstance(event, bytes | bytearray):
        return bytes(event)
    if isinstance(event, str):
        return event.encode()
    data = event if isinstance(event, dict) else event.model_dump()
    return (
        f"event: {data.get('type', 'message')}\n".encode()
        + b"data: "
        + orjson.dumps(data)
        + b"\n\n"
    )


async def _chain(head: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield head
    async for item in rest:
        yield item


async def _close(stream: Any) -> None:
    """Close a litellm stream (its provider connection with it), if it can be closed."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


def _closer(stream: Any) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        await _close(stream)

    return close
