"""CLI-backed providers (`api = "cli"`, adapters/cli/): brim answers Chat Completions by
running a coding CLI.

The chain tests run the real CLIs (pinned in tests/real_clis.py, as tests/test_real_clis.py
installs them), each pointed through its own base-URL setting at a scripted fake provider on
loopback: openai SDK → brim → `claude -p` / `codex exec` / `gemini -p` / `opencode run` → fake.
The process tests (timeout, disconnect, pool, missing command) run a tiny fake CLI, a Python
script that speaks Claude Code's stream-JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from brim.adapters.cli import CliAdapter, cli_model, render_prompt
from brim.adapters.exchange import Exchange
from brim.adapters.upstream_config import UpstreamConfig
from brim.policies.budget import DEFAULT_SAFETY_MARGIN
from brim.policies.model_table import CLI_OVERHEAD
from brim.proxy.app import bound_port, start
from brim.proxy.config import BrimConfig, ConfigError, load_config
from tests.fakes import LoopThread, start_app, wait_for
from tests.scripted_provider import Call, ScriptedProvider, tool_names
from tests.test_real_clis import (
    cli_bin,  # noqa: F401  (the fixture: the pinned CLIs, installed on first use)
    codex_command,
    gemini_command,
    note,
    offline_env,
    opencode_command,
)

pytestmark = pytest.mark.timeout(300)

ANSWER = "The answer, from behind the CLI, is 42."


def budget(window: int, cli: str) -> int:
    return int(window - CLI_OVERHEAD[cli] - DEFAULT_SAFETY_MARGIN * window)


# -- Pure parts ---------------------------------------------------------------------------------


def test_model_flag_is_the_part_after_the_colon() -> None:
    assert cli_model("claude:sonnet") == "sonnet"
    assert cli_model("[cli]gemini:flash") == "flash"
    assert cli_model("opencode:openai/gpt-4.1") == "openai/gpt-4.1"
    assert cli_model("gpt-4.1") is None


def test_the_conversation_is_rendered_into_one_prompt() -> None:
    assert render_prompt([{"role": "user", "content": "hi"}]) == "hi"
    prompt = render_prompt(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "rain, 4 C"},
            {"role": "user", "content": "So?"},
        ]
    )
    assert "<system>\nBe brief.\n</system>" in prompt
    assert '<tool_call id="call_1" name="weather">{"city":"Oslo"}</tool_call>' in prompt
    assert '<tool_result id="call_1">\nrain, 4 C\n</tool_result>' in prompt
    assert prompt.index("Weather?") < prompt.index("rain") < prompt.index("So?")


@pytest.mark.parametrize(
    ("upstream", "needle"),
    [
        ({"api": "cli"}, "command is required"),
        ({"api": "cli", "command": "/usr/bin/my-wrapper"}, "set cli to one of"),
        ({"api": "cli", "command": "claude", "max_concurrency": 0}, "max_concurrency"),
        ({"api": "cli", "command": "claude", "base_url": "http://x"}, "base_url is not used"),
        ({"api": "openai", "base_url": "http://x", "command": "claude"}, "only for api"),
    ],
)
def test_bad_cli_upstreams_are_refused_at_start(
    tmp_path: Path, upstream: dict[str, Any], needle: str
) -> None:
    lines = [f"{key} = {json.dumps(value)}" for key, value in upstream.items()]
    (tmp_path / "proxy.toml").write_text("[upstreams.c]\n" + "\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=needle):
        load_config(tmp_path / "proxy.toml")


def test_a_cli_route_with_the_marker_and_a_summarizer(tmp_path: Path) -> None:
    (tmp_path / "proxy.toml").write_text(
        '[upstreams.gem]\napi = "cli"\ncommand = "gemini"\n'
        '[routes]\n"[cli]gemini:*" = "gem"\n'
        '[summarize]\nenabled = true\nprovider = "[cli]gemini:flash"\n'
    )
    config, _ = load_config(tmp_path / "proxy.toml")
    from brim.adapters.registry import Upstreams

    upstreams = Upstreams(config.upstreams, config.routes)
    assert upstreams.route("[cli]gemini:flash", "openai.chat") == "gem"
    assert config.upstreams["gem"].cli_name == "gemini"


# -- A fake CLI for the process tests ----------------------------------------------------------

FAKE_CLI = r'''#!{python}
"""Speaks Claude Code's stream-JSON. The prompt on stdin decides: SLOW answers one delta and
then sleeps (with a child process in its group), OVERFLOW says the prompt is too long, anything
else is echoed back."""
import json, os, subprocess, sys, time
prompt = sys.stdin.read()
pids = os.environ["FAKE_CLI_PIDS"]
child = subprocess.Popen(["sleep", "300"]) if "SLOW" in prompt else None
with open(os.path.join(pids, str(os.getpid())), "w") as f:
    f.write(f"{{os.getpid()}} {{child.pid if child else ''}} {{sys.argv[1:]}}")
def out(obj):
    print(json.dumps(obj), flush=True)
print("warming up", file=sys.stderr, flush=True)
if "OVERFLOW" in prompt:
    out({{"type": "result", "is_error": True, "api_error_status": 400, "result":
         "Prompt is too long · the request is ~90000 tokens (limit 50000)"}})
    sys.exit(0)
delta = lambda text: {{"type": "stream_event", "event": {{"type": "content_block_delta",
    "delta": {{"type": "text_delta", "text": text}}}}}}
out(delta("echo: "))
if "SLOW" in prompt:
    time.sleep(300)
out(delta(prompt))
out({{"type": "result", "subtype": "success", "is_error": False, "result": "echo: " + prompt,
     "usage": {{"input_tokens": 7, "output_tokens": 3}}}})
'''


@dataclass
class Brim:
    url: str
    pids: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="sk-none", max_retries=0)

    def processes(self) -> list[int]:
        """Every process the fake CLI started (itself, and its child)."""
        found = []
        for path in self.pids.iterdir():
            pid, child, *_ = path.read_text().split(" ", 2)
            found += [int(pid)] + ([int(child)] if child else [])
        return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    try:  # a zombie is dead, only not reaped yet
        return status.read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def fake_cli(folder: Path) -> tuple[Path, Path]:
    """`FAKE_CLI` as an executable in `folder`, and the folder its runs write their pids to."""
    script = folder / "fake-claude"
    script.write_text(FAKE_CLI.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    pids = folder / "pids"
    pids.mkdir(exist_ok=True)
    return script, pids


@pytest.fixture
def fake_brim(loop_thread: LoopThread, tmp_path: Path) -> Iterator[Callable[..., Brim]]:
    runners: list[Any] = []

    def make(**upstream: Any) -> Brim:
        script, pids = fake_cli(tmp_path)
        settings = {
            "api": "cli",
            "command": str(script),
            "cli": "claude",
            "env": {"FAKE_CLI_PIDS": str(pids)},
            "workdir": str(tmp_path),
            **upstream,
        }
        config = BrimConfig(upstreams={"cli": settings}, routes={"claude:*": "cli"})
        runner = loop_thread.run(start(config, "127.0.0.1", 0))
        runners.append(runner)
        return Brim(f"http://127.0.0.1:{bound_port(runner)}", pids)

    yield make
    for runner in runners:
        loop_thread.run(runner.cleanup())


def scratch_folders(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob("brim-cli-*"))


def test_fake_cli_answers_streamed_and_whole(
    fake_brim: Callable[..., Brim], tmp_path: Path
) -> None:
    brim = fake_brim()
    client = brim.client()
    reply = client.chat.completions.create(
        model="claude:sonnet", messages=[{"role": "user", "content": "ping"}]
    )
    assert reply.choices[0].message.content == "echo: ping"
    assert reply.usage is not None and reply.usage.prompt_tokens == 7
    chunks = list(
        client.chat.completions.create(
            model="claude:sonnet",
            messages=[{"role": "user", "content": "pong"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: pong"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    # The model flag, the process gone and its scratch folder removed.
    args = [p.read_text() for p in brim.pids.iterdir()]
    assert all("'--model=sonnet'" in a and "'--tools', ''" in a for a in args), args
    assert wait_for(lambda: not any(alive(pid) for pid in brim.processes()))
    assert wait_for(lambda: scratch_folders(tmp_path) == [])  # removed off the loop, after


def test_an_overflow_the_cli_reports_is_a_context_overflow(
    fake_brim: Callable[..., Brim],
) -> None:
    brim = fake_brim()
    response = httpx.post(
        f"{brim.url}/v1/chat/completions",
        json={"model": "claude:sonnet", "messages": [{"role": "user", "content": "OVERFLOW"}]},
        timeout=30,
    )
    # Learned, retried (there was nothing to cut in one message), relayed in the OpenAI shape.
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "Prompt is too long" in error["message"]
    assert "warming up" not in response.text  # stderr never reaches the client


def test_a_timeout_kills_the_process_group(fake_brim: Callable[..., Brim], tmp_path: Path) -> None:
    brim = fake_brim(timeout_s=1.5)
    started = time.monotonic()
    response = httpx.post(
        f"{brim.url}/v1/chat/completions",
        json={"model": "claude:sonnet", "messages": [{"role": "user", "content": "SLOW"}]},
        timeout=30,
    )
    assert response.status_code == 504, response.text
    assert "timeout_s" in response.json()["error"]["message"]
    assert time.monotonic() - started < 10
    pids = brim.processes()
    assert len(pids) == 2  # the CLI and its child
    assert wait_for(lambda: not any(alive(pid) for pid in pids)), pids
    assert wait_for(lambda: scratch_folders(tmp_path) == [])


def test_a_client_disconnect_kills_the_process_group(
    fake_brim: Callable[..., Brim], tmp_path: Path
) -> None:
    brim = fake_brim()
    body = {
        "model": "claude:sonnet",
        "messages": [{"role": "user", "content": "SLOW"}],
        "stream": True,
    }
    with httpx.stream("POST", f"{brim.url}/v1/chat/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()
        assert any("echo: " in line for line in lines)
        assert wait_for(lambda: len(brim.processes()) == 2)
        pids = brim.processes()
        assert all(alive(pid) for pid in pids)
    # The client went away mid-stream.
    assert wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10), pids
    assert wait_for(lambda: scratch_folders(tmp_path) == [])


async def test_a_run_whose_closer_is_cancelled_still_removes_its_folder_and_frees_its_slot(
    tmp_path: Path,
) -> None:
    """A stream's closer runs in a handler that is often being cancelled (its client went
    away): cancelled at every step of closing, the run still ends its process, removes its
    scratch folder and gives its pool slot back."""
    script, pids = fake_cli(tmp_path)
    config = UpstreamConfig(
        api="cli",
        command=str(script),
        cli="claude",
        env={"FAKE_CLI_PIDS": str(pids)},
        workdir=str(tmp_path),
        max_concurrency=1,
    )
    adapter = CliAdapter("cli", config)
    body = {"model": "claude:sonnet", "messages": [{"role": "user", "content": "SLOW"}]}
    exchange = Exchange(
        api="openai.chat",
        method="POST",
        endpoint="/chat/completions",
        query="",
        model="claude:sonnet",
        body=body,
        raw=json.dumps(body).encode(),
        headers=CIMultiDictProxy(CIMultiDict()),
        stream=True,
        upstream="cli",
        request_id="r1",
    )
    reply = await adapter.send(exchange)  # the CLI has answered once and now sleeps
    assert len(scratch_folders(tmp_path)) == 1
    # The event loop's worker threads are busy meanwhile, so work handed to one waits its turn
    # (and a cancel reaches it before it starts): one thread, held until the closing is over.
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
    held = threading.Event()
    busy = loop.run_in_executor(None, held.wait)

    closing = asyncio.ensure_future(reply.aclose())
    cancels = 0
    while not closing.done():
        await asyncio.sleep(0)
        cancels += closing.cancel()
    assert cancels >= 2  # in the middle of closing, and again while it cleans up
    held.set()
    await busy

    ran = [int(path.name) for path in pids.iterdir()]
    for _ in range(250):  # killed at once; the folder goes on a worker thread
        if not scratch_folders(tmp_path) and not any(alive(pid) for pid in ran):
            break
        await asyncio.sleep(0.02)
    assert scratch_folders(tmp_path) == []
    assert not any(alive(pid) for pid in ran)
    assert not adapter.slots.locked()  # its one slot is free again


def test_the_pool_limit_answers_429_with_retry_after(
    fake_brim: Callable[..., Brim], loop_thread: LoopThread
) -> None:
    brim = fake_brim(max_concurrency=1, max_queued=1, queue_timeout_s=0.5, timeout_s=3)
    slow = {"model": "claude:sonnet", "messages": [{"role": "user", "content": "SLOW"}]}
    quick = {"model": "claude:sonnet", "messages": [{"role": "user", "content": "hi"}]}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"{brim.url}/v1/chat/completions"
            first = asyncio.ensure_future(client.post(url, json=slow))
            await asyncio.sleep(0.5)  # the one slot is taken
            queued = asyncio.ensure_future(client.post(url, json=quick))
            await asyncio.sleep(0.1)
            over = await client.post(url, json=quick)  # the queue (one) is full: at once
            return [over, await queued, await first]

    over, queued, first = loop_thread.run(burst(), timeout=60)
    for refused in (over, queued):  # past the queue bound; waited queue_timeout_s, then refused
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "cli_busy"
    assert first.status_code == 504  # the slow one ran into its timeout
    # A slot is free again.
    assert brim.client().chat.completions.create(**quick).choices[0].message.content == "echo: hi"


def test_a_missing_cli_is_a_clear_error(fake_brim: Callable[..., Brim], tmp_path: Path) -> None:
    brim = fake_brim(command=str(tmp_path / "nowhere" / "claude"))
    response = httpx.post(
        f"{brim.url}/v1/chat/completions",
        json={"model": "claude:sonnet", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert str(tmp_path / "nowhere" / "claude") in message and "does not exist" in message


@pytest.mark.parametrize(
    ("path", "body", "message_at"),
    [
        (
            "/v1/messages",
            {
                "model": "claude:sonnet",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "hi"}],
            },
            lambda reply: reply["type"] == "error" and reply["error"]["message"],  # Anthropic's
        ),
        (
            "/v1/responses",
            {"model": "claude:sonnet", "input": "hi"},
            lambda reply: reply["error"]["message"],  # OpenAI's
        ),
        (
            "/v1beta/models/claude:sonnet:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
            lambda reply: reply["error"]["status"] == "NOT_FOUND" and reply["error"]["message"],
        ),
    ],
    ids=["messages", "responses", "gemini"],
)
def test_other_wire_apis_get_a_clear_error_in_their_own_shape(
    fake_brim: Callable[..., Brim],
    path: str,
    body: dict[str, Any],
    message_at: Callable[[dict[str, Any]], Any],
) -> None:
    brim = fake_brim()
    response = httpx.post(f"{brim.url}{path}", json=body, timeout=30)
    assert response.status_code == 404, response.text
    message = message_at(response.json())
    assert isinstance(message, str) and "Chat Completions requests only" in message


# -- The real CLIs -----------------------------------------------------------------------------


class Answering(ScriptedProvider):
    """Answers every request with ANSWER (or refuses it over the window in the model's name)."""

    def _text_of(self, call: Call) -> str:
        return ANSWER


@dataclass(frozen=True)
class Chain:
    cli: str
    model: str  # brim's model id; the CLI's model (after the colon) ends with its window
    window: int  # brim's window for it
    # (executable, home, fake's URL, model after the colon) -> environment for the CLI
    setup: Callable[[Path, Path, str, str], dict[str, str]]
    tools: frozenset[str] = frozenset()  # tools the CLI still offers with its own turned off


def claude_env(exe: Path, home: Path, base: str, model: str) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def codex_env(exe: Path, home: Path, base: str, model: str) -> dict[str, str]:
    return codex_command(exe, home, base, model)[1]


def gemini_env(exe: Path, home: Path, base: str, model: str) -> dict[str, str]:
    return gemini_command(exe, home, base, model)[1]


def opencode_env(exe: Path, home: Path, base: str, model: str) -> dict[str, str]:
    return opencode_command(exe, home, base, model.split("/", 1)[1])[1]


CHAINS = [
    Chain("claude", "claude:claude-sonnet-4-5-200000", 200_000, claude_env),
    # Codex keeps one tool that no feature switches off (it asks the user; headless, a no-op).
    Chain("codex", "codex:resp-400000", 400_000, codex_env, frozenset({"request_user_input"})),
    Chain("gemini", "[cli]gemini:gem-1000000", 1_000_000, gemini_env),
    Chain("opencode", "opencode:brim/chat-200000", 200_000, opencode_env),
]


ROUTES = {
    "claude": "claude:*",
    "codex": "codex:*",
    "gemini": "[cli]gemini:*",
    "opencode": "opencode:*",
}


@dataclass
class Setup:
    url: str
    fake: Answering


@pytest.fixture
def chain(
    cli_bin: Path,  # noqa: F811
    loop_thread: LoopThread,
    tmp_path: Path,
) -> Iterator[Callable[..., Setup]]:
    runners: list[Any] = []

    def make(c: Chain, models: dict[str, Any] | None = None, **settings: Any) -> Setup:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        fake = Answering("none", lambda step: {}, 0, ANSWER)
        runner, url = loop_thread.run(start_app(fake.app()))
        runners.append(runner)
        exe = cli_bin / c.cli
        env = {**offline_env(cli_bin, home), **c.setup(exe, home, url, cli_model(c.model) or "")}
        config = BrimConfig(
            upstreams={c.cli: {"api": "cli", "command": str(exe), "env": env, "timeout_s": 90}},
            routes={ROUTES[c.cli]: c.cli},
            models={c.model: {"context_window": c.window}, **(models or {})},
            **settings,
        )
        brim = loop_thread.run(start(config, "127.0.0.1", 0))
        runners.append(brim)
        return Setup(f"http://127.0.0.1:{bound_port(brim)}", fake)

    yield make
    for runner in reversed(runners):
        loop_thread.run(runner.cleanup())


@pytest.mark.parametrize("c", CHAINS, ids=lambda c: c.cli)
def test_openai_sdk_through_brim_and_the_real_cli(chain: Callable[..., Setup], c: Chain) -> None:
    setup = chain(c)
    client = openai.OpenAI(base_url=f"{setup.url}/v1", api_key="sk-none", max_retries=0)
    messages = [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": "What is the answer?"},
    ]
    raw = client.chat.completions.with_raw_response.create(model=c.model, messages=messages)
    reply = raw.parse()
    assert reply.choices[0].message.content == ANSWER
    # The budget brim applied: the window less the CLI's own overhead and the margin.
    assert raw.headers["x-brim-budget"] == str(budget(c.window, c.cli))
    # Usage as the CLI reported it: the provider's count of what the CLI sent.
    main = [call for call in setup.fake.calls if "What is the answer?" in json.dumps(call.body)]
    assert main, setup.fake.calls
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == main[-1].tokens
    assert reply.usage.completion_tokens > 0
    # The CLI's own tools were off; the rendered conversation reached the provider.
    assert set(tool_names(main[-1].api, main[-1].body)) <= c.tools
    assert "You answer questions." in json.dumps(main[-1].body)

    chunks = list(
        client.chat.completions.create(
            model=c.model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == ANSWER
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


def long_conversation(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You answer questions about notes."}]
    for step in range(1, turns + 1):
        messages.append({"role": "user", "content": f"Here are notes {step}:\n{note(step)}"})
        messages.append({"role": "assistant", "content": f"Noted {step}."})
    messages.append({"role": "user", "content": "What is the answer?"})
    return messages


def test_a_long_conversation_is_compressed_before_the_cli(chain: Callable[..., Setup]) -> None:
    c = Chain("claude", "claude:claude-sonnet-4-5-200000", 90_000, claude_env)
    setup = chain(c)
    client = openai.OpenAI(base_url=f"{setup.url}/v1", api_key="sk-none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=c.model, messages=long_conversation(8)
    )
    assert raw.parse().choices[0].message.content == ANSWER
    limit = budget(90_000, "claude")
    assert raw.headers["x-brim-budget"] == str(limit)
    assert int(raw.headers["x-brim-tokens-in"]) > limit
    assert int(raw.headers["x-brim-tokens-out"]) <= limit
    assert raw.headers.get("x-brim-actions")
    sent = json.dumps(setup.fake.calls[-1].body)
    assert "What is the answer?" in sent and "MARKER-8" in sent
    # The first user message and the newest turns stay; older ones went (evicted, noted).
    assert not all(f"MARKER-{n}:" in sent for n in range(2, 8))


def test_an_overflow_from_the_cli_is_learned_and_retried(chain: Callable[..., Setup]) -> None:
    # brim thinks the window is 200 000; the provider behind the CLI says 80 000.
    c = Chain("claude", "claude:claude-sonnet-4-5-80000", 200_000, claude_env)
    setup = chain(c)
    client = openai.OpenAI(base_url=f"{setup.url}/v1", api_key="sk-none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=c.model, messages=long_conversation(13)
    )
    calls = [(call.reply, call.tokens) for call in setup.fake.calls]
    assert raw.parse().choices[0].message.content == ANSWER, calls
    assert raw.headers["x-brim-retries"] == "1", calls
    assert [reply for reply, _ in calls][-2:] == ["overflow", "text"], calls
    # Learned: the next request is budgeted to the provider's window up front.
    again = client.chat.completions.with_raw_response.create(
        model=c.model, messages=[{"role": "user", "content": "hi"}]
    )
    assert again.headers["x-brim-budget"] == str(budget(80_000, "claude"))


def test_the_summarizer_runs_through_a_real_cli(chain: Callable[..., Setup]) -> None:
    """`[summarize] provider` names a CLI-backed model: what evict removed is summarized by the
    real CLI (its provider sees brim's summarizing prompt), and the summary it answers takes the
    notice's place in the request the model gets."""
    c = Chain("claude", "claude:claude-sonnet-4-5-200000", 90_000, claude_env)
    setup = chain(
        c,
        guard={"policies": ["evict", "truncate"]},
        summarize={"enabled": True, "provider": c.model, "max_retries": 0},
    )
    client = openai.OpenAI(base_url=f"{setup.url}/v1", api_key="sk-none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=c.model, messages=long_conversation(8)
    )
    assert raw.parse().choices[0].message.content == ANSWER
    assert "summarize" in raw.headers["x-brim-actions"], raw.headers["x-brim-actions"]
    bodies = [json.dumps(call.body) for call in setup.fake.calls]
    summarizing = [body for body in bodies if "You summarize an earlier part" in body]
    assert summarizing, bodies
    main = [body for body in bodies if "What is the answer?" in body and body not in summarizing]
    assert main and "[brim: a summary of earlier messages" in main[-1]
    assert ANSWER in main[-1].split("[brim: a summary of earlier messages", 1)[1]
