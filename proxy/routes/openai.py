"""OpenAI Chat Completions (`POST /v1/chat/completions`) and `GET /v1/models`."""

from __future__ import annotations

from aiohttp import web

from brim.adapters.errors import UpstreamError, UpstreamFailure
from brim.policies.wires.chat import CHAT
from brim.policies.wires.responses import RESPONSES
from brim.proxy.keys import SERVING, FrontDoor
from brim.proxy.routes.common import checked, make_exchange, proxied, read_json, send_direct


async def chat_completions(request: web.Request) -> web.StreamResponse:
    serving = request[SERVING]
    raw, body = await read_json(request, serving)
    facts = checked(CHAT.check, body)
    return await proxied(
        request,
        serving,
        api=CHAT.name,
        endpoint="/chat/completions",
        model=facts.model or "",
        body=body,
        raw=raw,
        stream=facts.stream,
    )


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI Responses (Codex CLI). With `previous_response_id` the provider holds the earlier
    turns: brim counts and guards only what the request itself carries."""
    serving = request[SERVING]
    raw, body = await read_json(request, serving)
    facts = checked(RESPONSES.check, body)
    return await proxied(
        request,
        serving,
        api=RESPONSES.name,
        endpoint="/responses",
        model=facts.model or "",
        body=body,
        raw=raw,
        stream=facts.stream,
    )


async def input_tokens(request: web.Request) -> web.StreamResponse:
    """Forwarded: the provider's own count of a Responses request."""
    serving = request[SERVING]
    raw, body = await read_json(request, serving)
    facts = checked(RESPONSES.check, body)
    return await proxied(
        request,
        serving,
        api="openai.input_tokens",
        endpoint="/responses/input_tokens",
        model=facts.model or "",
        body=body,
        raw=raw,
        through_pipeline=False,
    )


def _configured_models(request: web.Request) -> web.Response:
    data = [
        {"id": model_id, "object": "model", "created": 0, "owned_by": "brim"}
        for model_id in request[SERVING].config.models
    ]
    return web.json_response({"object": "list", "data": data})


async def list_models(request: web.Request) -> web.StreamResponse:
    """The upstream's own list; the `[models]` table when no upstream can give one."""
    serving = request[SERVING]
    upstreams = serving.upstreams
    name = upstreams.first_serving("openai.models")
    if name is None:
        return _configured_models(request)
    exchange = make_exchange(
        request,
        serving,
        api="openai.models",
        endpoint="/models",
        model="",
        body=None,
        raw=b"",
        stream=False,
        upstream=name,
    )
    try:
        return await send_direct(request, serving, exchange)
    except UpstreamError:
        raise
    except UpstreamFailure:
        if request[SERVING].config.models:
            return _configured_models(request)
        raise


def add_routes(app: web.Application, door: FrontDoor) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/chat/completions", door(chat_completions))
        app.router.add_get(f"{prefix}/models", door(list_models))
        app.router.add_post(f"{prefix}/responses", door(responses))
        app.router.add_post(f"{prefix}/responses/input_tokens", door(input_tokens))
