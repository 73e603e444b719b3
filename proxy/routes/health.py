"""Liveness and readiness."""

from __future__ import annotations

from aiohttp import web

from proxy.keys import READINESS


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[READINESS].ready:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "starting or stopping"}, status=503)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
