"""`GET /metrics` (Prometheus), and the admin endpoints: `GET /admin/status` (the figures the
`/ui` dashboard and `brim status` show), `GET /admin/archive/{key}` (the full sha256 key or a
unique prefix of at least 8 hex digits, `sha256:` optional), `GET /admin/limits` (the facts
learned from providers' overflow errors, as `brim limits` lists them), `DELETE
/admin/limits/{model}` and `DELETE /admin/limits` (forget them, for one model or all, on every
instance and worker that shares them), `POST /admin/reload` (reload the configuration file, as
SIGHUP does: `proxy.reload`; `brim reload`). The admin endpoints need a key from `[server]
admin_keys_env` (`Authorization: Bearer <key>` or `x-brim-admin-key`) and are off when none is
configured; so does `/metrics` unless `[server] metrics_public`."""

from __future__ import annotations

import asyncio
import hmac
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from brim.adapters.errors import AdminDisabled, InvalidRequest, Unauthorized, UnknownEndpoint
from brim.middleware.services.learned import ALL_MODELS, MODEL_ID_MAX
from brim.middleware.stages.loops import loop_status
from brim.policies.limits import Learned, LimitsRegistry
from brim.proxy.config import ConfigError
from brim.proxy.inspect import shared_ratios
from brim.proxy.keys import PROVIDERS, RELOADER, SERVING, WORKER_METRICS, FrontDoor

ADMIN_KEY_HEADER = "x-brim-admin-key"


def require_admin_keys(request: web.Request) -> None:
    """Refuse (403 `admin_disabled`) when no admin key is configured."""
    if not request[SERVING].config.server.admin_keys:
        raise AdminDisabled("The admin endpoints are off: set [server] admin_keys_env to use them.")


def require_admin(request: web.Request) -> None:
    """Refuse unless the request presents one of the admin keys (401), or none is set (403)."""
    require_admin_keys(request)
    keys = request[SERVING].config.server.admin_keys
    presented = request.headers.get(ADMIN_KEY_HEADER, "")
    auth = request.headers.get("Authorization", "")
    if not presented and auth.lower().startswith("bearer "):
        presented = auth[7:].strip()
    if not any(
        hmac.compare_digest(presented.encode(), k.get_secret_value().encode()) for k in keys
    ):
        raise Unauthorized("A valid admin key is required.")


