"""Reloading proxy.toml while brim runs: `kill -HUP`, `brim reload` (`POST /admin/reload`), in
one process and under `brim serve --workers 2`, with a stream in flight; and what a reload may
change (`plan_reload`)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from brim.proxy.app import bound_port, start
from brim.proxy.config import BrimConfig, ConfigError
from brim.proxy.keys import GENERATIONS, RELOADER
from brim.proxy.reload import ConfigSource, plan_reload
from tests.fakes import FakeProvider, LoopThread, wait_for
from tests.proxy import test_workers
from tests.proxy.test_workers import Served, Upstream

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

REPO = Path(__file__).parents[2]
PYTHONPATH = os.pathsep.join(
    p for p in (str(REPO / ".pythonpath"), os.environ.get("PYTHONPATH")) if p
)
ADMIN = "reload-admin-key-0123456789"
HELLO = [{"role": "user", "content": "ping"}]
RESTART = "takes effect at the next restart"


# -- what a reload changes ---------------------------------------------------------------------


def test_a_reload_applies_what_can_change_live_and_keeps_the_rest_until_a_restart() -> None:
    running = BrimConfig.model_validate(
        {"server": {"port": 8787, "workers": 2}, "models": {"m": {"context_window": 60_000}}}
    )
    loaded = BrimConfig.model_validate(
        {
            "server": {"port": 9000, "workers": 4, "max_json_depth": 20},
            "models": {"m": {"context_window": 30_000}},
            "routes": {"*": "openai"},
            "guard": {"low_water": 0.7, "loop_limit": 9},
            "telemetry": {"traces": "console"},
        }
    )
    plan = plan_reload(running, loaded)
    assert plan.changed == ("server", "routes", "models", "guard")
    assert plan.needs_restart == ("server.port", "server.workers", "guard.loop_limit", "telemetry")
    config = plan.config
    assert (config.server.port, config.server.workers, config.server.max_json_depth) == (
        8787,
        2,
        20,
    )
    assert config.models["m"].context_window == 30_000 and config.routes == {"*": "openai"}
    assert (config.guard.low_water, config.guard.loop_limit) == (0.7, running.guard.loop_limit)
    assert config.telemetry == running.telemetry

    assert plan_reload(running, running).changed == ()
    only_later = plan_reload(running, running.model_copy(update={"telemetry": loaded.telemetry}))
    assert (only_later.changed, only_later.needs_restart) == ((), ("telemetry",))


def test_the_edge_owners_and_fallbacks_are_live_the_admission_gate_and_shared_ratios_wait() -> None:
    running = BrimConfig()
    loaded = BrimConfig.model_validate(
        {
            "server": {
                "allowed_origins": ["http://localhost:3000"],
                "allowed_hosts": ["brim.internal"],
                "metrics_public": True,
                "max_decompression_ratio": 10,
            },
            "guard": {"prefer_fallback": False, "learn_token_ratios": False},
        }
    )
    plan = plan_reload(running, loaded)
    assert plan.changed == ("server", "guard")
    assert plan.needs_restart == ("server.max_decompression_ratio", "guard.learn_token_ratios")
    server, guard = plan.config.server, plan.config.guard
    assert server.allowed_origins == ("http://localhost:3000",)
    assert server.allowed_hosts == ("brim.internal",) and server.metrics_public is True
    assert server.max_decompression_ratio == running.server.max_decompression_ratio
    assert guard.prefer_fallback is False and guard.learn_token_ratios is True


def test_a_reload_that_would_leave_brim_open_beyond_loopback_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`host` waits for a restart: a file that moves it to loopback and drops the keys would
    leave brim keyless where it listens now."""
    monkeypatch.setenv("RELOAD_API_KEYS", "client-key-0123456789")
    running = BrimConfig(server={"host": "0.0.0.0", "api_keys_env": "RELOAD_API_KEYS"})
    with pytest.raises(ConfigError, match="api_keys"):
        plan_reload(running, BrimConfig(server={"host": "127.0.0.1"}))
    assert plan_reload(running, running.model_copy()).changed == ()


