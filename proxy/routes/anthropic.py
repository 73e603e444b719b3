"""Anthropic Messages (`POST /v1/messages`) and `POST /v1/messages/count_tokens`.

Claude Code and the Anthropic SDKs speak this API. Errors on these paths are in Anthropic's shape
(`policies.wires.messages`), so a refusal reads "prompt is too long: N tokens > M maximum".
"""

from __future__ import annotations

import orjson
from aiohttp import web

from brim.adapters.errors import UpstreamError
from brim.policies.wires.messages import MESSAGES, check_count_tokens
from brim.proxy.keys import SERVING, FrontDoor
from brim.proxy.routes.common import (
    checked,
    make_exchange,
    proxied,
    read_json,
    request_id_header,
    send_direct,
)


async def messages(request: web.Request) -> web.StreamResponse:
    serving = request[SERVING]
    raw, body = await read_json(request, serving)
    facts = checked(MESSAGES.check, body)
    return await proxied(
        request,
        serving,
        api=MESSAGES.name,
        endpoint="/v1/messages",
        model=facts.model or "",
        body=body,
        raw=raw,
        stream=facts.stream,
    )


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """The upstream's own count; brim's count where the upstream has no such endpoint."""
    serving = request[SERVING]
    raw, body = await read_json(request, serving)
    model = checked(check_count_tokens, body).model or ""
    upstreams = serving.upstreams
    name = upstreams.route(model, "anthropic.count_tokens")
    exchange = make_exchange(
        request,
        serving,
        api="anthropic.count_tokens",
        endpoint="/v1/messages/count_tokens",
        model=model,
        body=body,
        raw=raw,
        stream=False,
        upstream=name,
    )
    if upstreams.configs[name].api == "anthropic":
        try:
            return await send_direct(request, serving, exchange)
        except UpstreamError as error:
            if error.status not in (404, 405):
                raise
    services = serving.services
    limits = services.limits.resolve(model, long_context=exchange.long_context).limits
    # at the ratio the guard would count this client's request at (`TokenRatios.ratio`)
    prior = services.counter.prior(limits.tokenizer)
    ratio = services.ratios.ratio(exchange.owner, name, limits.model, prior)
    total = services.counter.request(MESSAGES, body, limits.tokenizer, model, ratio).total
    return web.Response(
        body=orjson.dumps({"input_tokens": total}),
        content_type="application/json",
        headers={**request_id_header(exchange), "x-brim-counted-by": "brim"},
    )


def add_routes(app: web.Application, door: FrontDoor) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/messages", door(messages))
        app.router.add_post(f"{prefix}/messages/count_tokens", door(count_tokens))
