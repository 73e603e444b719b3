"""`brim serve --workers N`: N processes serving one port, kept running by a supervisor.

The supervisor (the process `brim serve` started as) binds the port, forks the workers, and then
only watches them. Each worker is a whole brim — the same app, event loop and graceful shutdown
as a single process — serving either its own SO_REUSEPORT socket of the port's group or the one
listening socket the supervisor shares (see `proxy.listen`). A worker listens only once its app
is set up, so a connection never reaches one that cannot serve it yet.

- The supervisor prints `brim listening on …` when every worker is serving; a worker that exits
  before it got there stops the start (exit 1).
- A worker that dies later is logged (its exit code or signal) and started again, after 0.25 s,
  doubling while it keeps dying within `STABLE_AFTER_S` of its start, at most `MAX_DELAY_S`.
- SIGTERM or SIGINT to the supervisor: it closes its sockets and passes SIGTERM on; each worker
  stops taking connections and lets its requests finish within `[server] shutdown_timeout_s`;
  a worker still running `STOP_GRACE_S` after that is killed. No worker outlives the
  supervisor: each watches a pipe only the supervisor holds open, and stops when it closes.
- SIGHUP to the supervisor (or `POST /admin/reload` to any worker, which sends it): it reads
  the configuration file again; if it is usable, it keeps it for the workers it starts from
  then on and passes SIGHUP to every worker, which reloads it (`proxy.reload`). If not, it
  says why and changes nothing.
- Metrics: the workers write theirs to one directory, `PROMETHEUS_MULTIPROC_DIR` or a private
  one for the run, and every worker's `/metrics` reports all of them (see `proxy.multiproc`).
- Learned limits: without `[cache] url` the workers share them through files in a directory
  private to the run (`middleware.services.learned.WorkerFiles`), so that every worker compresses to
  a window one of them learned, `GET /admin/limits` lists them all whichever worker answers, and
  `brim limits forget` reaches every worker within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from brim.middleware.services.learned import WorkerGroup

# Loaded here, before the workers are forked: they share it instead of each importing it.
from brim.proxy.app import (
    RELOAD_SIGNAL,
    SERVING_SIGNALS,
    loop_factory,
    run_until_stopped,
    start,
)
from brim.proxy.config import BrimConfig, ConfigError
from brim.proxy.listen import Listener, open_listener, socket_mode
from brim.proxy.multiproc import MetricsShare, forget_worker, prepare_directory
from brim.proxy.reload import ConfigSource, plan_reload

log = logging.getLogger("brim.workers")

FIRST_DELAY_S = 0.25
MAX_DELAY_S = 30.0
STABLE_AFTER_S = 10.0  # a worker that ran this long before it died starts its backoff afresh
START_TIMEOUT_S = 60.0  # for every worker to be serving, at start
STOP_GRACE_S = 5.0  # beyond shutdown_timeout_s, before a worker that will not stop is killed
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def restart_delay(quick_deaths: int) -> float:
    """Seconds before a dead worker starts again, after `quick_deaths` (≥ 1) deaths in a row of
    its slot, each within `STABLE_AFTER_S` of its start: 0.25, 0.5, 1, 2, … at most 30."""
    return float(min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** max(0, quick_deaths - 1)))


def describe_exit(exitcode: int | None) -> str:
    """A worker's end as a log line says it: "exited with code 3", "was killed by signal 9
    (SIGKILL)" (multiprocessing reports a signal as its negative number)."""
    if exitcode is None:
        return "is still running"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"was killed by signal {-exitcode}"
    return f"was killed by signal {-exitcode} ({name})"


@dataclass
class Slot:
    """One of the N places a worker serves in, across the workers that fill it in turn."""

    index: int
    process: BaseProcess | None = None
    token: str = ""  # names the running worker's metrics files
    started: float = 0.0
    starts: int = 0
    ready: bool = False
    quick_deaths: int = 0
    restart_at: float | None = None  # when a dead worker is due to start again