def test_the_command_lines_server_keys_are_applied_to_what_is_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text("[server]\nport = 9000\nworkers = 3\n")
    config, _ = ConfigSource(str(path), {"port": 0, "workers": 2}).load()
    assert (config.server.port, config.server.workers) == (0, 2)


def config_text(provider: FakeProvider, window: int) -> str:
    return (
        f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
        f'[models."m-window"]\ncontext_window = {window}\nmax_output = 1000\n'
        '[server]\nadmin_keys_env = "RELOAD_ADMIN_KEYS"\n'
    )


# -- in one process: the adapters a reload replaces -------------------------------------------


def test_an_upstream_changed_under_a_stream_keeps_its_connection_until_the_stream_ends(
    tmp_path: Path, loop_thread: LoopThread, provider: FakeProvider
) -> None:
    """The stream goes on over the adapter it started with; the next request gets the new one;
    the old one closes once the stream is done (not before, which would cut it)."""
    path = tmp_path / "proxy.toml"
    upstream = f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
    path.write_text(upstream)
    source = ConfigSource(str(path))
    config, _ = source.load()
    runner = loop_thread.run(start(config, "127.0.0.1", 0, source=source))
    try:
        generations = runner.app[GENERATIONS]
        base = f"http://127.0.0.1:{bound_port(runner)}"
        oa = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
        before = generations.current.upstreams["fake"]
        stream = oa.chat.completions.create(model="gated-stream", messages=HELLO, stream=True)
        parts = [next(iter(stream)).choices[0].delta.content]

        path.write_text(upstream + "timeout_s = 300\n")
        assert loop_thread.run(runner.app[RELOADER].reload()) is not None
        after = generations.current.upstreams["fake"]
        assert after is not before
        oa.chat.completions.create(model="fake-model", messages=HELLO)  # on the new adapter
        assert before._session is not None and not before._session.closed  # type: ignore[attr-defined]

        provider.gate.set()
        parts += [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
        assert "".join(p for p in parts if p) == "Hello world"
        assert wait_for(lambda: before._session is None)  # type: ignore[attr-defined]
        assert after._session is not None  # type: ignore[attr-defined]
    finally:
        provider.gate.set()
        loop_thread.run(runner.cleanup())


def test_a_bad_file_is_logged_and_the_running_configuration_kept(
    tmp_path: Path,
    loop_thread: LoopThread,
    provider: FakeProvider,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELOAD_ADMIN_KEYS", ADMIN)
    path = tmp_path / "proxy.toml"
    path.write_text(config_text(provider, 60_000))
    source = ConfigSource(str(path))
    config, _ = source.load()
    runner = loop_thread.run(start(config, "127.0.0.1", 0, source=source))
    try:
        running = runner.app[GENERATIONS].current
        for bad in ("[models.\n", config_text(provider, -1)):  # not TOML; a bad value
            path.write_text(bad)
            assert loop_thread.run(runner.app[RELOADER].reload()) is None
            assert runner.app[GENERATIONS].current is running
        refusals = [r.getMessage() for r in caplog.records if r.name == "brim.reload"]
        assert len(refusals) == 2 and all("cannot be used" in line for line in refusals)
        assert "not valid TOML" in refusals[0] and "context_window" in refusals[1]
    finally:
        loop_thread.run(runner.cleanup())


def start_reloadable(
    loop_thread: LoopThread, path: Path, text: str
) -> tuple[web.AppRunner, str, Callable[[str], Any]]:
    """brim started from `path` (holding `text`) in this process: its runner, its URL, and a
    function that writes new text to the file and reloads it."""
    path.write_text(text)
    source = ConfigSource(str(path))
    config, _ = source.load()
    runner = loop_thread.run(start(config, "127.0.0.1", 0, source=source))

    def reload(new: str) -> Any:
        path.write_text(new)
        return loop_thread.run(runner.app[RELOADER].reload())

    return runner, f"http://127.0.0.1:{bound_port(runner)}", reload


def test_an_origin_listed_by_a_reload_gets_cors_from_the_next_request(
    tmp_path: Path, loop_thread: LoopThread, provider: FakeProvider
) -> None:
    page = "http://localhost:3000"
    upstream = f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
    runner, base, reload = start_reloadable(loop_thread, tmp_path / "proxy.toml", upstream)
    try:

        def from_the_page() -> httpx.Response:
            body = {"model": "fake-model", "messages": HELLO}
            return httpx.post(f"{base}/v1/chat/completions", json=body, headers={"Origin": page})

        refused = from_the_page()
        assert refused.status_code == 403 and "allowed_origins" in refused.text
        assert "access-control-allow-origin" not in refused.headers
        assert reload(upstream + f'[server]\nallowed_origins = ["{page}"]\n') is not None
        answered = from_the_page()
        assert answered.status_code == 200, answered.text
        assert answered.headers["access-control-allow-origin"] == page
        assert reload(upstream) is not None  # and unlisted again
        assert from_the_page().status_code == 403
    finally:
        loop_thread.run(runner.cleanup())


def test_a_model_alias_added_by_a_reload_names_what_was_learned_before(
    tmp_path: Path,
    loop_thread: LoopThread,
    provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The learned limits carry over, and the shared state reads ids by the new `[models]`:
    `brim limits forget` by an alias the reload added forgets the model's fact."""
    monkeypatch.setenv("RELOAD_ADMIN_KEYS", ADMIN)
    text = config_text(provider, 60_000)
    runner, base, reload = start_reloadable(loop_thread, tmp_path / "proxy.toml", text)
    try:
        services = runner.app[GENERATIONS].current.services
        assert services.limits.learn("m-window", 20_000)
        aliased = text.replace("max_output = 1000\n", 'max_output = 1000\naliases = ["mw"]\n')
        plan = reload(aliased)
        assert plan is not None and plan.changed == ("models",)
        reloaded = runner.app[GENERATIONS].current.services
        assert reloaded.limits is not services.limits
        assert reloaded.limits.resolve("mw").limits.context_window == 20_000
        admin = {"x-brim-admin-key": ADMIN}
        listed = httpx.get(f"{base}/admin/limits", headers=admin).json()
        assert [(row["model"], row["value"]) for row in listed["learned"]] == [("m-window", 20_000)]
        forgotten = httpx.delete(f"{base}/admin/limits/mw", headers=admin).json()
        assert [row["model"] for row in forgotten["forgotten"]] == ["m-window"]
        assert reloaded.limits.resolve("m-window").limits.context_window == 60_000
    finally:
        loop_thread.run(runner.cleanup())


# -- brim serve, as a user runs it ------------------------------------------------------------


def serve(launched: list[Served], tmp_path: Path, provider: FakeProvider, workers: int) -> Served:
    """`python -m brim.proxy serve` from this checkout, with a 60 000-token window for m-window."""
    return test_workers.start(
        launched,
        tmp_path,
        Upstream(provider),
        workers=workers,
        config_text=config_text(provider, 60_000),
        env={"RELOAD_ADMIN_KEYS": ADMIN},
    )


def connections(served: Served) -> list[http.client.HTTPConnection]:
    """One open keep-alive connection to each process that serves."""
    return list(served.connection_to_each_worker().values())


def config_of(served: Served) -> Path:
    return served.log_path.parent / "proxy.toml"


def budget(connection: http.client.HTTPConnection) -> int:
    """The budget brim gives m-window, on this connection's process."""
    body = json.dumps({"model": "m-window", "messages": HELLO})
    connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    reply = connection.getresponse()
    reply.read()
    assert reply.status == 200
    return int(reply.getheader("x-brim-budget") or 0)


def budgets(connections: list[http.client.HTTPConnection]) -> list[int]:
    return [budget(connection) for connection in connections]


def reload_command(served: Served) -> subprocess.CompletedProcess[str]:
    """`brim reload`, finding brim by the URL and the admin key in the environment."""
    return subprocess.run(
        [sys.executable, "-m", "brim.proxy", "reload", "--url", served.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=config_of(served).parent,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "BRIM_ADMIN_KEY": ADMIN},
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_applies_a_changed_window_to_the_next_request_with_a_stream_in_flight_unharmed(
    workers: int, launched: list[Served], tmp_path: Path, provider: FakeProvider
) -> None:
    served = serve(launched, tmp_path, provider, workers)
    processes = served.workers()
    open_to_each = connections(served)
    before = budgets(open_to_each)
    assert len(set(before)) == 1 and before[0] > 30_000

    provider.gate_timeout_s = 30  # the stream waits in the middle until the gate opens
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(model="gated-stream", messages=HELLO, stream=True)
    parts = [next(iter(stream)).choices[0].delta.content]  # the stream has started

    config_of(served).write_text(config_text(provider, 30_000))
    served.process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: max(budgets(open_to_each)) < 30_000, timeout=20), served.log()
    after = budgets(open_to_each)  # every process's next request has the new window
    assert len(set(after)) == 1 and after[0] < 30_000
    assert provider.gate_timed_out is None  # the stream is still waiting in the middle

    provider.gate.set()
    parts += [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
    assert "".join(p for p in parts if p) == "Hello world"
    assert provider.gate_timed_out is False
    assert served.process.poll() is None and served.workers() == processes  # none restarted
    assert RESTART not in served.log()  # the command line's --port and --workers still hold


def test_a_bad_file_is_refused_and_the_running_configuration_kept_then_brim_reload_applies_a_good_one(
    launched: list[Served], tmp_path: Path, provider: FakeProvider
) -> None:
    """With workers: the supervisor refuses the file (and the workers never see it), `brim
    reload` says why; a good file then reaches every worker."""
    served = serve(launched, tmp_path, provider, 2)
    processes = served.workers()
    open_to_each = connections(served)
    before = budgets(open_to_each)

    bad = config_text(provider, 30_000).replace("max_output = 1000", "max_output = -5")
    config_of(served).write_text(bad)
    refused = reload_command(served)
    assert refused.returncode == 1
    assert "answered 400" in refused.stderr and "max_output" in refused.stderr
    served.process.send_signal(signal.SIGHUP)  # the same file, by signal: said in the log
    assert wait_for(lambda: "cannot be used" in served.log(), timeout=20), served.log()
    assert "max_output" in served.log()
    assert budgets(open_to_each) == before
    assert served.process.poll() is None and served.workers() == processes

    config_of(served).write_text(config_text(provider, 30_000))
    applied = reload_command(served)
    assert applied.returncode == 0, applied.stderr
    assert "changes models" in applied.stderr
    assert wait_for(lambda: max(budgets(open_to_each)) < 30_000, timeout=20), served.log()
    assert served.workers() == processes


def test_the_reload_endpoint_needs_the_admin_key(
    launched: list[Served], tmp_path: Path, provider: FakeProvider
) -> None:
    served = serve(launched, tmp_path, provider, 1)
    refused = httpx.post(f"{served.url}/admin/reload", headers={"x-brim-admin-key": "wrong"})
    assert refused.status_code == 401
    answer: dict[str, Any] = httpx.post(
        f"{served.url}/admin/reload", headers={"x-brim-admin-key": ADMIN}
    ).json()
    assert answer == {"config": str(config_of(served)), "changes": [], "needs_restart": []}
    assert wait_for(lambda: "nothing to change" in served.log(), timeout=20), served.log()
