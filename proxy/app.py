"""`create_app(config)`: the aiohttp application that is brim."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hmac
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from opentelemetry.sdk.trace import SpanProcessor

from brim.adapters.cli import ChildEnv
from brim.adapters.errors import (
    BrimError,
    HeadersTooLarge,
    InternalError,
    MethodNotAllowed,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    UnknownEndpoint,
)
from brim.adapters.forwarded_headers import BRIM_KEY_HEADER as BRIM_KEY
from brim.adapters.registry import Upstreams
from brim.middleware.pipeline import Services, default_pipeline
from brim.middleware.services.archive import ContentArchive
from brim.middleware.services.audit import AuditLog
from brim.middleware.services.instruments import Tally
from brim.middleware.services.learned import WorkerGroup
from brim.middleware.services.rates import LocalRates, RateCounts, RedisRates
from brim.middleware.services.sessions import SessionMemory
from brim.middleware.services.shared import LocalState, RedisLink, RedisState, SharedState
from brim.middleware.services.status_board import ModelLabels, StatusBoard
from brim.middleware.services.store import ContentStore, MemoryStore, RedisStore
from brim.middleware.services.summarize import (
    MemoryCache,
    RedisCache,
    Summarizer,
    SummaryCache,
    upstream_caller,
)
from brim.middleware.stage import Pipeline
from brim.policies.limits import LimitsRegistry
from brim.policies.ratios import TokenRatios
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires import wire_for_path
from brim.policies.wires.chat import CHAT
from brim.proxy.admission import (
    ADMISSION,
    QUOTA_HOLDER,
    UNGUARDED,
    Admission,
    BrimRunner,
    admit,
    holder,
    raise_descriptor_limit,
    release,
)
from brim.proxy.config import BrimConfig, ServerConfig, secret_variables
from brim.proxy.edge import request_id as edge_request_id
from brim.proxy.error_replies import error_response
from brim.proxy.keys import (
    BRIM_KEY_HEADER,
    BRIM_KEY_OWNER,
    GENERATIONS,
    PROVIDERS,
    READINESS,
    RELOADER,
    REQUEST_ID,
    SERVING,
    WORKER_METRICS,
    FrontDoor,
    Readiness,
    Serving,
)
from brim.proxy.listen import BACKLOG
from brim.proxy.multiproc import PUBLISH_INTERVAL_S, MetricsShare, WorkerMetrics
from brim.proxy.otel_setup import Providers, build_providers
from brim.proxy.owners import Owners
from brim.proxy.reload import ConfigSource, Generations, Reloader
from brim.proxy.resources import litellm_model_map, use_bundled_tiktoken_files
from brim.proxy.routes import admin, apis, dashboard, health, model_list
from brim.proxy.routes.dashboard import UI_PATHS

log = logging.getLogger("brim")
PUBLIC_PATHS = frozenset({"/", "/healthz", "/readyz", "/metrics"})
PARSER_LINE_CAP = 1024 * 1024


def _aiohttp_error(exc: web.HTTPException, request: web.Request) -> BrimError:
    if exc.status == 413:
        limit = request.app[GENERATIONS].current.config.server.max_body_bytes
        return PayloadTooLarge(f"The request body exceeds this brim's limit of {limit} bytes.")
    if exc.status == 405:
        refused = MethodNotAllowed(f"{request.method} is not allowed on {request.path}.")
        if allow := exc.headers.get("Allow"):  # the methods the URL is served for (RFC 9110)
            refused.brim_headers["allow"] = allow
        return refused
    if exc.status == 404:
        return UnknownEndpoint(f"Unknown request URL: {request.method} {request.path}.")
    error = BrimError(exc.reason or f"HTTP {exc.status}")
    error.status, error.error_type = exc.status, "invalid_request_error"
    return error


def _error_reply(exc: Exception, request: web.Request, request_id: str) -> web.Response | None:
    """The wire-shaped reply for an error that left a handler; None for one to re-raise (an
    aiohttp redirect). `RequestTimeout` is answered by the caller, which must also close."""
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        exc = _aiohttp_error(exc, request)
    wire = wire_for_path(request.path)
    id_header = {"x-brim-request-id": request_id}
    if isinstance(exc, BrimError):
        return error_response(exc, id_header, wire)
    if isinstance(exc, web.HTTPException):
        return None
    log.exception("request %s failed inside brim", request_id)
    return error_response(
        InternalError(f"brim failed to handle this request (request id {request_id})."),
        id_header,
        wire,
    )


def check_header_limits(request: web.Request, server: ServerConfig) -> None:
    """`server.max_header_kb` and `server.max_headers`, answered in the client's wire format and
    naming the header, never its value (which may be a credential). aiohttp's own parser limits
    sit far above these; see `PARSER_LINE_CAP`."""
    limit = server.max_header_kb * 1024
    headers = request.raw_headers
    if len(headers) > server.max_headers:
        raise HeadersTooLarge(
            f"The request has {len(headers)} header lines; this brim accepts at most "
            f"{server.max_headers} (server.max_headers)."
        )
    if len(request.raw_path) > limit:
        raise HeadersTooLarge(
            f"The request URL is {len(request.raw_path)} bytes long; this brim accepts at most "
            f"{limit} (server.max_header_kb)."
        )
    for name, value in headers:
        if len(name) + len(value) > limit:
            raise HeadersTooLarge(
                f"The request header {name.decode('latin-1')!r} is {len(value)} bytes long; this "
                f"brim accepts header lines of at most {limit} bytes (server.max_header_kb)."
            )


class ParseErrorsWithoutBytes(logging.Filter):
    """aiohttp logs a request it cannot parse with up to 100 bytes of the offending line, which
    may be an `Authorization` header. Keep the kind of error, drop the bytes and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "rejected a malformed HTTP request (%s)"
            record.args = (type(exc).__name__,)
            record.exc_info, record.exc_text = None, None
        return True


