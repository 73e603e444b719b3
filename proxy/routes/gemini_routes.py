"""Gemini generateContent (Gemini CLI): `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent` (`?alt=sse`) and `:countTokens`. The key travels in `x-goog-api-key`
or `?key=`, both forwarded (or replaced by the upstream's configured key)."""

from __future__ import annotations

import re

from aiohttp import web

from brim.adapters.errors import InvalidRequest, UnknownEndpoint
from brim.adapters.exchange import ClientApi
from brim.policies.wires.gemini import GEMINI
from brim.proxy.keys import SERVING, FrontDoor
from brim.proxy.routes.common import checked, proxied, read_json

METHODS = ("generateContent", "streamGenerateContent", "countTokens")
# A model id as it may stand in the URL (brim's own ids too: `[cli]gemini:flash`): the path
# brim sends upstream is built from it, so it holds nothing a path is made of (`/`, which an
# escaped slash decodes to, `%`, `?`, `#`, or a leading `.`).
MODEL_ID = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9._:@\[\]-]{0,127}")


async def models(request: web.Request) -> web.StreamResponse:
    model, _, method = request.match_info["target"].rpartition(":")
    if method not in METHODS or not model:
        raise UnknownEndpoint(f"Unknown method {method[:40]!r}; brim serves {', '.join(METHODS)}.")
    if MODEL_ID.fullmatch(model) is None:
        raise InvalidRequest(
            f"The model {model[:100]!r} in the URL is not a model id (letters, digits and "
            "'.', '_', '-', ':', '@', '[', ']', at most 128).",
            param="model",
        )
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
