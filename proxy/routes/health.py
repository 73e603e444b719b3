"""Liveness and readiness."""

from __future__ import annotations

from aiohttp import web

from brim.proxy.keys import READINESS, FrontDoor


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[READINESS].ready:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "starting or stopping"}, status=503)


async def root(request: web.Request) -> web.Response:
    return web.Response(text="brim\n")  # Claude Code probes HEAD / and GET / before it starts


def add_routes(app: web.Application, door: FrontDoor) -> None:
    app.router.add_get("/healthz", door(healthz))
    app.router.add_get("/readyz", door(readyz))
    app.router.add_get("/", door(root))  # aiohttp answers HEAD for every GET route
