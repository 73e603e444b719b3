"""The adapter interface: one method that turns an `Exchange` into an `UpstreamResponse`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from brim.adapters.exchange import Exchange
from brim.policies.wires.base import Usage

# Work on a request body larger than this (serializing it, say) runs in a worker thread rather
# than on the event loop, where it would hold up every other request.
OFF_LOOP_BYTES = 256 * 1024


@dataclass(slots=True)
class Reported:
    """What a reply says of itself: the usage its provider reported and the model that
    answered (None where it does not say), as the stage that read it found them
    (`middleware.services.usage`); a stream's are complete once it has passed to its end. The stages
    outside take them from here rather than read the reply again."""

    usage: Usage | None = None
    model: str | None = None


@dataclass(slots=True)
class UpstreamResponse:
    """A provider's successful reply: a complete `body`, or `chunks` relayed as they arrive.

    Whoever receives a streaming response must `aclose()` it, also when the client goes away
    early: that closes the provider connection instead of reading the stream to its end.
    """

    status: int
    headers: Mapping[str, str]
    body: bytes | None = None
    payload: Any = None  # `body` parsed, where the adapter parsed it (so no one parses it again)
    chunks: AsyncIterator[bytes] | None = None
    closer: Callable[[], Awaitable[None]] | None = None
    # What the reply says of itself, where a stage read it as it passed (this very reply: a
    # stage that makes another reply of it, as restore rounds do, leaves this None).
    reported: Reported | None = None

    async def aclose(self) -> None:
        chunks, self.chunks = self.chunks, None
        if chunks is not None and hasattr(chunks, "aclose"):
            await chunks.aclose()
        if self.closer is not None:
            closer, self.closer = self.closer, None
            await closer()


class Adapter(Protocol):
    """A provider connection. `send` raises only `adapters.errors` exceptions."""

    name: str

    async def send(self, exchange: Exchange) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class NativeCounter(Protocol):
    """An adapter that can ask its provider how many input tokens a request has (Anthropic's
    `count_tokens`, Gemini's `countTokens`), with the request's own credentials. Raises the
    `adapters.errors` failures `send` raises, or `UpstreamProtocolError` for a reply without a
    count; the caller sets the deadline."""

    async def count_tokens(self, exchange: Exchange) -> int: ...
