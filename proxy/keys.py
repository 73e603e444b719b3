"""`web.AppKey`s for the resources shared by brim's handlers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from adapters.registry import Upstreams
from middleware.base import Pipeline
from middleware.pipeline import Services
from proxy.admission import Admission
from proxy.config import BrimConfig
from proxy.edge import Edge
from proxy.multiproc import WorkerMetrics
from proxy.owners import Owners
from proxy.telemetry import Providers


@dataclass(slots=True)
class Readiness:
    ready: bool = False


class Serving:
    """What a proxied request uses, found with one look-up (`request.app[SERVING]`) instead of
    one per resource (each `request.app[...]` is three Python calls), with the settings every
    request reads worked out once."""

    __slots__ = (
        "admission",
        "config",
        "edge",
        "keyed",
        "max_body_bytes",
        "max_json_depth",
        "owners",
        "pipeline",
        "upstreams",
        "warn_at",
    )

    def __init__(
        self, config: BrimConfig, upstreams: Upstreams, pipeline: Pipeline, admission: Admission
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.pipeline = pipeline
        self.admission = admission
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

CONFIG = web.AppKey("config", BrimConfig)
SERVICES = web.AppKey("services", Services)
PROVIDERS = web.AppKey("providers", Providers)
READINESS = web.AppKey("readiness", Readiness)
SERVING = web.AppKey("serving", Serving)
# Set in a worker of `brim serve --workers N` only: its share of the group's metrics.
WORKER_METRICS = web.AppKey("worker_metrics", WorkerMetrics)

# Per request: brim's request id, and which header (if any) carried the client's brim key.
REQUEST_ID = web.RequestKey("request_id", str)
BRIM_KEY_HEADER = web.RequestKey("brim_key_header", str)
# Set where the brim key was checked: the owner of what brim keeps from the request.
BRIM_KEY_OWNER = web.RequestKey("brim_key_owner", str)
