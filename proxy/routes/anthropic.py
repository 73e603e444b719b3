"""Anthropic Messages (`POST /v1/messages`) and `POST /v1/messages/count_tokens`.

Claude Code and the Anthropic SDKs speak this API. Errors on these paths are in Anthropic's shape
(`proxy.app.wire_of`), so a refusal reads "prompt is too long: N tokens > M maximum".
"""

from __future__ import annotations

from typing import Final

import orjson
from aiohttp import web

from adapters.errors import UpstreamError
from proxy.keys import SERVICES, UPSTREAMS
from proxy.relay import relay
from proxy.routes.common import make_exchange, proxied, read_json
from proxy.wire import check_messages

MESSAGES: Final = "anthropic.messages"


async def messages(request: web.Request) -> web.StreamResponse:
    raw, body = await read_json(request)
    checked = check_messages(body)
    return await proxied(
        request,
        api=MESSAGES,
        endpoint="/v1/messages",
        model=checked.model,
        body=body,
        raw=raw,
        stream=bool(checked.stream),
    )


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """The upstream's own count; brim's count where the upstream has no such endpoint."""
    raw, body = await read_json(request)
    checked = check_messages(body, counting=True)
    upstreams = request.app[UPSTREAMS]
    name = upstreams.route(checked.model, "anthropic.count_tokens")
    exchange = make_exchange(
        request,
        api="anthropic.count_tokens",
        endpoint="/v1/messages/count_tokens",
        model=checked.model,
        body=body,
        raw=raw,
        stream=False,
        upstream=name,
    )
    if upstreams.configs[name].api == "anthropic":
        try:
            reply = await upstreams[name].send(exchange)
            return await relay(
                request, reply, {"x-brim-request-id": exchange.request_id}, api=exchange.api
            )
        except UpstreamError as error:
            if error.status not in (404, 405):
                raise
    services = request.app[SERVICES]
    limits = services.limits.resolve(checked.model).limits
    total = services.counter.messages_request(body, limits.tokenizer, checked.model).total
    return web.Response(
        body=orjson.dumps({"input_tokens": total}),
        content_type="application/json",
        headers={"x-brim-request-id": exchange.request_id, "x-brim-counted-by": "brim"},
    )


def add_routes(app: web.Application) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/messages", messages)
        app.router.add_post(f"{prefix}/messages/count_tokens", count_tokens)