def _hide_parse_error_bytes() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ParseErrorsWithoutBytes) for f in server_log.filters):
        server_log.addFilter(ParseErrorsWithoutBytes())


def _presented_key(request: web.Request) -> tuple[str, str] | None:
    """The key a client presented to brim, and the header that carried it."""
    if value := request.headers.get(BRIM_KEY):
        return value, BRIM_KEY
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip(), "Authorization"
    if value := request.headers.get("x-api-key"):
        return value, "x-api-key"
    return None


def check_brim_key(request: web.Request, server: ServerConfig, owners: Owners) -> None:
    """With `server.api_keys_env` set, every request but health, metrics, the admin endpoints and
    the dashboard's files must present one of the keys. The key names the request's owner.

    The header that carried a brim key is not forwarded upstream.
    """
    path = request.path
    if path in PUBLIC_PATHS or path in UI_PATHS or path.startswith("/admin/"):
        return  # the admin routes and the dashboard: the admin key
    presented = _presented_key(request)
    if presented is None:
        raise Unauthorized(
            "Missing brim API key: send it as 'Authorization: Bearer <key>' or "
            f"'{BRIM_KEY}: <key>'."
        )
    value, header = presented
    keys = server.api_keys
    if not any(hmac.compare_digest(value.encode(), k.get_secret_value().encode()) for k in keys):
        raise Unauthorized("Incorrect brim API key provided.")
    request[BRIM_KEY_HEADER] = header
    request[BRIM_KEY_OWNER] = owners.of_brim_key(value)
    if server.rate_limited:
        request[QUOTA_HOLDER] = holder("key", value)


