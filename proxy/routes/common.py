"""What every proxied route does alike: read the body, build the exchange."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from adapters.exchange import ClientApi, Exchange
from proxy.errors import PayloadTooLarge
from proxy.keys import BRIM_KEY_HEADER, CONFIG, PIPELINE, REQUEST_ID, UPSTREAMS
from proxy.relay import relay
from proxy.wire import parse_object


async def read_json(request: web.Request) -> tuple[bytes, dict[str, Any]]:
    """The request body as sent and parsed, within `server.max_body_mb` and `max_json_depth`."""
    server = request.app[CONFIG].server
    limit = server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"The request body is {request.content_length} bytes; this brim accepts at most "
            f"{limit} bytes (server.max_body_mb)."
        )
    raw = await request.read()  # aiohttp enforces the same limit on chunked bodies
    return raw, parse_object(raw, max_depth=server.max_json_depth)


def forwardable_headers(request: web.Request) -> CIMultiDictProxy[str]:
    headers = CIMultiDict(request.headers)
    brim_key_header = request.get(BRIM_KEY_HEADER)
    if brim_key_header:
        headers.popall(brim_key_header, None)
    return CIMultiDictProxy(headers)


def make_exchange(
    request: web.Request,
    *,
    api: ClientApi,
    endpoint: str,
    model: str,
    body: dict[str, object] | None,
    raw: bytes,
    stream: bool,
    upstream: str,
) -> Exchange:
    return Exchange(
        api=api,
        method=request.method,
        endpoint=endpoint,
        query=request.query_string,
        model=model,
        body=body,
        raw=raw,
        headers=forwardable_headers(request),
        stream=stream,
        upstream=upstream,
        request_id=request[REQUEST_ID],
        user_agent=request.headers.get("User-Agent", ""),
    )


async def proxied(
    request: web.Request,
    *,
    api: ClientApi,
    endpoint: str,
    model: str,
    body: dict[str, object],
    raw: bytes,
    stream: bool = False,
    through_pipeline: bool = True,
) -> web.StreamResponse:
    """Route the request, run it through the pipeline (or straight to the upstream, for
    endpoints that only count), and relay the reply."""
    upstreams = request.app[UPSTREAMS]
    exchange = make_exchange(
        request,
        api=api,
        endpoint=endpoint,
        model=model,
        body=body,
        raw=raw,
        stream=stream,
        upstream=upstreams.route(model, api),
    )
    if through_pipeline:
        reply = await request.app[PIPELINE](exchange)
    else:
        reply = await upstreams[exchange.upstream].send(exchange)
    return await relay(request, reply, {"x-brim-request-id": exchange.request_id}, api=exchange.api)