@dataclass
class Pipes:
    """The supervisor's pipes: workers say they are serving on `ready`; `lifeline` is written
    by nobody and closes when the supervisor exits; `wake` is its own signal wake-up pipe."""

    ready_r: int
    ready_w: int
    lifeline_r: int
    lifeline_w: int
    wake_r: int
    wake_w: int
    buffer: bytes = field(default=b"")

    @classmethod
    def open(cls) -> Pipes:
        ready_r, ready_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        wake_r, wake_w = os.pipe()
        for fd in (ready_r, wake_r, wake_w):
            os.set_blocking(fd, False)
        return cls(ready_r, ready_w, lifeline_r, lifeline_w, wake_r, wake_w)

    def supervisor_only(self) -> tuple[int, ...]:
        """The ends a worker closes as it starts (it must not hold the lifeline open)."""
        return (self.ready_r, self.lifeline_w, self.wake_r, self.wake_w)

    def close(self) -> None:
        for fd in (*self.supervisor_only(), self.ready_w, self.lifeline_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def ready_messages(self) -> list[tuple[int, int]]:
        """The (slot, pid) of each worker that said it is serving since the last call."""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.ready_r, 4096):
                self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        messages = []
        for line in lines:
            slot, pid = line.split()
            messages.append((int(slot), int(pid)))
        return messages


