"""`brim serve --workers N` as a user runs it: a real supervisor and real worker processes on a
real port, in front of a fake provider, driven by the official openai SDK and plain HTTP.

Which worker served a connection is read from the kernel (/proc), not from brim: the process
holding the server side of the TCP connection. So these tests run on Linux only.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from bench.procs import children
from brim.proxy.workers import describe_exit, restart_delay
from tests.fakes import FakeProvider, LoopThread, start_app, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

REPO = Path(__file__).parents[2]
# `python -m brim.proxy` from this checkout, whatever the virtualenv has installed
PYTHONPATH = os.pathsep.join(
    p for p in (str(REPO / ".pythonpath"), os.environ.get("PYTHONPATH")) if p
)
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


# -- who holds which socket (from /proc) -------------------------------------------------------


def tcp_connections() -> dict[str, tuple[int, int]]:
    """Every TCP socket on the machine: inode → (local port, remote port)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                found[inode] = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
    return found


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def owner(local: int, remote: int | None, pids: list[int]) -> int | None:
    """The process among `pids` holding the TCP socket from port `local` to port `remote`
    (None: any remote)."""
    wanted = {
        inode
        for inode, ports in tcp_connections().items()
        if ports[0] == local and (remote is None or ports[1] == remote)
    }
    for pid in pids:
        if wanted & socket_inodes(pid):
            return pid
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- a fake provider that notes which connection each request came on --------------------------


@dataclass
class Upstream:
    provider: FakeProvider
    peers: list[int] = field(default_factory=list)  # brim's local port, per request


@pytest.fixture(scope="module")
def upstream(loop_thread: LoopThread) -> Iterator[Upstream]:
    provider = FakeProvider()
    noted = Upstream(provider)

    @web.middleware
    async def note_peer(request: web.Request, handler: Any) -> web.StreamResponse:
        assert request.transport is not None
        noted.peers.append(request.transport.get_extra_info("peername")[1])
        response: web.StreamResponse = await handler(request)
        return response

    app = provider.app()
    app.middlewares.append(note_peer)
    runner, url = loop_thread.run(start_app(app))
    provider.url = url
    yield noted
    loop_thread.run(runner.cleanup())


@pytest.fixture
def fake(upstream: Upstream) -> Upstream:
    upstream.provider.reset()
    upstream.peers.clear()
    return upstream


# -- brim with workers, as a process ----------------------------------------------------------


@dataclass
class Served:
    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def workers(self) -> list[int]:
        """The processes that serve: the workers, or brim itself when it is one process."""
        return children(self.process.pid) or [self.process.pid]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_of(self, client_port: int) -> int | None:
        """The worker that accepted the connection from `client_port` (once it has)."""
        found: list[int | None] = [None]

        def accepted() -> bool:
            found[0] = owner(self.port, client_port, self.workers())
            return found[0] is not None

        wait_for(accepted, timeout=5)
        return found[0]

    def connection_to_each_worker(self) -> dict[int, http.client.HTTPConnection]:
        """One open keep-alive connection per worker, keyed by the worker's pid."""
        workers = self.workers()
        connections: dict[int, http.client.HTTPConnection] = {}
        for _ in range(64):
            if len(connections) == len(workers):
                return connections
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            connection.connect()
            assert connection.sock is not None
            pid = self.worker_of(connection.sock.getsockname()[1])
            if pid is None or pid in connections:
                connection.close()
            else:
                connections[pid] = connection
        raise AssertionError(f"64 connections did not reach every worker of {workers}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def serve(
    tmp_path: Path,
    fake: Upstream,
    *,
    workers: int = 2,
    server: str = "",
    env: dict[str, str] | None = None,
    config_text: str | None = None,
) -> Served:
    """`python -m brim.proxy serve --workers N` on a free port, in front of `fake` (or with
    `config_text` as its proxy.toml, in tmp_path), from this checkout; returns once it says it
    is listening."""
    config = tmp_path / "proxy.toml"
    config.write_text(
        config_text
        or f'[upstreams.fake]\napi = "openai"\nbase_url = "{fake.provider.url}/v1"\n'
        '[models."fake-model"]\ncontext_window = 128000\nmax_output = 4096\n'
        f"[server]\n{server}\n"
    )
    log_path = tmp_path / "brim.log"
    scratch = tmp_path / "tmp"  # brim's temporary files (the workers' metrics), not /tmp's
    scratch.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "brim.proxy", "serve", "--config", str(config), "--port", "0"]
    process = subprocess.Popen(
        [*argv, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=log_path.open("w"),
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "TMPDIR": str(scratch), **(env or {})},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)(?: \((\d+) workers)?", line)
    assert match, (line, log_path.read_text())
    assert int(match.group(2) or 1) == workers
    return Served(process, int(match.group(1)), log_path)


def start(launched: list[Served], tmp_path: Path, fake: Upstream, **options: Any) -> Served:
    served = serve(tmp_path, fake, **options)
    launched.append(served)
    assert len(served.workers()) == options.get("workers", 2)
    return served


def no_keepalive_sdk(served: Served) -> openai.OpenAI:
    """The openai SDK on a new connection per request, so the kernel spreads them."""
    client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30)
    return openai.OpenAI(
        base_url=f"{served.url}/v1", api_key="sk-workers", max_retries=0, http_client=client
    )


