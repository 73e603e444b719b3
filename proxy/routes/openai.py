"""OpenAI Chat Completions (`POST /v1/chat/completions`) and `GET /v1/models`."""

from __future__ import annotations

from aiohttp import web

from adapters.errors import UpstreamError, UpstreamFailure
from proxy.keys import CONFIG, PIPELINE, UPSTREAMS
from proxy.relay import relay
from proxy.routes.common import make_exchange, read_body
from proxy.wire import check_chat, check_responses, parse_object


async def chat_completions(request: web.Request) -> web.StreamResponse:
    raw = await read_body(request)
    body = parse_object(raw)
    chat = check_chat(body)
    upstream = request.app[UPSTREAMS].route(chat.model, "openai.chat")
    exchange = make_exchange(
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


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI Responses (Codex CLI). With `previous_response_id` the provider holds the earlier
    turns: brim counts and guards only what the request itself carries."""
    raw = await read_body(request)
    body = parse_object(raw)
    checked = check_responses(body)
    upstream = request.app[UPSTREAMS].route(checked.model, "openai.responses")
    exchange = make_exchange(
        request,
        api="openai.responses",
        endpoint="/responses",
        model=checked.model,
        body=body,
        raw=raw,
        stream=bool(checked.stream),
        upstream=upstream,
    )
    reply = await request.app[PIPELINE](exchange)
    return await relay(request, reply, {"x-brim-request-id": exchange.request_id})


async def input_tokens(request: web.Request) -> web.StreamResponse:
    """Forwarded: the provider's own count of a Responses request."""
    raw = await read_body(request)
    body = parse_object(raw)
    checked = check_responses(body)
    upstreams = request.app[UPSTREAMS]
    name = upstreams.route(checked.model, "openai.input_tokens")
    exchange = make_exchange(
        request,
        api="openai.input_tokens",
        endpoint="/responses/input_tokens",
        model=checked.model,
        body=body,
        raw=raw,
        stream=False,
        upstream=name,
    )
    reply = await upstreams[name].send(exchange)
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
    exchange = make_exchange(
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
        app.router.add_post(f"{prefix}/responses", responses)
        app.router.add_post(f"{prefix}/responses/input_tokens", input_tokens)