class Supervisor:
    """The process `brim serve --workers N` runs as: it holds the port (`listener`) and keeps
    `count` workers serving it, until SIGTERM or SIGINT."""

    def __init__(
        self,
        config: BrimConfig,
        count: int,
        listener: Listener,
        metrics_dir: Path | None,
        group_dir: Path,
        source: ConfigSource | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.listener = listener
        self.metrics_dir = metrics_dir
        self.group_dir = group_dir
        self.slots = [Slot(index) for index in range(count)]
        self.pipes = Pipes.open()
        self.context = multiprocessing.get_context("fork")
        self.spawned = 0
        self.stop_signal: int | None = None
        self.reload_asked = False

    # -- the supervisor's loop --------------------------------------------------------------

    def run(self) -> int:
        """Start the workers, keep them running until SIGTERM or SIGINT, stop them; the exit
        status of `brim serve`."""
        previous = {signum: signal.signal(signum, self._on_signal) for signum in SERVING_SIGNALS}
        previous_wakeup = signal.set_wakeup_fd(self.pipes.wake_w)
        try:
            failed = self._start_all()
            if failed is not None:
                return failed
            host = self.listener.host
            print(
                f"brim listening on http://{host}:{self.listener.port} "
                f"({len(self.slots)} workers, {self.listener.mode})",
                flush=True,
            )
            while self.stop_signal is None:
                self._watch(self._next_restart_in())
                self._restart_due()
                if self.reload_asked and self.stop_signal is None:
                    self.reload_asked = False
                    self._reload()
            log.info("%s: stopping the workers", signal.Signals(self.stop_signal).name)
            return self._stop_all()
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.listener.close()
            self.pipes.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == RELOAD_SIGNAL:
            self.reload_asked = True
        elif self.stop_signal is None:
            self.stop_signal = signum

    def _reload(self) -> None:
        """Read the configuration again; if it is usable, keep it for the workers started
        from now on and pass SIGHUP to the running ones (each reloads it itself)."""
        if self.source is None:
            log.warning("SIGHUP: no configuration source to reload from")
            return
        try:
            loaded, _ = self.source.load()  # (each worker logs the warnings)
            planned = plan_reload(self.config, loaded).config
        except ConfigError as exc:
            log.error(
                "reload: %s cannot be used, the workers keep the running configuration: %s",
                self.source.name,
                exc,
            )
            return
        self.config = planned
        running = [slot.process for slot in self.slots if slot.process is not None]
        log.info("reload: %s: reloading %d workers", self.source.name, len(running))
        for process in running:
            if process.pid is not None and process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, RELOAD_SIGNAL)

    def _start_all(self) -> int | None:
        """Start every worker and wait until all are serving (None). If one ends first (or they
        take longer than START_TIMEOUT_S), stop the others: 1; if brim is asked to stop
        meanwhile, stop them all: the exit status."""
        for slot in self.slots:
            self._spawn(slot)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(slot.ready for slot in self.slots):
            if self.stop_signal is not None:
                return self._stop_all()
            if self._watch(max(0.0, deadline - time.monotonic()), restart=False):
                self._stop_all()
                return 1
            if time.monotonic() >= deadline:
                log.error("the workers were not all serving within %g s; stopping", START_TIMEOUT_S)
                self._stop_all()
                return 1
        return None

    def _watch(self, timeout: float | None, *, restart: bool = True) -> bool:
        """Wait up to `timeout` for a signal, a worker's readiness or a worker's end, and deal
        with what came: True if a worker ended (restarted in time if `restart`)."""
        sentinels = {slot.process.sentinel: slot for slot in self.slots if slot.process is not None}
        woken = multiprocessing.connection.wait(
            [self.pipes.wake_r, self.pipes.ready_r, *sentinels], timeout
        )
        if self.pipes.wake_r in woken:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.pipes.wake_r, 512):
                    pass
        if self.pipes.ready_r in woken:
            for index, pid in self.pipes.ready_messages():
                slot = self.slots[index]
                if slot.process is not None and slot.process.pid == pid:
                    slot.ready = True
                    if slot.starts > 1:
                        log.info("worker %d (pid %d) is serving again", index, pid)
        ended = False
        for sentinel, slot in sentinels.items():
            if sentinel in woken:
                ended = True
                self._ended(slot, restart=restart)
        return ended

    def _ended(self, slot: Slot, *, restart: bool) -> None:
        """A worker has exited: say so, and (`restart`) start its slot again after a delay."""
        process = slot.process
        assert process is not None
        process.join()
        lived = time.monotonic() - slot.started
        if self.metrics_dir is not None:
            forget_worker(self.metrics_dir, slot.token)
        slot.process, slot.ready = None, False
        if not restart:
            log.error(
                "worker %d (pid %d) %s before it was serving; stopping",
                slot.index,
                process.pid,
                describe_exit(process.exitcode),
            )
            process.close()
            return
        if self.stop_signal is not None:  # stopping anyway: said in `_stop_all`'s terms
            log.warning(
                "worker %d (pid %d) %s", slot.index, process.pid, describe_exit(process.exitcode)
            )
            process.close()
            return
        slot.quick_deaths = slot.quick_deaths + 1 if lived < STABLE_AFTER_S else 1
        delay = restart_delay(slot.quick_deaths)
        slot.restart_at = time.monotonic() + delay
        log.error(
            "worker %d (pid %d) %s after %.1f s; starting it again in %g s%s",
            slot.index,
            process.pid,
            describe_exit(process.exitcode),
            lived,
            delay,
            f" ({slot.quick_deaths} quick deaths in a row)" if slot.quick_deaths > 1 else "",
        )
        process.close()

    def _next_restart_in(self) -> float | None:
        due = [slot.restart_at for slot in self.slots if slot.restart_at is not None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now and self.stop_signal is None:
                slot.restart_at = None
                self._spawn(slot)

    # -- starting and stopping workers ------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        generation = self.spawned
        self.spawned += 1
        process = self.context.Process(
            target=_worker,
            args=(
                self.config,
                slot.index,
                generation,
                self.listener,
                self.metrics_dir,
                self.group_dir,
                self.pipes,
                Supervision(os.getpid(), self.source),
            ),
            name=f"brim-worker-{slot.index}",
        )
        # Blocked across the fork: the worker installs its own handlers, then takes them.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVING_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        slot.process, slot.ready, slot.started = process, False, time.monotonic()
        slot.starts += 1
        slot.token = _metrics_token(process.pid or 0, generation)

    def _stop_all(self) -> int:
        """SIGTERM to every worker, and wait: 0 if all stopped cleanly, else 1."""
        self.listener.close()  # nothing new waits on the supervisor's sockets
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None and slot.process.exitcode is None:
                slot.process.terminate()
        deadline = time.monotonic() + self.config.server.shutdown_timeout_s + STOP_GRACE_S
        clean = True
        for slot in self.slots:
            process = slot.process
            if process is None:
                continue
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                log.error(
                    "worker %d (pid %d) did not stop in time: killing it", slot.index, process.pid
                )
                process.kill()
                process.join()
            if process.exitcode != 0:
                clean = False
                log.error(
                    "worker %d (pid %d) %s",
                    slot.index,
                    process.pid,
                    describe_exit(process.exitcode),
                )
            if self.metrics_dir is not None:
                forget_worker(self.metrics_dir, slot.token)
            slot.process = None
            process.close()
        return 0 if clean else 1


def _metrics_token(pid: int, generation: int) -> str:
    """Unique per worker for the run, even should a pid come round again."""
    return f"{pid}-{generation}"


@dataclass(frozen=True)
class Supervision:
    """What a worker knows of its supervisor: its pid (a reload asked of the worker goes there)
    and where the configuration is reloaded from."""

    pid: int
    source: ConfigSource | None


def _worker(
    config: BrimConfig,
    index: int,
    generation: int,
    listener: Listener,
    metrics_dir: Path | None,
    group_dir: Path,
    pipes: Pipes,
    supervision: Supervision,
) -> None:
    """A worker's life, in the forked child: serve until told to stop."""
    for fd in pipes.supervisor_only():
        os.close(fd)
    signal.set_wakeup_fd(-1)
    for signum in SERVING_SIGNALS:  # still blocked: `run_until_stopped` takes them
        signal.signal(signum, signal.SIG_DFL)
    if listener.mode == "reuse_port":
        listener.close()  # the supervisor's reservation: this worker binds its own socket
    token = _metrics_token(os.getpid(), generation)
    share = None if metrics_dir is None else MetricsShare(metrics_dir, token)
    group = WorkerGroup(group_dir, token)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve(config, index, listener, share, group, pipes, supervision))


