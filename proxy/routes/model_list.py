"""`GET /v1/models` (OpenAI's model list): the upstream's own, else the `[models]` table."""

from __future__ import annotations

from aiohttp import web

from brim.adapters.errors import UpstreamError, UpstreamFailure
from brim.proxy.keys import SERVING, FrontDoor
from brim.proxy.routes.common import make_exchange, send_direct


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
        app.router.add_get(f"{prefix}/models", door(list_models))