def totals(text: str) -> dict[str, float]:
    """The sum over all series of each sample name in a Prometheus exposition."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def get(connection: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    connection.request("GET", path)
    reply = connection.getresponse()
    return reply.status, reply.read()


# -- the tests ----------------------------------------------------------------------------------


def test_two_workers_serve_the_sdk_from_both_and_every_scrape_reports_all_of_them(
    tmp_path: Path, fake: Upstream, launched: list[Served]
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    # A file an earlier run left behind: were it read, every total would be 1 000 too high.
    stale = MmapedDict(str(metrics_dir / "counter_999-0.db"))
    labels = {"model": "fake-model", "outcome": "ok", "route": "openai.chat"}
    key = mmap_key("brim_requests", "brim_requests_total", list(labels), list(labels.values()), "")
    stale.write_value(key, 1000.0, 0.0)
    stale.close()
    served = start(launched, tmp_path, fake, env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    workers = served.workers()

    requests = 30
    with no_keepalive_sdk(served) as sdk:
        for _ in range(requests):
            reply = sdk.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            assert reply.choices[0].message.content == "pong"
    assert len(fake.peers) == requests
    # Each worker forwards on its own pooled connections: who holds them says who served.
    served_by = {port: owner(port, None, workers) for port in set(fake.peers)}
    assert None not in served_by.values(), served_by
    assert set(served_by.values()) == set(workers)

    # Every scrape, whichever worker answers it, reports every worker's requests.
    connections = served.connection_to_each_worker()

    def scraped(pid: int) -> dict[str, float]:
        status, body = get(connections[pid], "/metrics")
        assert status == 200
        return totals(body.decode())

    assert wait_for(
        lambda: all(scraped(pid).get("brim_requests_total") == requests for pid in workers),
        timeout=10,
    ), [scraped(pid) for pid in workers]
    for _ in range(3):
        for pid in workers:
            figures = scraped(pid)
            assert figures["brim_requests_total"] == requests
            assert figures["brim_latency_added_seconds_count"] == requests
            assert figures["brim_latency_upstream_seconds_count"] == requests
            assert figures["target_info"] == 1  # one series for the group, not one per worker
    for connection in connections.values():
        connection.close()

    # A second brim on the same port would join the SO_REUSEPORT group and take half of the
    # connections without a word: it is refused instead.
    second = run_brim(
        "serve", "--config", "/dev/null", "--port", str(served.port), "--workers", "2"
    )
    assert second.returncode == 1
    assert second.stderr.splitlines()[-1] == (
        f"brim: cannot listen on 127.0.0.1:{served.port}: address already in use"
    )
    assert served.stop() == 0


def test_every_worker_is_ready_and_sigterm_lets_each_ones_stream_finish(
    tmp_path: Path, fake: Upstream, launched: list[Served]
) -> None:
    served = start(launched, tmp_path, fake, server="shutdown_timeout_s = 15")
    workers = served.workers()
    connections = served.connection_to_each_worker()
    idle = served.connection_to_each_worker()  # kept alive, for after the SIGTERM
    for connection in [*connections.values(), *idle.values()]:
        assert get(connection, "/readyz") == (200, b'{"status": "ready"}')

    # A streamed request in flight on every worker, held open by the provider.
    body = httpx.Request("POST", "/", json={**CHAT, "model": "gated-stream", "stream": True})
    replies = {}
    for pid, connection in connections.items():
        connection.request(
            "POST", "/v1/chat/completions", body.read(), {"Content-Type": "application/json"}
        )
        replies[pid] = connection.getresponse()
        assert replies[pid].status == 200
        assert replies[pid].read1(65536).startswith(b"data: ")
    served.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(httpx.ConnectError):  # no worker takes a new connection
        httpx.get(f"{served.url}/readyz", timeout=5)
    for connection in idle.values():  # and a stopping worker is not ready on an old one
        try:
            said = get(connection, "/readyz")
        except (ConnectionError, http.client.HTTPException) as exc:
            said = (0, repr(exc).encode())
        assert said[0] != 200, said
    fake.provider.gate.set()
    for pid, reply in replies.items():
        rest = reply.read()
        assert rest.rstrip().endswith(b"data: [DONE]"), (pid, rest)
    assert fake.provider.gate_timed_out is False
    assert served.process.wait(timeout=30) == 0
    assert wait_for(lambda: not any(alive(pid) for pid in workers), timeout=5)
    # The port is free: nothing listens, and a new server can bind it.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served.port), timeout=2)
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", served.port))
        again.listen()
    assert "SIGTERM: stopping the workers" in served.log()
    metrics = list((tmp_path / "tmp").glob("brim-metrics-*"))
    assert metrics == [], "the workers' private metrics directory outlived brim"


def test_a_killed_worker_is_restarted_with_a_backoff_and_requests_keep_succeeding(
    tmp_path: Path, fake: Upstream, launched: list[Served]
) -> None:
    served = start(launched, tmp_path, fake)
    first, second = served.workers()
    os.kill(first, signal.SIGKILL)
    # Gone (its sockets closed with it): what was in flight there is lost, nothing after.
    assert wait_for(lambda: not alive(first), timeout=5)
    sdk = no_keepalive_sdk(served)
    for _ in range(10):  # while it is down, and as it comes back
        assert sdk.chat.completions.create(**CHAT).choices[0].message.content == "pong"  # type: ignore[call-overload]
    assert wait_for(lambda: "is serving again" in served.log(), timeout=10), served.log()
    log = served.log()
    assert re.search(
        rf"worker \d \(pid {first}\) was killed by signal 9 \(SIGKILL\) after [\d.]+ s; "
        r"starting it again in 0.25 s",
        log,
    ), log
    workers = served.workers()
    assert second in workers and first not in workers and len(workers) == 2
    replacement = next(pid for pid in workers if pid != second)

    os.kill(replacement, signal.SIGKILL)  # dying again soon after its start: a longer wait
    assert wait_for(lambda: not alive(replacement), timeout=5)
    assert wait_for(
        lambda: log.count("is serving again") < served.log().count("is serving again"), timeout=10
    )
    assert re.search(
        rf"\(pid {replacement}\) was killed by signal 9 \(SIGKILL\) after [\d.]+ s; "
        r"starting it again in 0.5 s \(2 quick deaths in a row\)",
        served.log(),
    ), served.log()
    for _ in range(10):
        assert sdk.chat.completions.create(**CHAT).choices[0].message.content == "pong"  # type: ignore[call-overload]
    sdk.close()
    assert len(served.workers()) == 2
    assert served.stop() == 0


def test_a_shared_socket_serves_from_every_worker_too(
    tmp_path: Path, fake: Upstream, launched: list[Served]
) -> None:
    served = start(launched, tmp_path, fake, server='worker_socket = "shared"')
    workers = served.workers()
    connections = served.connection_to_each_worker()
    assert set(connections) == set(workers)
    for connection in connections.values():
        assert get(connection, "/readyz")[0] == 200
        connection.request(
            "POST",
            "/v1/chat/completions",
            httpx.Request("POST", "/", json=CHAT).read(),
            {"Content-Type": "application/json"},
        )
        assert connection.getresponse().read().count(b"pong") == 1
        connection.close()
    assert served.stop() == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served.port), timeout=2)


def run_brim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m brim.proxy ARGS` from this checkout, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "brim.proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})},
    )


def test_a_bad_workers_value_is_refused_before_anything_starts() -> None:
    for args, extra, said in (
        (["--workers", "0"], {}, "argument --workers: must be a whole number from 1 to 1024"),
        (
            [],
            {"BRIM_SERVER__WORKERS": "lots"},
            "environment variable BRIM_SERVER__WORKERS: "
            'server.workers: must be a whole number from 1 to 1024, or "auto"',
        ),
    ):
        result = run_brim("serve", "--config", "/dev/null", "--port", "0", *args, env=extra)
        assert result.returncode == 2, result.stderr
        assert said in result.stderr
        assert result.stdout == ""


def test_workers_stop_by_themselves_when_the_supervisor_is_killed(
    tmp_path: Path, fake: Upstream, launched: list[Served]
) -> None:
    served = start(launched, tmp_path, fake)
    workers = served.workers()
    served.process.kill()  # no SIGTERM to pass on: the workers notice the supervisor is gone
    served.process.wait(10)
    assert wait_for(lambda: not any(alive(pid) for pid in workers), timeout=15), served.log()
    assert served.log().count("the supervisor of this worker is gone: stopping") == 2
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served.port), timeout=2)


def test_the_restart_backoff_doubles_up_to_a_cap_and_exits_are_described() -> None:
    assert [restart_delay(n) for n in range(1, 10)] == [0.25, 0.5, 1, 2, 4, 8, 16, 30, 30]
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-15) == "was killed by signal 15 (SIGTERM)"