def front_door(generations: Generations, gate: Admission) -> FrontDoor:
    """What brim does around every handler, wrapped around each as its route is added (a
    closure, not an aiohttp middleware: no middleware chain to find and call per request). In
    order: a request id (`proxy.edge.request_id`), and the configuration that serves it to its
    end (`SERVING`: the current generation, `proxy.reload`); every error answered in the
    client's wire format, nothing escaping as a traceback; a foreign web page's request
    refused, a listed origin's CORS preflight answered (`proxy.edge.Edge`); `max_in_flight`
    (`admit`; `/`, `/healthz`, `/readyz` and `/metrics` are answered even when saturated); the
    header limits (`check_header_limits`); the brim key, when keys are configured
    (`check_brim_key`), decided here, once. A URL no route serves comes through it too
    (`unmatched`, the last route)."""

    def door(handler: Handler) -> Handler:
        async def front(request: web.Request) -> web.StreamResponse:
            request[REQUEST_ID] = request_id = edge_request_id(request)
            serving = generations.current
            request[SERVING] = serving
            serving.in_use += 1
            server, edge = serving.config.server, serving.edge
            admitted = request.path not in UNGUARDED
            try:
                edge.check(request)
                if (preflight := edge.preflight(request)) is not None:
                    return preflight
                if admitted:
                    admit(request, gate)
                try:
                    check_header_limits(request, server)
                    if serving.keyed:
                        check_brim_key(request, server, serving.owners)
                    return await handler(request)
                finally:
                    if admitted:
                        release(request, gate)
            except RequestTimeout as exc:  # the body was not read to its end: answer, then close
                response = error_response(
                    exc, {"x-brim-request-id": request_id}, wire_for_path(request.path)
                )
                response.force_close()
                await response.prepare(request)
                await response.write_eof()
                if request.protocol is not None:
                    request.protocol.force_close()
                return response
            except Exception as exc:  # not CancelledError: that goes on up
                reply = _error_reply(exc, request, request_id)
                if reply is None:
                    raise
                return reply
            finally:
                generations.left(serving)

        return front

    return door


