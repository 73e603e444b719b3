"""The four wire APIs' routes, generated from the wire registry (`policies.wires.WIRES`): every
path a wire lists (`Wire.routes`) is served by one conversation handler, which asks the wire what
the URL targets (`Wire.target`), checks the body as the API would and proxies it — through the
pipeline for the conversation endpoint, straight to the upstream for the others (token counts).
Errors on a wire's paths are in its own shape (`Wire.owns_path`).

Anthropic's `POST /v1/messages/count_tokens` has a handler of its own: where the upstream has no
such endpoint, brim answers with its own count.
"""

from __future__ import annotations

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from brim.adapters.errors import InvalidRequest, UnknownEndpoint, UpstreamError
from brim.middleware.stages.resolve_limits import counting_ratio
from brim.policies.wires import WIRES
from brim.policies.wires.base import BodyError, NotServed, Wire
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


def conversation_route(wire: Wire, route: str) -> Handler:
    """The handler of `route`, one of `wire.routes`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            target = wire.target(route, request.match_info.get("target"))
        except NotServed as exc:
            raise UnknownEndpoint(exc.message) from None
        except BodyError as exc:
            raise InvalidRequest(exc.message, param=exc.param) from None
        serving = request[SERVING]
        raw, body = await read_json(request, serving)
        facts = checked(wire.check, body)
        conversation = target.api == wire.name
        stream = facts.stream if target.stream is None else target.stream
        return await proxied(
            request,
            serving,
            api=target.api,
            endpoint=target.endpoint,
            model=target.model if target.model is not None else facts.model or "",
            body=body,
            raw=raw,
            stream=stream and conversation,
            through_pipeline=conversation,
        )

    return handle


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
    # at the ratio the guard would count this client's request at
    ratios = services.ratios if serving.config.guard.learn_token_ratios else None
    ratio = counting_ratio(services.counter, ratios, exchange.owner, name, limits)
    total = services.counter.request(MESSAGES, body, limits.tokenizer, model, ratio).total
    return web.Response(
        body=orjson.dumps({"input_tokens": total}),
        content_type="application/json",
        headers={**request_id_header(exchange), "x-brim-counted-by": "brim"},
    )


def add_routes(app: web.Application, door: FrontDoor) -> None:
    for wire in WIRES.values():
        for route in wire.routes:
            app.router.add_post(route, door(conversation_route(wire, route)))
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/messages/count_tokens", door(count_tokens))
