"""`web.AppKey`s for the resources shared by brim's handlers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from brim.middleware.pipeline import Services
from brim.middleware.stage import Pipeline
from brim.proxy.admission import Admission
from brim.proxy.config import BrimConfig
from brim.proxy.edge import Edge
from brim.proxy.multiproc import WorkerMetrics
from brim.proxy.otel_setup import Providers
from brim.proxy.owners import Owners
from brim.proxy.reload import Generations, Reloader


@dataclass(slots=True)
class Readiness:
    ready: bool = False


class Serving:
    """What a request uses, found with one look-up (`request[SERVING]`) instead of one per
    resource, with the settings every request reads worked out once: one configuration's
    (`proxy.reload`: a reload makes a new one, and a request keeps the one it started with):
    its pipeline, its browser edge (`[server] allowed_origins`, `allowed_hosts`), how it names
    owners (`[server] owner_secret_env`). `in_use` counts the requests that hold it."""

    __slots__ = (
        "admission",
        "config",
        "edge",
        "in_use",
        "keyed",
        "max_body_bytes",
        "max_json_depth",
        "owners",
        "pipeline",
        "services",
        "upstreams",
        "warn_at",
    )

    def __init__(
        self, config: BrimConfig, services: Services, pipeline: Pipeline, admission: Admission
    ) -> None:
        self.config = config
        self.services = services
        self.upstreams = services.upstreams
        self.pipeline = pipeline
        self.admission = admission
        self.in_use = 0
        server = config.server
        self.max_body_bytes = server.max_body_bytes
        self.max_json_depth = server.max_json_depth
        self.keyed = bool(server.api_keys)
        self.owners = Owners.for_server(server)
        self.edge = Edge(server)
        self.warn_at = config.guard.warn_at


# `proxy.app.front_door`: a handler as brim serves it (request id, admission, limits, keys, every
# error in the client's wire format). Each routes module's `add_routes` wraps its handlers in it.
FrontDoor = Callable[[Handler], Handler]

PROVIDERS = web.AppKey("providers", Providers)
READINESS = web.AppKey("readiness", Readiness)
GENERATIONS = web.AppKey("generations", Generations)  # the `Serving` a new request gets
RELOADER = web.AppKey("reloader", Reloader)  # set when the app was started from a config source
# Set in a worker of `brim serve --workers N` only: its share of the group's metrics.
WORKER_METRICS = web.AppKey("worker_metrics", WorkerMetrics)

# Per request: brim's request id, what serves it (its configuration's generation), and which
# header (if any) carried the client's brim key.
REQUEST_ID = web.RequestKey("request_id", str)
SERVING = web.RequestKey("serving", Serving)
BRIM_KEY_HEADER = web.RequestKey("brim_key_header", str)
# Set where the brim key was checked: the owner of what brim keeps from the request.
BRIM_KEY_OWNER = web.RequestKey("brim_key_owner", str)
