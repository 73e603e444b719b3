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
    UpstreamFailure,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from adapters.exchange import Exchange
from adapters.headers import upstream_request_headers

MAX_ERROR_BODY = 1024 * 1024


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
                trust_env=True,
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
                raise UpstreamHTTPError.from_reply(
                    upstream=self.name,
                    status=response.status,
                    headers=response.headers,
                    body=body,
                )
            if response.content_type == "text/event-stream":
                return UpstreamResponse(
                    status=response.status,
                    headers=response.headers,
                    chunks=self._relay(response),
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

    async def _relay(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
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
