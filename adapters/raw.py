"""Same-format forwarding: the request goes to the provider as bytes, the reply comes back as bytes.

No SDK and no translation. One pooled `aiohttp.ClientSession` per upstream, opened on first use
and closed by `aclose()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from brim.adapters.adapter import OFF_LOOP_BYTES, UpstreamResponse
from brim.adapters.credentials import without_key
from brim.adapters.errors import (
    ContextOverflow,
    UpstreamError,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
    past_max_duration,
)
from brim.adapters.exchange import Exchange
from brim.adapters.forwarded_headers import upstream_request_headers
from brim.adapters.native import native_count_for
from brim.adapters.overflow import Overflow, classify
from brim.adapters.upstream_config import UpstreamConfig

log = logging.getLogger("brim.upstream")

MAX_ERROR_BODY = 1024 * 1024
MAX_PEEK = 256 * 1024
# The statuses of a reply that is an answer rather than a refusal: `send` relays anything below
# 400 (a redirect included, as it came); a token count is only ever a 2xx.
RELAYED = range(100, 400)
COUNTED = range(200, 300)


# Events that open a stream before anything happens (OpenAI Responses); an error comes after them.
PREAMBLE = (b'"response.created"', b'"response.in_progress"', b'"response.queued"')


def _opens_stream(head: bytes) -> bool:
    # Every preamble event names a `"response.…"` type: most streams' first event need not be
    # searched for each of them.
    return b'"response.' in head and any(marker in head for marker in PREAMBLE)


def _reason(exc: BaseException) -> str:
    """What went wrong on the way to an upstream, in words that name no address (aiohttp's own
    name the host and port)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate was not accepted"
    if isinstance(exc, aiohttp.ClientConnectorSSLError | aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name could not be resolved"
    if isinstance(exc, aiohttp.ClientConnectorError):
        errno = exc.os_error.errno  # its strerror may name the address ("Connect call failed…")
        return os.strerror(errno).lower() if errno else "the connection failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the reply ended before its end"
    return str(exc) or type(exc).__name__  # the failure hides any address left in it


def first_event_data(stream: bytes) -> bytes | None:
    """The data of the first complete server-sent event that has any (past a preamble)."""
    text = stream.replace(b"\r\n", b"\n")
    while b"\n\n" in text:
        event, _, text = text.partition(b"\n\n")
        data = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if data and not _opens_stream(data[0][:80]):
            return b"\n".join(data)
    return None


def first_event(stream: bytes) -> tuple[bytes, Overflow | None] | None:
    """The stream's first complete event with data (`first_event_data`), with the context
    overflow it reports if it is an error event that says so; None while no such event has
    arrived whole."""
    data = first_event_data(stream)
    if data is None:
        return None
    return data, classify(200, data) if is_error_event(stream, data) else None


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
                    total=self.config.max_duration_s,  # per request, its body or stream included
                    sock_connect=self.config.connect_timeout_s,
                    sock_read=self.config.timeout_s,
                ),
                auto_decompress=True,
                trust_env=self.config.proxy_from_env,
                # Every client's requests share this session: a cookie a provider (its CDN) sets
                # goes back to the client it answered, never out with another client's request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _failure(self, exc: BaseException, *, answered: bool) -> UpstreamFailure:
        """The documented failure for a transport error; `answered`: the headers had arrived.
        The client is told the upstream's name and what went wrong; its address goes to the
        log only."""
        name, config = self.name, self.config
        log.warning("upstream %r at %s: %s: %s", name, self.base_url, type(exc).__name__, exc)
        # aiohttp raises ConnectionTimeoutError for sock_connect, SocketTimeoutError (both
        # ServerTimeoutError) for sock_read, and a plain TimeoutError when `total` runs out.
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return UpstreamTimeout(
                f"upstream {name!r} could not be connected to within connect_timeout_s "
                f"({config.connect_timeout_s:g} s)",
                upstream=name,
            )
        if isinstance(exc, aiohttp.ServerTimeoutError):
            waited = "sent no next chunk" if answered else "did not answer"
            return UpstreamTimeout(
                f"upstream {name!r} {waited} within timeout_s ({config.timeout_s:g} s)",
                upstream=name,
            )
        if isinstance(exc, TimeoutError):
            return past_max_duration(name, config.max_duration_s)
        if answered or isinstance(
            exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError
        ):
            return UpstreamProtocolError(
                f"upstream {name!r} broke off its reply: {_reason(exc)}", upstream=name
            )
        return UpstreamUnreachable(
            f"upstream {name!r} is unreachable: {_reason(exc)}", upstream=name
        )

    def _not_json(self, response: aiohttp.ClientResponse, body: bytes) -> UpstreamProtocolError:
        """A 2xx reply that should be JSON and is not. Names what came, never what it said: a
        body may hold the user's content."""
        kind = response.content_type if "Content-Type" in response.headers else "no content type"
        hint = "; is base_url right?" if kind in ("text/html", "application/xhtml+xml") else ""
        return UpstreamProtocolError(
            f"upstream {self.name!r} answered HTTP {response.status} with a body that is not "
            f"JSON ({kind}, {len(body)} bytes){hint}",
            upstream=self.name,
        )

    async def _open(
        self, method: str, url: str, data: bytes | None, headers: CIMultiDict[str], ok: range
    ) -> aiohttp.ClientResponse:
        """The provider's reply, up to its headers, when its status is in `ok`. Raises the
        documented failure for a transport error, or the `UpstreamError` that a reply with
        another status stands for (read from at most `MAX_ERROR_BODY` of its body, then
        closed)."""
        try:
            response = await self._client().request(
                method, url, data=data, headers=headers, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failure(exc, answered=False) from exc
        if response.status not in ok:
            with self._reading(response):
                body = await response.content.read(MAX_ERROR_BODY)
                raise UpstreamError.from_reply(
                    upstream=self.name, status=response.status, headers=response.headers, body=body
                )
        return response

    @contextlib.contextmanager
    def _reading(self, response: aiohttp.ClientResponse) -> Iterator[None]:
        """While a reply is read: a transport error is the documented failure of a reply broken
        off (its headers had arrived), and any error closes the reply."""
        try:
            yield
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            response.close()
            raise self._failure(exc, answered=True) from exc
        except BaseException:
            response.close()
            raise

    async def _body(self, response: aiohttp.ClientResponse) -> bytes:
        """A reply's whole body; the connection goes back to the pool."""
        with self._reading(response):
            body = await response.read()
        response.release()
        return body

    def _parsed(self, response: aiohttp.ClientResponse, body: bytes) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise self._not_json(response, body) from None

    def _credentials(self, exchange: Exchange, query: str) -> tuple[CIMultiDict[str], str]:
        """The headers and query string `exchange` goes out with: the client's credentials only
        to the upstream it addressed, and there only where this upstream has no key of its own
        (then the configured key instead, and no client `key=` in the query)."""
        addressed = exchange.addressed == self.name
        headers = upstream_request_headers(
            exchange.headers, api=self.config.api, api_key=self._api_key, addressed=addressed
        )
        if self._api_key is not None or not addressed:
            query = without_key(query)
        return headers, query

    async def send(self, exchange: Exchange) -> UpstreamResponse:
        headers, query = self._credentials(exchange, exchange.query)
        url = f"{self.base_url}{exchange.endpoint}"
        if query:
            url = f"{url}?{query}"
        data = exchange.raw if exchange.method != "GET" else None
        response = await self._open(exchange.method, url, data, headers, RELAYED)
        if response.content_type == "text/event-stream":
            with self._reading(response):
                peeked = await self._until_first_event(response)
            return UpstreamResponse(
                status=response.status,
                headers=response.headers,
                chunks=self._relay(response, peeked),
                closer=_closer(response),
            )
        body = await self._body(response)
        payload = None
        if _should_be_json(response, exchange, body):
            payload = self._parsed(response, body)
        return UpstreamResponse(
            status=response.status, headers=response.headers, body=body, payload=payload
        )

    async def count_tokens(self, exchange: Exchange) -> int:
        """The provider's own count of the request's input tokens (`NativeCounter`), asked with
        the client's own headers and credentials as `send` would forward them (`_credentials`).
        Only for a request its counter counts (`adapters.native.native_count_for`, which the
        caller asks first): any other is a ValueError."""
        native = native_count_for(self.config.api, exchange)
        if native is None:
            raise ValueError(f"upstream {self.name!r} has no token counter for {exchange.api}")
        url = f"{self.base_url}{native.path(exchange.endpoint)}"
        query = "&".join(p for p in exchange.query.split("&") if p and not p.startswith("alt="))
        headers, query = self._credentials(exchange, query)
        if query:
            url = f"{url}?{query}"
        headers["Content-Type"] = "application/json"
        headers["Accept"] = "application/json"
        request = native.body(exchange)
        if len(exchange.raw) > OFF_LOOP_BYTES:
            data = await asyncio.to_thread(orjson.dumps, request)
        else:
            data = orjson.dumps(request)
        response = await self._open("POST", url, data, headers, COUNTED)
        answer = self._parsed(response, await self._body(response))
        count = answer.get(native.answer) if isinstance(answer, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise UpstreamProtocolError(
                f"upstream {self.name!r} answered a token count without `{native.answer}`",
                upstream=self.name,
            )
        return count

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
            first = first_event(seen)
            if first is None:
                continue
            _, overflow = first
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
                overflow=Overflow(message="the provider sent an empty stream", empty_stream=True),
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
            raise self._failure(exc, answered=True) from exc
        finally:
            response.close()


SSE_FIELDS = (b"data:", b"event:", b":", b"id:", b"retry:")


def _should_be_json(response: aiohttp.ClientResponse, exchange: Exchange, body: bytes) -> bool:
    """Every endpoint brim forwards to answers a success with JSON (chat, responses, messages,
    token counts, generateContent, models). Exceptions: a reply without a body, and a stream
    asked for and sent under the wrong content type (it still reads as a stream)."""
    if not 200 <= response.status < 300 or response.status in (204, 205):
        return False
    if exchange.method == "HEAD" and not body:
        return False
    return not (exchange.stream and body.lstrip().startswith(SSE_FIELDS))


def _closer(response: aiohttp.ClientResponse) -> Callable[[], Awaitable[None]]:
    async def close() -> None:  # closes the connection rather than draining the stream
        response.close()

    return close
