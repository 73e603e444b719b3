"""What every proxied route does alike: read and check the body, build the exchange, run it,
and relay the reply with brim's headers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import BrimError, InvalidRequest, PayloadTooLarge
from brim.adapters.exchange import ClientApi, Exchange
from brim.middleware.services.reply_headers import brim_headers
from brim.policies.duplicates import repeated_key
from brim.policies.nesting import nests_deeper_than
from brim.policies.wires.base import BodyError, RequestFacts
from brim.proxy.admission import quota_for, read_body
from brim.proxy.edge import check_json_body
from brim.proxy.keys import BRIM_KEY_HEADER, BRIM_KEY_OWNER, REQUEST_ID, Serving
from brim.proxy.relay import relay


def parse_object(raw: bytes, *, max_depth: int) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {type(value).__name__}.")
    # A value nests no deeper than it has brackets (counted in C, strings' own included); only
    # a body with more than `max_depth` of them needs the walk.
    brackets = raw.count(b"{") + raw.count(b"[")
    if brackets > max_depth and nests_deeper_than(value, max_depth):
        raise InvalidRequest(
            f"The request body nests objects and arrays more than {max_depth} levels deep "
            "(brim's depth limit, server.max_json_depth)."
        )
    if (key := repeated_key(raw, value)) is not None:
        raise InvalidRequest(
            f"The request body repeats the key {key[:100]!r} within one object; brim refuses "
            "repeated keys, which parsers read differently."
        )
    return value


async def read_json(request: web.Request, serving: Serving) -> tuple[bytes, dict[str, Any]]:
    """The request body as sent (decoded, if it was compressed) and parsed: JSON only, within
    `server.max_body_mb` and `max_json_depth`, no key repeated within an object."""
    check_json_body(request)
    limit = serving.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"The request body is {request.content_length} bytes; this brim accepts at most "
            f"{limit} bytes (server.max_body_mb)."
        )
    # within body_timeout_s and max_body_buffer_mb
    raw = await read_body(request, limit, serving.admission)
    return raw, parse_object(raw, max_depth=serving.max_json_depth)


def checked(check: Callable[[dict[str, Any]], RequestFacts], body: dict[str, Any]) -> RequestFacts:
    """A body check (a wire's `check`, or another of its endpoints'), failing as the client's
    own API would (field named)."""
    try:
        return check(body)
    except BodyError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from None


def forwardable_headers(request: web.Request, keyed: bool) -> CIMultiDictProxy[str]:
    """The client's headers, without the one that carried its brim key (`check_brim_key` names
    it). Without keys configured (`keyed`), the request's own (read-only) headers, not a copy."""
    if not keyed:
        return request.headers
    brim_key_header = request.get(BRIM_KEY_HEADER)
    if not brim_key_header:
        return request.headers
    headers = CIMultiDict(request.headers)
    headers.popall(brim_key_header, None)
    return CIMultiDictProxy(headers)


def make_exchange(
    request: web.Request,
    serving: Serving,
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
        headers=forwardable_headers(request, serving.keyed),
        stream=stream,
        upstream=upstream,
        request_id=request[REQUEST_ID],
        user_agent=request.headers.get("User-Agent", ""),
        owner=request.get(BRIM_KEY_OWNER) or serving.owners.of_credentials(request),
        addressed=upstream,  # the one upstream the client's own credentials may go to
        quota=quota_for(request, serving.config.server, serving.admission),
    )


async def send_direct(
    request: web.Request, serving: Serving, exchange: Exchange
) -> web.StreamResponse:
    """Straight to the upstream, past the pipeline (model lists, token counts)."""
    reply = await serving.upstreams[exchange.upstream].send(exchange)
    return await relay(request, reply, request_id_header(exchange), wire=exchange.wire)


def request_id_header(exchange: Exchange) -> dict[str, str]:
    return {"x-brim-request-id": exchange.request_id}


async def proxied(
    request: web.Request,
    serving: Serving,
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
    endpoints that only count), and relay the reply with brim's headers."""
    exchange = make_exchange(
        request,
        serving,
        api=api,
        endpoint=endpoint,
        model=model,
        body=body,
        raw=raw,
        stream=stream,
        upstream=serving.upstreams.route(model, api),
    )
    if not through_pipeline:
        return await send_direct(request, serving, exchange)
    warn_at = serving.warn_at
    try:
        reply: UpstreamResponse = await serving.pipeline(exchange)
    except BrimError as error:
        error.brim_headers.update(await brim_headers(exchange.report, warn_at=warn_at))
        raise
    headers = await brim_headers(exchange.report, warn_at=warn_at)  # a dict of its own
    headers["x-brim-request-id"] = exchange.request_id  # as `request_id_header`
    return await relay(request, reply, headers, wire=exchange.wire)
