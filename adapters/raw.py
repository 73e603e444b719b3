"""Same-format forwarding: the request goes to the provider as bytes, the reply comes back as bytes.

No SDK and no translation. One pooled `aiohttp.ClientSession` per upstream, opened on first use
and closed by `aclose()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp

from adapters.base import UpstreamResponse
from adapters.config import UpstreamConfig
from adapters.errors import (
    ContextOverflow,
    UpstreamError,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from adapters.exchange import Exchange
from adapters.headers import upstream_request_headers
from adapters.overflow import Overflow, classify

MAX_ERROR_BODY = 1024 * 1024
MAX_PEEK = 256 * 1024


# Events that open a stream before anything happens (OpenAI Responses); an error comes after them.
PREAMBLE = (b'"response.created"', b'"response.in_progress"', b'"response.queued"')


def first_event_data(stream: bytes) -> bytes | None:
    """The data of the first complete server-sent event that has any (past a preamble)."""
    text = stream.replace(b"\r\n", b"\n")
    while b"\n\n" in text:
        event, _, text = text.partition(b"\n\n")
        data = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if data and not any(marker in data[0][:80] for marker in PREAMBLE):
            return b"\n".join(data)
    return None


def is_error_event(stream: bytes, data: bytes) -> bool:
    head = stream.replace(b"\r\n", b"\n").split(b"\n\n", 1)[0]
    if b"event: error" in head or b"event:error" in head:
        return True
    stripped = data.lstrip()
    if b'"response.failed"' in stripped[:80]:
        return True
    return stripped.startswith(b"{") and (
        b'"error"' in stripped[:200] or b'"type":"error"' in stripped[:40]
    )


class RawHttpAdapter:
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        if config.base_url is None:
            raise ValueError(f"upstream {name!r}: base_url is required")
        self.name = name
        self.config = config
        self.base_url = config.base_url
        self._api_key = config.api_key.get_secret_value() if config.api_key else None
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.config.connect_timeout_s,
                    sock_read=self.config.timeout_s,
                ),
                auto_decompress=True,
                trust_env=self.config.proxy_from_env,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _failure(self, exc: BaseException) -> UpstreamFailure:
        if isinstance(exc, asyncio.TimeoutError):
            return UpstreamTimeout(
                f"upstream {self.name!r} did not answer within {self.config.timeout_s:g} s",
                upstream=self.name,
            )
        if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
            return UpstreamProtocolError(
                f"upstream {self.name!r} broke off its reply: {exc}", upstream=self.name
            )
        return UpstreamUnreachable(
            f"upstream {self.name!r} is unreachable: {exc or type(exc).__name__}",
            upstream=self.name,
        )

    async def send(self, exchange: Exchange) -> UpstreamResponse:
        url = f"{self.base_url}{exchange.endpoint}"
        if exchange.query:
            url = f"{url}?{exchange.query}"
        headers = upstream_request_headers(
            exchange.headers, api=self.config.api, api_key=self._api_key
        )
        data = exchange.raw if exchange.method != "GET" else None
        try:
            response = await self._client().request(
                exchange.method, url, data=data, headers=headers, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failure(exc) from exc

        try:
            if response.status >= 400:
                body = await response.content.read(MAX_ERROR_BODY)
                raise UpstreamError.from_reply(
                    upstream=self.name,
                    status=response.status,
                    headers=response.headers,
                    body=body,
                )
            if response.content_type == "text/event-stream":
                peeked = await self._until_first_event(response)
                return UpstreamResponse(
                    status=response.status,
                    headers=response.headers,
                    chunks=self._relay(response, peeked),
                    closer=_closer(response),
                )
            body = await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            response.close()
            raise self._failure(exc) from exc
        except BaseException:
            response.close()
            raise
        response.release()
        return UpstreamResponse(status=response.status, headers=response.headers, body=body)

    async def _until_first_event(self, response: aiohttp.ClientResponse) -> list[bytes]:
        """Read a 200 stream up to its first event with data. Some providers report a context
        overflow there (or send an empty stream) instead of an error status; that must become a
        `ContextOverflow` before the client is told 200. Returns the bytes read, to replay."""
        peeked: list[bytes] = []
        seen = b""
        while len(seen) <= MAX_PEEK:
            chunk = await response.content.readany()
            if not chunk:
                break
            peeked.append(chunk)
            seen += chunk
            first = first_event_data(seen)
            if first is None:
                continue
            overflow = classify(200, first) if is_error_event(seen, first) else None
            if overflow is not None:
                response.close()
                raise ContextOverflow(
                    upstream=self.name,
                    status=response.status,
                    headers=response.headers,
                    body=seen,
                    overflow=overflow,
                )
            return peeked
        if not seen.strip() or first_event_data(seen + b"\n\n") is None:
            raise ContextOverflow(
                upstream=self.name,
                status=response.status,
                headers=response.headers,
                body=seen,
                overflow=Overflow(message="the provider sent an empty stream"),
            )
        return peeked

    async def _relay(
        self, response: aiohttp.ClientResponse, peeked: list[bytes]
    ) -> AsyncIterator[bytes]:
        try:
            for chunk in peeked:
                yield chunk
            async for chunk in response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failure(exc) from exc
        finally:
            response.close()


def _closer(response: aiohttp.ClientResponse) -> Callable[[], Awaitable[None]]:
    async def close() -> None:  # closes the connection rather than draining the stream
        response.close()

    return close
