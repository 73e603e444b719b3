"""Gemini generateContent (Gemini CLI): `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent` (`?alt=sse`) and `:countTokens`. The key travels in `x-goog-api-key`
or `?key=`, both forwarded (or replaced by the upstream's configured key)."""

from __future__ import annotations

from aiohttp import web

from adapters.exchange import ClientApi
from proxy.errors import UnknownEndpoint
from proxy.routes.common import proxied, read_json
from proxy.wire import check_gemini

METHODS = ("generateContent", "streamGenerateContent", "countTokens")


async def models(request: web.Request) -> web.StreamResponse:
    model, _, method = request.match_info["target"].rpartition(":")
    if method not in METHODS or not model:
        raise UnknownEndpoint(f"Unknown method {method!r}; brim serves {', '.join(METHODS)}.")
    raw, body = await read_json(request)
    check_gemini(body)
    api: ClientApi = "gemini.count_tokens" if method == "countTokens" else "gemini.generate"
    return await proxied(
        request,
        api=api,
        endpoint=f"/v1beta/models/{model}:{method}",
        model=model,
        body=body,
        raw=raw,
        stream=method == "streamGenerateContent",
        through_pipeline=api == "gemini.generate",
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1beta/models/{target}", models)
    app.router.add_post("/v1/models/{target}", models)