async def allow_origin(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """An `on_response_prepare` hook: a reply to an origin `[server] allowed_origins` lists
    says so (`proxy.edge.Edge.allow_origin`), by the request's own configuration."""
    serving = request.get(SERVING)
    if serving is not None and serving.edge.origins and "Origin" in request.headers:
        await serving.edge.allow_origin(request, response)


async def unmatched(request: web.Request) -> web.StreamResponse:
    """The last route, for every URL and method no other route serves: 405 where another route
    serves the URL for other methods (as aiohttp's router would say), else 404; `front_door`
    answers both in the client's wire format."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        match, methods = await resource.resolve(request)
        if match is None:
            allowed |= methods
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, allowed)
    raise web.HTTPNotFound()


class AccessLogger(AbstractAccessLogger):
    """One line per request: no query string, no headers, no bodies (they may hold secrets).
    The same facts as `extra=` fields, for the JSON log format (`proxy.logs`)."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)  # no line made when it would be dropped

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        request_id, ms = request.get(REQUEST_ID, "-"), round(time * 1000, 1)
        self.logger.info(
            "%s %s %s %d %.1fms",
            request_id,
            request.method,
            request.path,
            response.status,
            ms,
            extra={
                "request_id": request_id,
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "duration_ms": ms,
            },
        )


def create_app(
    config: BrimConfig,
    *,
    span_processors: Sequence[SpanProcessor] = (),
    metrics_share: MetricsShare | None = None,
    group: WorkerGroup | None = None,
    source: ConfigSource | None = None,
    supervisor: int | None = None,
) -> web.Application:
    """The brim application. `span_processors` add trace exporters (tests use an in-memory one);
    `metrics_share` makes it one of several workers whose `/metrics` each report them all;
    `group`, one of several workers that share learned limits through files. `source`: where
    `config` came from, to reload it from (SIGHUP, `POST /admin/reload`); `supervisor`: the pid
    of the supervisor of workers this app is one of."""
    app = web.Application(
        client_max_size=config.server.max_body_bytes,
    )
    providers = build_providers(config.telemetry, span_processors)
    services = build_services(config, providers, group)
    gate = Admission(config.server, providers.telemetry)
    app[PROVIDERS] = providers
    app[READINESS] = Readiness()
    app[ADMISSION] = gate
    app[GENERATIONS] = generations = Generations(serving_for(config, services, gate))
    if source is not None:
        app[RELOADER] = Reloader(source, generations, reconfigured, supervisor=supervisor)
    if metrics_share is not None and providers.registry is not None:
        app[WORKER_METRICS] = WorkerMetrics(
            metrics_share.directory, metrics_share.token, providers.registry
        )
    app.cleanup_ctx.append(_lifecycle)
    # Replies to a listed origin say so (`[server] allowed_origins`, live: a reload may list one).
    app.on_response_prepare.append(allow_origin)
    door = front_door(generations, gate)
    for routes in (health, model_list, apis, admin, dashboard):
        routes.add_routes(app, door)
    app.router.add_route("*", "/{path:.*}", door(unmatched))  # last: what no route serves
    return app


def serving_for(config: BrimConfig, services: Services, gate: Admission) -> Serving:
    """What requests of `config` are served with: its pipeline, around `services`."""
    pipeline = Pipeline(default_pipeline(config, services), services.telemetry.tracer)
    return Serving(config, services, pipeline, gate)


def reconfigured(config: BrimConfig, running: Serving) -> Serving:
    """What the requests after a reload to `config` are served with: new stages; the running
    services where their settings did not change, else rebuilt from them (what they learned
    and hold carried over: see `reconfigured_services`)."""
    return serving_for(
        config, reconfigured_services(running.services, running.config, config), running.admission
    )


def reconfigured_services(services: Services, running: BrimConfig, config: BrimConfig) -> Services:
    """`services` for `config`, from those of the `running` configuration: upstreams whose
    settings (and the CLI children's environment, `cli_child_env`) are unchanged keep their
    adapters; a new `[models]` keeps what was learned, and the shared state checks what it
    reads against it; the token counter, the summarizer (with its cache) and the guard's
    session memory are new only when their own settings (or what they are built on) changed.
    Status, learned limits and token ratios, shared state, stores and rate windows are the same
    objects."""
    upstreams = services.upstreams
    child_env = cli_child_env(config)
    if (config.upstreams, config.routes, child_env) != (
        running.upstreams,
        running.routes,
        upstreams.child_env,
    ):
        upstreams = upstreams.reconfigured(config.upstreams, config.routes, child_env)
    limits = services.limits
    if config.models != running.models:
        limits = limits.reconfigured(config.models)
        configured = model_ids(config)
        services.status.labels.configure(configured)
        services.status.response_labels.configure(configured)
    if limits is not services.limits or config.upstreams != running.upstreams:
        services.shared.follow(limits, config.upstreams)
    counter = services.counter
    if config.guard.claude_token_factor != running.guard.claude_token_factor:
        counter = TokenCounter(claude_factor=config.guard.claude_token_factor)
    summarizer = services.summarizer
    if (
        config.summarize != running.summarize
        or upstreams is not services.upstreams
        or limits is not services.limits
        or counter is not services.counter
    ):
        kept = summarizer.cache if summarizer is not None else None
        rejected = services.telemetry.shared_rejected
        summarizer = build_summarizer(
            config, upstreams, counter, limits, services.link, rejected, kept
        )
    return dataclasses.replace(
        services,
        upstreams=upstreams,
        limits=limits,
        counter=counter,
        summarizer=summarizer,
        sessions=build_sessions(config, services.sessions),
    )


def build_limits(config: BrimConfig) -> LimitsRegistry:
    return LimitsRegistry(config.models, litellm_model_map())


def build_services(
    config: BrimConfig, providers: Providers | None = None, group: WorkerGroup | None = None
) -> Services:
    """`group`: this process is a worker of a `--workers` group (it shares learned limits with
    the others through the group's files when there is no Redis)."""
    use_bundled_tiktoken_files()
    providers = providers or build_providers(
        config.telemetry.model_copy(update={"prometheus": False})
    )
    limits = build_limits(config)
    providers.telemetry.watch_learned_limits(lambda: limits.learned)
    audit = None
    if config.audit.path:
        audit = AuditLog(
            config.audit.path,
            max_bytes=int(config.audit.max_mb * 1024 * 1024),
            backups=config.audit.backups,
        )
    archive = None
    if config.archive.enabled:
        archive = ContentArchive(config.archive.dir, config.archive.ttl_hours)
    upstreams = Upstreams(config.upstreams, config.routes, cli_child_env(config))
    counter = TokenCounter(claude_factor=config.guard.claude_token_factor)
    status = StatusBoard(labels=model_labels(config), response_labels=model_labels(config))
    link = build_link(config)
    rates: RateCounts | None = None
    if config.server.rate_limited:
        rates = LocalRates() if link is None else RedisRates(link, LocalRates())
    ratios = TokenRatios()
    return Services(
        upstreams=upstreams,
        limits=limits,
        counter=counter,
        ratios=ratios,
        telemetry=providers.telemetry,
        status=status,
        shared=build_shared(
            config,
            link,
            limits,
            status,
            ratios,
            group=group,
            rejected=rejected_shared(providers.telemetry.shared_rejected),
        ),
        audit=audit,
        archive=archive,
        summarizer=build_summarizer(
            config, upstreams, counter, limits, link, providers.telemetry.shared_rejected
        ),
        store=build_store(config, link, providers.telemetry.shared_rejected),
        rates=rates,
        sessions=build_sessions(config),
        link=link,
    )


SHORTEST_SECRET = 8  # a password shorter than this is looked for only inside a URL


def cli_child_env(config: BrimConfig) -> ChildEnv:
    """What a CLI upstream's process does not inherit from brim's environment: every variable
    the configuration names as a secret, brim's own `BRIM_…` settings, and any variable that
    holds the password of `[cache] url`."""
    values: list[str] = []
    if config.cache.url and (password := urlsplit(config.cache.url).password):
        values.append(f":{password}@")
        if len(password) >= SHORTEST_SECRET:
            values.append(password)
    return ChildEnv(names=secret_variables(config), values=tuple(values))


def build_sessions(config: BrimConfig, kept: SessionMemory | None = None) -> SessionMemory | None:
    """The guard's session memory, with `[guard] carry_forward`: `kept` if it has the size
    `session_memory_mb` asks for."""
    guard = config.guard
    if not guard.carry_forward:
        return None
    size = int(guard.session_memory_mb * 2**20)
    return kept if kept is not None and kept.max_bytes == size else SessionMemory(size)


def build_link(config: BrimConfig) -> RedisLink | None:
    """The app's one Redis connection, with `[cache] url`."""
    cache = config.cache
    if not cache.url:
        return None
    return RedisLink(cache.url, timeout_s=cache.timeout_s, retry_s=cache.retry_s)


def build_shared(
    config: BrimConfig,
    link: RedisLink | None,
    limits: LimitsRegistry,
    status: StatusBoard,
    ratios: TokenRatios | None = None,
    *,
    group: WorkerGroup | None = None,
    rejected: Callable[[str, str], None] | None = None,
) -> SharedState:
    """Learned limits and token ratios, loop counts and status: through Redis when there is a
    link (it closes it), else this process's own (the learned limits shared with the other
    workers of its `group`, if it has one). `rejected(record, reason)` counts shared records
    left out as malformed or implausible."""
    if link is None:
        return LocalState(
            status,
            loop_window_s=config.guard.loop_window_s,
            registry=limits,
            group=group,
            rejected=rejected,
        )
    return RedisState(
        link,
        LocalState(status, loop_window_s=config.guard.loop_window_s, registry=limits),
        limits,
        refresh_s=config.cache.refresh_s,
        loop_limit=config.guard.loop_limit,
        rejected=rejected,
        ratios=ratios if config.guard.learn_token_ratios else None,
        upstreams=config.upstreams,
    )


def model_labels(config: BrimConfig) -> ModelLabels:
    """Metric and status-board labels for models: the configured ones (and their aliases) are
    always labelled; other ids, being client input, share a bounded set of labels."""
    return ModelLabels(model_ids(config))


def model_ids(config: BrimConfig) -> list[str]:
    """The configured models' ids and aliases."""
    return [*config.models, *(a for facts in config.models.values() for a in facts.aliases)]


def build_summarizer(
    config: BrimConfig,
    upstreams: Upstreams,
    counter: TokenCounter,
    limits: LimitsRegistry,
    link: RedisLink | None = None,
    rejected: Tally | None = None,
    cache: SummaryCache | None = None,
) -> Summarizer | None:
    """The summarizer `[summarize]` asks for, if any: with `cache`, else a new one (in
    process, and shared through `link` when there is one, records it does not use counted in
    `rejected`)."""
    settings = config.summarize
    if not settings.enabled:
        return None
    if cache is None and settings.cache:
        local = MemoryCache(settings.cache_ttl_hours)
        cache = local
        if link is not None:
            counted = rejected_records(rejected, "summary")
            cache = RedisCache(link, settings.cache_ttl_hours, local, on_rejected=counted)
    return Summarizer(
        upstream_caller(upstreams),
        settings.chain(),
        CounterMeter(counter, "o200k_base", "", CHAT),  # measures summaries: text only
        limits,
        cache,
        max_retries=settings.max_retries,
        retry_delay_s=settings.retry_delay_s,
        timeout_s=settings.timeout_s,
        prompt_version=settings.prompt_version,
        truncate_fallback=settings.truncate_fallback,
    )


def build_store(
    config: BrimConfig, link: RedisLink | None = None, rejected: Tally | None = None
) -> ContentStore | None:
    """The restore store, one per app: in process, and shared through `link` (the app's Redis,
    `[cache] url`) when there is one (records it does not serve counted in `rejected`)."""
    settings = config.restore
    if not settings.enabled:
        return None
    ttl_s = settings.ttl_hours * 3600
    local = MemoryStore(int(settings.store_mb * 1024 * 1024), ttl_s)
    if link is not None:
        return RedisStore(link, ttl_s, local, on_rejected=rejected_records(rejected, "restore"))
    return local


def rejected_records(tally: Tally | None, record: str) -> Callable[[str], None]:
    """Counts a shared record of kind `record` that was read and not used, by reason
    (`brim_shared_records_rejected_total{record, reason}`)."""
    if tally is None:
        return lambda reason: None
    return lambda reason: tally.add(1, {"record": record, "reason": reason})


def rejected_shared(tally: Tally) -> Callable[[str, str], None]:
    """Counts a shared record (learned, forgotten, status, event) that was read and left out,
    by kind and reason, in the same counter as `rejected_records`."""
    return lambda record, reason: tally.add(1, {"record": record, "reason": reason})


def _warm(counter: TokenCounter) -> None:
    try:
        counter.warm()
    except Exception:  # counting will say what is wrong when it is first needed
        log.exception("could not load the tokenizer files (is TIKTOKEN_CACHE_DIR right?)")


async def _expire_archive(archive: ContentArchive, interval_s: float) -> None:
    while True:
        try:
            removed = await asyncio.to_thread(archive.cleanup)
            if removed:
                log.info("archive: removed %d expired files", removed)
        except Exception:
            log.exception("archive cleanup failed")
        await asyncio.sleep(interval_s)


async def _publish_metrics(metrics: WorkerMetrics) -> None:
    """A worker's figures, written for the other workers' scrapes every PUBLISH_INTERVAL_S."""
    failing = False
    while True:
        await asyncio.sleep(PUBLISH_INTERVAL_S)
        try:
            await asyncio.to_thread(metrics.publish)
            failing = False
        except Exception:
            if not failing:  # once per spell of failures, not every second
                log.exception("could not write this worker's metrics to %s", metrics.directory)
            failing = True


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    generations = app[GENERATIONS]
    services = generations.current.services  # (a reload keeps these: see `reconfigured`)
    # The encodings take a moment to load: do it beside the event loop, not on a first request.
    warming = asyncio.get_running_loop().run_in_executor(None, _warm, services.counter)
    background = []
    if services.archive is not None:
        interval = generations.current.config.archive.cleanup_interval_s
        background.append(asyncio.create_task(_expire_archive(services.archive, interval)))
    metrics = app.get(WORKER_METRICS)
    if metrics is not None:
        background.append(asyncio.create_task(_publish_metrics(metrics)))
    await services.shared.start()
    app[READINESS].ready = True
    yield
    app[READINESS].ready = False
    for task in background:
        task.cancel()
    await warming
    reloader = app.get(RELOADER)
    if reloader is not None:
        await reloader.aclose()
    if metrics is not None:  # what the requests that finished while draining counted, too
        await asyncio.to_thread(metrics.close)
    await generations.aclose()
    if services.audit is not None:
        services.audit.close()
    if services.store is not None:
        await services.store.aclose()
    await services.shared.aclose()
    await asyncio.to_thread(app[PROVIDERS].shutdown)


async def start(
    config: BrimConfig,
    host: str,
    port: int,
    *,
    span_processors: Sequence[SpanProcessor] = (),
    sockets: Sequence[socket.socket] = (),
    reuse_port: bool = False,
    metrics_share: MetricsShare | None = None,
    group: WorkerGroup | None = None,
    source: ConfigSource | None = None,
    supervisor: int | None = None,
) -> web.AppRunner:
    """Start brim on `host:port` (0 for any free port) and return the running runner.

    A worker of `brim serve --workers` serves the listening `sockets` its supervisor shares
    instead, or binds `host:port` with SO_REUSEPORT (`reuse_port`) beside the other workers.
    `group`, `source` and `supervisor`: see `create_app`.
    """
    line_cap = max(PARSER_LINE_CAP, 2 * config.server.max_header_kb * 1024)
    raise_descriptor_limit(config.server.max_connections)
    app = create_app(
        config,
        span_processors=span_processors,
        metrics_share=metrics_share,
        group=group,
        source=source,
        supervisor=supervisor,
    )
    runner = BrimRunner(
        app,
        handler_cancellation=True,
        access_log_class=AccessLogger,
        shutdown_timeout=config.server.shutdown_timeout_s,
        # aiohttp's parser answers past its limits with a plain-text 400 that quotes the line;
        # brim's own, lower limits (`check_header_limits`) answer first, in the client's format.
        max_line_size=line_cap,
        max_field_size=line_cap,
        max_headers=max(1024, 2 * config.server.max_headers),
        # Compressed request bodies are decoded by brim itself, within its bounds
        # (`proxy.decoding`), and never by aiohttp as they arrive.
        auto_decompress=False,
    )
    _hide_parse_error_bytes()
    await runner.setup()
    sites: list[web.BaseSite] = [web.SockSite(runner, sock, backlog=BACKLOG) for sock in sockets]
    if not sites:
        sites.append(
            web.TCPSite(runner, host, port, backlog=BACKLOG, reuse_port=reuse_port or None)
        )
    for site in sites:
        await site.start()
    return runner


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RELOAD_SIGNAL = signal.SIGHUP
SERVING_SIGNALS = (*STOP_SIGNALS, RELOAD_SIGNAL)  # what a serving process handles


async def run_until_stopped(runner: web.AppRunner, *, lifeline: int | None = None) -> None:
    """Serve until SIGINT or SIGTERM (or, for a worker, until the read end `lifeline` of a pipe
    only its supervisor writes to reaches its end: the supervisor is gone), then stop: no new
    connections, `/readyz` 503 at once, in-flight requests finish within
    `[server] shutdown_timeout_s`. SIGHUP reloads the configuration (`proxy.reload`), where the
    app knows where it came from; elsewhere it is ignored (it never stops brim)."""
    settle_startup_objects()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    reloader = runner.app.get(RELOADER)
    loop.add_signal_handler(RELOAD_SIGNAL, reloader.request if reloader else _no_reload)
    # A worker is forked with these blocked, so that none is lost before the handlers above.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SERVING_SIGNALS)
    if lifeline is not None:

        def orphaned() -> None:
            loop.remove_reader(lifeline)
            log.warning("the supervisor of this worker is gone: stopping")
            stop.set()

        loop.add_reader(lifeline, orphaned)
    try:
        await stop.wait()
    finally:
        runner.app[READINESS].ready = False
        loop.add_signal_handler(RELOAD_SIGNAL, _no_reload)  # stopping: nothing new to build
        await runner.cleanup()


def _no_reload() -> None:
    log.warning("SIGHUP: this brim has no configuration source to reload, or is stopping")


YOUNG_COLLECTION_AT = 10_000


def settle_startup_objects() -> None:
    """Collect what start-up left behind, then exempt the rest (imports, the config, the model
    map: tens of thousands of objects that live as long as the process) from the cyclic
    collector's passes, which would otherwise traverse all of them again and again while
    serving (about 40 µs a request at 64 concurrent requests). Only for a process that is now
    a server: a test's or a library's process keeps its collector as it was.

    The young generation is also collected less often (`YOUNG_COLLECTION_AT` new objects, not
    700): with 64 requests in flight some 6-9k of their objects are alive, and each collection
    at 700 traverses them again (callgrind at 64 concurrent: 1220k → 1152k instructions a
    request at 10 000; 5 000 and 50 000 measure the same)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_AT, older, oldest)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (Linux and macOS), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("brim is not listening on a TCP port")
