"""Gemini generateContent (Gemini CLI): `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent` (`?alt=sse`) and `:countTokens`. The key travels in `x-goog-api-key`
or `?key=`, both forwarded (or replaced by the upstream's configured key)."""

from __future__ import annotations

from aiohttp import web

from adapters.errors import UnknownEndpoint
from adapters.exchange import ClientApi
from policies.wires.gemini import GEMINI
from proxy.keys import SERVING, FrontDoor
from proxy.routes.common import checked, proxied, read_json

METHODS = ("generateContent", "streamGenerateContent", "countTokens")


async def models(request: web.Request) -> web.StreamResponse:
    model, _, method = request.match_info["target"].rpartition(":")
    if method not in METHODS or not model:
        raise UnknownEndpoint(f"Unknown method {method!r}; brim serves {', '.join(METHODS)}.")
    serving = request[SERVING]
    raw, body = await read_json(request, serving)
    checked(GEMINI.check, body)
    api: ClientApi = "gemini.count_tokens" if method == "countTokens" else GEMINI.name
    return await proxied(
        request,
        serving,
        api=api,
        endpoint=f"/v1beta/models/{model}:{method}",
        model=model,
        body=body,
        raw=raw,
        stream=method == "streamGenerateContent",
        through_pipeline=api == GEMINI.name,
    )


def add_routes(app: web.Application, door: FrontDoor) -> None:
    app.router.add_post("/v1beta/models/{target}", door(models))
    app.router.add_post("/v1/models/{target}", door(models))