async def metrics(request: web.Request) -> web.Response:
    """This process's metrics; in a worker of `brim serve --workers N`, those of every worker
    (see `proxy.multiproc`). Unless `[server] metrics_public` (by default: bound to loopback
    with no keys at all), only for the admin key, as for the admin endpoints."""
    server = request[SERVING].config.server
    if not server.metrics_open:
        if not server.admin_keys:
            raise AdminDisabled(
                "/metrics needs the admin key here and none is set: set [server] admin_keys_env "
                "(Prometheus sends a key as a bearer token), or metrics_public = true."
            )
        require_admin(request)
    registry = request.app[PROVIDERS].registry
    if registry is None:
        raise UnknownEndpoint("Prometheus metrics are off ([telemetry] prometheus = false).")
    shared = request.app.get(WORKER_METRICS)
    if shared is not None:
        body = await asyncio.to_thread(shared.exposition)
    else:
        body = await asyncio.to_thread(generate_latest, registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def learned_rows(registry: LimitsRegistry, facts: Iterable[Learned]) -> list[dict[str, Any]]:
    """Learned facts as the admin endpoints show them, by model: each with what the registry
    knows of the model without it (`known`, `known_source`) and when it is forgotten."""
    now = time.time()
    rows = []
    for fact in sorted(facts, key=lambda f: (f.model, f.kind)):
        known, source = registry.known_window(fact.model)
        rows.append(
            {
                "model": fact.model,
                "kind": fact.kind,
                "value": fact.value,
                "known": known,
                "known_source": source.value,
                "learned_s_ago": round(max(0.0, now - fact.learned_at(registry.learned_ttl_s))),
                "expires_in_s": round(max(0.0, fact.until - now)),
            }
        )
    return rows


async def status(request: web.Request) -> web.Response:
    require_admin(request)
    serving = request[SERVING]
    services = serving.services
    snapshot = await services.shared.status()  # every instance's, with [cache] url
    snapshot["learned_limits"] = services.limits.learned
    now = time.time()
    snapshot["learned"] = learned_rows(services.limits, services.limits.learned_facts())
    # Each model's ratio of its provider's input tokens to brim's count, learned from usage:
    # the shared value and how many clients taught it (never which).
    snapshot["token_ratios"] = shared_ratios(
        services.ratios, services.limits, services.counter, now
    )
    guard = serving.config.guard
    snapshot["loop_guard"] = loop_status(
        services.shared.loops, limit=guard.loop_limit, window_s=guard.loop_window_s
    )
    return web.json_response(snapshot)


async def archived(request: web.Request) -> web.Response:
    require_admin(request)
    archive = request[SERVING].services.archive
    if archive is None:
        raise UnknownEndpoint("The content archive is off ([archive] enabled = false).")
    key = request.match_info["key"]
    try:  # the full key, or a unique prefix such as a placeholder's `sha256:0123456789abcdef`
        full = await asyncio.to_thread(archive.resolve, key)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    content = None if full is None else await asyncio.to_thread(archive.get, full)
    if content is None:
        raise UnknownEndpoint(f"Nothing is archived under {key[:16]}… (or it has expired).")
    return web.Response(text=content, content_type="text/plain")


async def limits(request: web.Request) -> web.Response:
    """What this process learned or adopted (with Redis or in a `--workers` group, what the
    others learned too, as of its last refresh)."""
    require_admin(request)
    services = request[SERVING].services
    shared = services.shared
    return web.json_response(
        {
            "instance": shared.instance,
            "shared_with": shared.limits_shared_with,
            "learned": learned_rows(services.limits, services.limits.learned_facts()),
        }
    )


async def forget(request: web.Request) -> web.Response:
    """Forget one model's learned facts (`{model}`, any spelling of its id), or every model's."""
    require_admin(request)
    model = request.match_info.get("model")
    if model is not None and (
        not 0 < len(model) <= MODEL_ID_MAX or not model.isprintable() or model == ALL_MODELS
    ):
        raise InvalidRequest(
            f"A model id is 1 to {MODEL_ID_MAX} printable characters (and not {ALL_MODELS!r}: "
            "DELETE /admin/limits forgets every model).",
            param="model",
        )
    services = request[SERVING].services
    shared = services.shared
    done = await shared.forget(model)
    return web.json_response(
        {
            "instance": shared.instance,
            "shared_with": shared.limits_shared_with,
            "model": model,
            "forgotten": learned_rows(services.limits, done.dropped),
            "reached": done.reached,
        }
    )


async def reload(request: web.Request) -> web.Response:
    """Reload the configuration file, as SIGHUP does, in every worker: 202 with what changes
    and what waits for a restart, once the file is found usable; 400 with why, if not (and
    nothing changes)."""
    require_admin(request)
    reloader = request.app.get(RELOADER)
    if reloader is None:
        raise UnknownEndpoint("This brim was not started by `brim serve`: nothing to reload.")
    try:
        plan = await reloader.plan()
    except ConfigError as exc:
        raise InvalidRequest(f"{reloader.source.name} cannot be used: {exc}") from None
    if reloader.supervisor is not None:  # the supervisor reloads, and signals every worker
        os.kill(reloader.supervisor, signal.SIGHUP)
    else:
        reloader.request()
    body = {
        "config": reloader.source.name,
        "changes": list(plan.changed),
        "needs_restart": list(plan.needs_restart),
    }
    return web.json_response(body, status=202)


def add_routes(app: web.Application, door: FrontDoor) -> None:
    app.router.add_get("/metrics", door(metrics))
    app.router.add_get("/admin/status", door(status))
    app.router.add_get("/admin/archive/{key}", door(archived))
    app.router.add_get("/admin/limits", door(limits))
    app.router.add_delete("/admin/limits", door(forget))
    # Model ids hold slashes ("openai/gpt-4.1"): the rest of the path, percent-decoded.
    app.router.add_delete("/admin/limits/{model:.+}", door(forget))
    app.router.add_post("/admin/reload", door(reload))
