"""The `brim` command as a user runs it: a real process, real sockets."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from brim.proxy.commands import refuse_open_without_keys
from brim.proxy.config import BrimConfig, ConfigError
from tests.fakes import FakeProvider, wait_for

BRIM = str(Path(sys.executable).with_name("brim"))


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BRIM, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


@pytest.fixture
def served(tmp_path: Path, provider: FakeProvider) -> Iterator[str]:
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
        '[routes]\n"fake-*" = "fake"\n'
        "[server]\nbogus_key = 1\n"
    )
    process = subprocess.Popen(
        [BRIM, "serve", "--config", str(config), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    assert match, (line, process.stderr.read() if process.poll() is not None else "")
    try:
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        stderr = process.stderr.read()
        assert "unknown key 'server.bogus_key'" in stderr
        assert "sk-cli-client-key" not in stderr  # keys are never logged


def test_serve_proxies_for_the_openai_sdk(served: str, provider: FakeProvider) -> None:
    assert httpx.get(f"{served}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{served}/readyz").status_code == 200
    sdk = openai.OpenAI(base_url=f"{served}/v1", api_key="sk-cli-client-key", max_retries=0)
    reply = sdk.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "pong"
    assert provider.last.headers["authorization"] == "Bearer sk-cli-client-key"
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])


def test_check_config_prints_the_resolved_config_with_secrets_masked(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(
        '[upstreams.main]\napi = "openai"\nbase_url = "https://example.test/v1"\n'
        'api_key_env = "CLI_TEST_UPSTREAM_KEY"\n'
    )
    result = run("check-config", str(config), env={"CLI_TEST_UPSTREAM_KEY": "sk-secret-987654321"})
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert resolved["upstreams"]["main"]["base_url"] == "https://example.test/v1"
    assert resolved["upstreams"]["main"]["api_key"] == "sk-…4321"
    assert resolved["server"]["port"] == 8787
    assert "sk-secret-987654321" not in result.stdout + result.stderr


def test_check_config_refuses_a_bad_value_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text("[server]\nport = 99999\n")
    result = run("check-config", str(config))
    assert result.returncode == 2
    assert "server.port" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_to_start_on_a_bad_value(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('[upstreams.x]\napi = "openai"\nbase_url = "http://a"\n[routes]\n"*" = "y"\n')
    result = run("serve", "--config", str(config), "--port", "0")
    assert result.returncode == 2
    assert "routes" in result.stderr and "'y'" in result.stderr


def test_environment_override_reaches_serve(tmp_path: Path) -> None:
    result = run("check-config", "/dev/null", env={"BRIM_SERVER__PORT": "9123"})
    assert result.returncode == 0
    assert json.loads(result.stdout)["server"]["port"] == 9123


def test_serve_refuses_to_listen_beyond_loopback_without_keys(tmp_path: Path) -> None:
    result = run("serve", "--host", "0.0.0.0", "--port", "0", "--config", "/dev/null")
    assert result.returncode == 2
    assert "server.host" in result.stderr and "api_keys_env" in result.stderr


def test_check_config_refuses_what_serve_refuses(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\n')
    checked = run("check-config", str(config))
    assert checked.returncode == 2
    assert "server.host" in checked.stderr and "api_keys_env" in checked.stderr
    assert checked.stdout == ""  # no resolved config printed as if it were usable
    served = run("serve", "--config", str(config), "--port", "0")
    assert served.returncode == 2 and "server.host" in served.stderr
    allowed = run("check-config", str(config), env={"BRIM_SERVER__ALLOW_UNAUTHENTICATED": "true"})
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["server"]["host"] == "0.0.0.0"


def test_check_config_finds_its_config_as_serve_does(tmp_path: Path) -> None:
    (tmp_path / "proxy.toml").write_text("[server]\nport = 9101\n")
    named = tmp_path / "named.toml"
    named.write_text("[server]\nport = 9102\n")
    empty = tmp_path / "empty"
    empty.mkdir()

    in_cwd = run("check-config", cwd=tmp_path)  # ./proxy.toml
    assert in_cwd.returncode == 0, in_cwd.stderr
    assert json.loads(in_cwd.stdout)["server"]["port"] == 9101
    from_env = run("check-config", cwd=tmp_path, env={"BRIM_CONFIG": str(named)})
    assert from_env.returncode == 0, from_env.stderr
    assert json.loads(from_env.stdout)["server"]["port"] == 9102
    assert from_env.stderr.startswith(f"{named}: OK")
    defaults = run("check-config", cwd=empty)  # no file anywhere: the built-in defaults
    assert defaults.returncode == 0, defaults.stderr
    assert json.loads(defaults.stdout)["server"]["port"] == 8787
    assert "built-in defaults: OK" in defaults.stderr


def test_environment_changes_one_key_of_a_default_upstream_and_misspellings_warn(
    tmp_path: Path,
) -> None:
    result = run(
        "check-config",
        cwd=tmp_path,
        env={"BRIM_UPSTREAMS__OPENAI__BASE_URL": "http://127.0.0.1:9/v1", "BRIM_SERVR__PORT": "1"},
    )
    assert result.returncode == 0, result.stderr
    openai_upstream = json.loads(result.stdout)["upstreams"]["openai"]
    assert (openai_upstream["api"], openai_upstream["base_url"]) == (
        "openai",
        "http://127.0.0.1:9/v1",
    )
    assert (
        "brim: warning: environment variable BRIM_SERVR__PORT: unknown key 'servr' ignored"
        in result.stderr
    )


def test_a_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text("[server]\nport = 9100\n")
    result = run("check-config", str(config), env={"BRIM_SERVER__PORT": "notaport"})
    assert result.returncode == 2
    assert "environment variable BRIM_SERVER__PORT: server.port" in result.stderr
    assert str(config) not in result.stderr  # the file is not blamed for it


def test_serve_on_a_port_in_use_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--config", "/dev/null", "--port", str(port))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"brim: cannot listen on 127.0.0.1:{port}: address already in use"
    )
    assert result.stdout == ""


def serve_in_front_of(
    provider: FakeProvider, tmp_path: Path, shutdown_timeout_s: float
) -> tuple[subprocess.Popen[str], str]:
    """`brim serve` as a process in front of the fake provider; returns it and its chat URL."""
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
        f"[server]\nshutdown_timeout_s = {shutdown_timeout_s}\n"
    )
    process = subprocess.Popen(
        [BRIM, "serve", "--config", str(config), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    port = re.search(r":(\d+)", process.stdout.readline()).group(1)  # type: ignore[union-attr]
    return process, f"http://127.0.0.1:{port}/v1/chat/completions"


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path: Path, provider: FakeProvider) -> None:
    process, url = serve_in_front_of(provider, tmp_path, shutdown_timeout_s=15)
    with httpx.stream(
        "POST",
        url,
        json={
            "model": "gated-stream",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        timeout=30,
    ) as reply:
        chunks = reply.iter_bytes()
        received = next(chunks)
        process.send_signal(signal.SIGTERM)  # brim is asked to stop while the stream is open
        provider.gate.set()
        received += b"".join(chunks)
    assert b"data: [DONE]" in received  # the stream finished
    assert process.wait(timeout=20) == 0


def test_sigterm_stops_accepting_and_cuts_what_outlives_the_deadline(
    tmp_path: Path, provider: FakeProvider
) -> None:
    process, url = serve_in_front_of(provider, tmp_path, shutdown_timeout_s=1.5)
    body = {
        "model": "endless-stream",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    with httpx.stream("POST", url, json=body, timeout=30) as reply:
        chunks = reply.iter_bytes()
        next(chunks)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):  # no new connections while draining
            httpx.post(url, json={**body, "stream": False}, timeout=5)
        started = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):  # the cut stream may end unclean
            for _ in chunks:
                pass
        cut_after = time.monotonic() - started
    assert cut_after < 5, "the endless stream was not cut at the deadline"
    assert process.wait(timeout=10) == 0
    assert wait_for(provider.stream_closed_by_peer.is_set, timeout=5)  # the upstream request too


@pytest.mark.parametrize("host", ["localhost.evil.example", "127.example.net", "::10", "0.0.0.0"])
def test_serving_beyond_loopback_without_keys_is_refused(host: str) -> None:
    """Names that only begin like a loopback address are not one."""
    with pytest.raises(ConfigError, match="reachable from other machines"):
        refuse_open_without_keys(BrimConfig(server={"host": host}))
    for loopback in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"):
        refuse_open_without_keys(BrimConfig(server={"host": loopback}))
