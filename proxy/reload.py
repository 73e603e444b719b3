"""Reloading `proxy.toml` while brim runs: `kill -HUP`, `POST /admin/reload`, `brim reload`.

The file is read and validated exactly as `brim serve` read it at start (the same `BRIM_…`
variables and command-line overrides: `ConfigSource`). A file that cannot be used is logged and
changes nothing. Otherwise the next requests get the new configuration: new stages around the
same long-lived services (status, learned limits, caches, stores), a new `[models]` registry
that keeps what was learned, new adapters for the upstreams whose settings changed (the others
keep theirs, pooled connections and all). A request in flight keeps the configuration it
started with to its end, a stream included: it holds its own `Serving` (`Generations`), and the
adapters a reload retired close only once no earlier request is left.

What a running process cannot change (`RESTART_ONLY`: where it listens, its workers, the
connection limits, telemetry, Redis, …) keeps its running value; a reload that changes one logs
that it takes effect at the next restart. Under `brim serve --workers N` the supervisor reads
the file first, keeps it for the workers it starts later, and passes SIGHUP to every worker,
which reloads as one process does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brim.adapters.adapter import Adapter
from brim.proxy.config import BrimConfig, ConfigError, load_config, refuse_open_without_keys

if TYPE_CHECKING:
    from brim.proxy.keys import Serving

log = logging.getLogger("brim.reload")

# What a reload cannot change in a running process, by section: the whole section (None) or
# these keys of it. They keep their running values until the next restart.
RESTART_ONLY: Mapping[str, tuple[str, ...] | None] = {
    "server": (
        "host",
        "port",
        "workers",
        "worker_socket",
        "shutdown_timeout_s",
        "header_timeout_s",
        "body_timeout_s",
        "max_connections",
        "max_in_flight",
        "max_body_mb",
        "max_body_buffer_mb",
        "max_header_kb",
        "max_headers",
        "max_decompression_ratio",  # these and the above: the admission gate's
        "requests_per_minute",
        "tokens_per_minute",
        "key_limits",
    ),
    # The loop counts shared between processes; the token ratios, shared through `[cache] url`
    # as brim started.
    "guard": ("loop_limit", "loop_window_s", "learn_token_ratios"),
    "summarize": ("cache", "cache_ttl_hours"),  # the summary cache
    "restore": ("enabled", "store_mb", "ttl_hours"),  # the restore store
    "telemetry": None,
    "audit": None,
    "archive": None,
    "cache": None,
}


@dataclass(frozen=True)
class ConfigSource:
    """Where a running brim's configuration comes from: `path` (None: the built-in defaults)
    with the `BRIM_…` variables, and the `[server]` keys the command line set (`--host`,
    `--port`, `--workers`). `load` makes the checks `brim serve` makes before it listens."""

    path: str | None
    server: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path or "the built-in defaults"

    def load(self) -> tuple[BrimConfig, list[str]]:
        """The configuration, and warnings (unknown keys); `ConfigError` if it is unusable."""
        config, warnings = load_config(self.path)
        if self.server:
            server = config.server.model_copy(update=dict(self.server))
            config = config.model_copy(update={"server": server})
        refuse_open_without_keys(config)
        return config, warnings


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload does: `config` is what the next requests get (the file's, with the
    `RESTART_ONLY` keys as they run); `changed` names what differs from the running
    configuration (sections, or `section.key`), `needs_restart` what differs but must wait."""

    config: BrimConfig
    changed: tuple[str, ...]
    needs_restart: tuple[str, ...]


def plan_reload(running: BrimConfig, loaded: BrimConfig) -> ReloadPlan:
    """Apply `loaded` over `running`, but what cannot change live (`RESTART_ONLY`).
    `ConfigError` if the result would be refused at start (`refuse_open_without_keys`: a file
    that moves `host` to loopback and drops the keys leaves brim where it listens, keyless)."""
    update: dict[str, Any] = {}
    changed: list[str] = []
    needs_restart: list[str] = []
    for section in BrimConfig.model_fields:
        now, new = getattr(running, section), getattr(loaded, section)
        if now == new:
            continue
        fixed = RESTART_ONLY.get(section, ())
        if fixed is None:
            needs_restart.append(section)
            continue
        waiting = [key for key in fixed if getattr(now, key) != getattr(new, key)]
        needs_restart += [f"{section}.{key}" for key in waiting]
        if waiting:
            new = new.model_copy(update={key: getattr(now, key) for key in waiting})
        if new != now:
            update[section] = new
            changed.append(section)
    config = running.model_copy(update=update)
    refuse_open_without_keys(config)
    return ReloadPlan(config, tuple(changed), tuple(needs_restart))