async def _serve(
    config: BrimConfig,
    index: int,
    listener: Listener,
    share: MetricsShare | None,
    group: WorkerGroup,
    pipes: Pipes,
    supervision: Supervision,
) -> None:
    shared = listener.sockets if listener.mode == "shared" else ()
    runner = await start(
        config,
        listener.host,
        listener.port,
        sockets=shared,
        reuse_port=listener.mode == "reuse_port",
        metrics_share=share,
        group=group,
        source=supervision.source,
        supervisor=supervision.pid,
    )
    os.write(pipes.ready_w, f"{index} {os.getpid()}\n".encode())
    os.close(pipes.ready_w)
    await run_until_stopped(runner, lifeline=pipes.lifeline_r)


def serve_workers(config: BrimConfig, count: int, source: ConfigSource | None = None) -> int:
    """`brim serve` with `count` (≥ 2) workers; returns its exit status. `source`: where the
    configuration is reloaded from on SIGHUP."""
    server = config.server
    listener = open_listener(server.host, server.port, socket_mode(server.worker_socket))
    metrics_dir, private = None, False
    # Where the workers share learned limits when there is no Redis: private to the run.
    group_dir = Path(tempfile.mkdtemp(prefix="brim-workers-"))
    try:
        if config.telemetry.prometheus:
            metrics_dir, private = _metrics_directory()
        return Supervisor(config, count, listener, metrics_dir, group_dir, source).run()
    finally:
        listener.close()
        shutil.rmtree(group_dir, ignore_errors=True)
        if private and metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _metrics_directory() -> tuple[Path, bool]:
    """`$PROMETHEUS_MULTIPROC_DIR` (emptied of an earlier run's files), or a private directory
    for this run (True: removed at the end)."""
    named = os.environ.get(METRICS_DIR_ENV)
    if not named:
        return Path(tempfile.mkdtemp(prefix="brim-metrics-")), True
    directory = Path(named)
    try:
        prepare_directory(directory)
    except OSError as exc:
        raise ConfigError(f"{METRICS_DIR_ENV}={named}: cannot use it for metrics: {exc}") from None
    return directory, False
