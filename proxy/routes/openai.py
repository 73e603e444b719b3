"""OpenAI Chat Completions (`POST /v1/chat/completions`) and `GET /v1/models`."""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from adapters.errors import UpstreamError, UpstreamFailure
from adapters.exchange import ClientApi, Exchange
from proxy.errors import PayloadTooLarge
from proxy.keys import BRIM_KEY_HEADER, CONFIG, PIPELINE, REQUEST_ID, UPSTREAMS
from proxy.relay import relay
from proxy.wire import check_chat, parse_object


async def read_body(request: web.Request) -> bytes:
    limit = request.app[CONFIG].server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"The request body is {request.content_length} bytes; this brim accepts at most "
            f"{limit} bytes (server.max_body_mb)."
        )
    return await request.read()  # aiohttp enforces the same limit on chunked bodies


def forwardable_headers(request: web.Request) -> CIMultiDictProxy[str]:
    headers = CIMultiDict(request.headers)
    brim_key_header = request.get(BRIM_KEY_HEADER)
    if brim_key_header:
        headers.popall(brim_key_header, None)
    return CIMultiDictProxy(headers)


def _exchange(
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


async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw = await read_body(request)
    body = parse_object(raw)
    chat = check_chat(body)
    upstream = request.app[UPSTREAMS].route(chat.model, "openai.chat")
    exchange = _exchange(
        request,
        api="openai.chat",
        endpoint="/chat/completions",
        model=chat.model,
        body=body,
        raw=raw,
        stream=bool(chat.stream),
        upstream=upstream,
    )
    reply = await request.app[PIPELINE](exchange)
    return await relay(request, reply, {"x-brim-request-id": exchange.request_id})


def _configured_models(request: web.Request) -> web.Response:
    data = [
        {"id": model_id, "object": "model", "created": 0, "owned_by": "brim"}
        for model_id in request.app[CONFIG].models
    ]
    return web.json_response({"object": "list", "data": data})


async def list_models(request: web.Request) -> web.StreamResponse:
    """The upstream's own list; the `[models]` table when no upstream can give one."""
    upstreams = request.app[UPSTREAMS]
    name = upstreams.first_serving("openai.models")
    if name is None:
        return _configured_models(request)
    exchange = _exchange(
        request,
        api="openai.models",
        endpoint="/models",
        model="",
        body=None,
        raw=b"",
        stream=False,
        upstream=name,
    )
    try:
        reply = await upstreams[name].send(exchange)
    except UpstreamError:
        raise
    except UpstreamFailure:
        if request.app[CONFIG].models:
            return _configured_models(request)
        raise
    return await relay(request, reply, {"x-brim-request-id": exchange.request_id})


def add_routes(app: web.Application) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/chat/completions", chat_completions)
        app.router.add_get(f"{prefix}/models", list_models)
