"""The floor of the stack: a bare pass-through proxy, `python -m bench.bare --port P --upstream URL`.

aiohttp + uvloop as brim uses them, and nothing else: read the body, POST it upstream on one
pooled session, return the bytes (a stream relayed chunk by chunk). No checks, no counting, no
logs or metrics. What brim adds over this is brim's own work; what this adds over a direct call
is the cost of two more HTTP exchanges in aiohttp.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from bench.fake import new_app, run_quietly

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
)


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {
        "Content-Type": request.headers.get("Content-Type", "application/json"),
        "Authorization": request.headers.get("Authorization", ""),
    }
    url = request.app[UPSTREAM] + request.path.removeprefix("/v1")
    async with request.app[SESSION].post(url, data=body, headers=headers) as reply:
        kept = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_BY_HOP}
        if not reply.headers.get("Content-Type", "").startswith("text/event-stream"):
            return web.Response(status=reply.status, body=await reply.read(), headers=kept)
        response = web.StreamResponse(status=reply.status, headers=kept)
        await response.prepare(request)
        async for chunk in reply.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def ready(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _session(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None), auto_decompress=False
    )
    yield
    await app[SESSION].close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the API root, e.g. http://h:p/v1")
    args = parser.parse_args()
    app = new_app()
    app[UPSTREAM] = args.upstream.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/readyz", ready)
    run_quietly(app, args.port)


if __name__ == "__main__":
    main()