class Generations:
    """The `Serving` new requests get (`current`), and those requests still hold after reloads
    replaced them. Each request enters the generation it starts in and leaves it when its reply
    is done (`proxy.app.front_door`); the adapters a reload left behind are closed once every
    earlier generation is empty. Event loop only."""

    def __init__(self, serving: Serving) -> None:
        self.current = serving
        self._earlier: list[Serving] = []
        self._retired: list[Adapter] = []
        self._closing: set[asyncio.Task[None]] = set()

    def swap(self, serving: Serving) -> None:
        """Serve the next requests with `serving`."""
        earlier, self.current = self.current, serving
        kept = {id(adapter) for adapter in serving.upstreams.adapters.values()}
        self._retired += [a for a in earlier.upstreams.adapters.values() if id(a) not in kept]
        self._earlier.append(earlier)
        self._settle()

    def left(self, serving: Serving) -> None:
        """A request of `serving` is done."""
        serving.in_use -= 1
        if not serving.in_use and serving is not self.current:
            self._settle()

    def _settle(self) -> None:
        self._earlier = [serving for serving in self._earlier if serving.in_use]
        if self._earlier or not self._retired:
            return
        retired, self._retired = self._retired, []
        task = asyncio.get_running_loop().create_task(_close(retired))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """The app stops: close every adapter, current and retired."""
        for task in list(self._closing):
            await task
        retired, self._retired = self._retired, []
        await _close(retired)
        await self.current.upstreams.aclose()


async def _close(adapters: list[Adapter]) -> None:
    for adapter in adapters:
        try:
            await adapter.aclose()
        except Exception:
            log.exception("could not close a retired upstream adapter")


class Reloader:
    """Reloads one app's configuration from `source`: `rebuild` makes the `Serving` of a new
    configuration from the running one (`proxy.app.reconfigured`). `supervisor`: the pid of the
    `brim serve --workers` supervisor this app is a worker of (a reload asked over HTTP goes to
    it, and so to every worker), else None."""

    def __init__(
        self,
        source: ConfigSource,
        generations: Generations,
        rebuild: Callable[[BrimConfig, Serving], Serving],
        *,
        supervisor: int | None = None,
    ) -> None:
        self.source = source
        self.generations = generations
        self.rebuild = rebuild
        self.supervisor = supervisor
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[ReloadPlan | None]] = set()

    async def plan(self) -> ReloadPlan:
        """What a reload would do now (`ConfigError` if the file is unusable)."""
        loaded, _ = await asyncio.to_thread(self.source.load)
        return plan_reload(self.generations.current.config, loaded)

    def request(self) -> None:
        """Reload soon, on the event loop (SIGHUP's handler)."""
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> ReloadPlan | None:
        """Read the file and apply it; None (and a log line saying why) if nothing was."""
        async with self._lock:  # one at a time: each applies over what the last one made
            running = self.generations.current
            try:
                loaded, warnings = await asyncio.to_thread(self.source.load)
                plan = plan_reload(running.config, loaded)
            except ConfigError as exc:
                log.error(
                    "reload: %s cannot be used, the running configuration stays: %s",
                    self.source.name,
                    exc,
                )
                return None
            for warning in warnings:
                log.warning("reload: %s", warning)
            for key in plan.needs_restart:
                log.warning("reload: %s changed; that takes effect at the next restart", key)
            if not plan.changed:
                log.info("reload: %s: nothing to change", self.source.name)
                return plan
            try:
                serving = self.rebuild(plan.config, running)
            except Exception:
                log.exception(
                    "reload: could not apply %s, the running configuration stays",
                    self.source.name,
                )
                return None
            self.generations.swap(serving)
            log.info(
                "reload: %s applied (%s); requests in flight finish as they started",
                self.source.name,
                ", ".join(plan.changed),
            )
            return plan

    async def aclose(self) -> None:
        for task in list(self._tasks):
            await task
