"""`brim run -- COMMAND`: exit codes, signals, brim's summary line, `--url`, and each CLI's
setup (proxy/launcher.py). The real CLIs through `brim run`: tests/test_real_clis.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from brim.proxy.launcher import (
    Totals,
    claude_warnings,
    codex_argv,
    codex_warnings,
    gemini_warnings,
    generic_env,
    opencode_env,
    opencode_warnings,
    setup_for,
)
from tests.brim_run import brim_run_env, finish, gone, launch, listening, start
from tests.conftest import BrimFactory
from tests.fakes import FakeProvider

PY = sys.executable
BASE = "http://127.0.0.1:4321"

# A command that signals it is ready, then counts the SIGINTs and SIGTERMs it gets for 0.3 s
# after the first and exits 40 + their number. With "alone", it first leaves the terminal's
# foreground group (so only what brim run sends reaches it) and waits 1.5 s at most.
SLEEPER = """
import os, signal, sys, time
alone = sys.argv[1:] == ["alone"]
if alone:
    os.setpgid(0, 0)
got = []
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda n, f: got.append(signal.Signals(n).name))
print("ready", flush=True)
deadline = time.monotonic() + (1.5 if alone else 30)
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)
print("got", *got, flush=True)
sys.exit(40 + len(got))
"""

# A client of brim's OpenAI address (OPENAI_BASE_URL, set by brim run): one Chat Completions
# request of `turns` old turns of ~400 tokens each and a short last question.
CLIENT = """
import json, os, sys, urllib.request
turns = int(sys.argv[1])
messages = [{"role": "system", "content": "Be brief."}]
for i in range(turns):
    words = " ".join(f"word{i}x{j}" for j in range(150))
    messages += [{"role": "user", "content": f"question {i}: {words}"},
                 {"role": "assistant", "content": f"answer {i}: {words}"}]
messages.append({"role": "user", "content": "And now?"})
body = json.dumps({"model": "small-4000", "messages": messages}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
                                 {"Content-Type": "application/json", "Authorization": "Bearer sk-test"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
print(json.load(opener.open(request))["choices"][0]["message"]["content"])
"""


@pytest.fixture
def config(tmp_path: Path, provider: FakeProvider) -> Path:
    """A proxy.toml: the fake provider, and a model with a 4000-token window."""
    path = tmp_path / "proxy.toml"
    path.write_text(
        f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
        '[models."small-4000"]\ncontext_window = 4000\nmax_output = 500\n'
    )
    return path


def env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}


def test_the_command_gets_brim_and_its_exit_code_is_brim_runs(config: Path) -> None:
    shows = "import os, sys; print(os.environ['OPENAI_BASE_URL'], os.environ['ANTHROPIC_BASE_URL']); sys.exit(3)"
    launched = launch(["--config", str(config), "--", PY, "-c", shows], env())
    report = launched.report()
    assert launched.returncode == 3, report
    base = f"http://127.0.0.1:{launched.port}"
    assert launched.stdout.split() == [f"{base}/v1", base], report
    assert launched.summary is not None and launched.summary.requests == 0, report
    assert gone(launched), report


def test_a_command_killed_by_a_signal_exits_128_plus_it(config: Path) -> None:
    kills = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    launched = launch(["--config", str(config), "--", PY, "-c", kills], env())
    assert launched.returncode == 128 + signal.SIGKILL, launched.report()
    assert gone(launched), launched.report()


def test_a_command_that_is_not_there(config: Path) -> None:
    launched = launch(["--config", str(config), "--", "no-such-command-brim"], env())
    assert launched.returncode == 127, launched.report()
    assert "command not found: no-such-command-brim" in launched.stderr, launched.report()
    assert gone(launched), launched.report()


def test_the_summary_counts_an_overflow_prevented(config: Path, provider: FakeProvider) -> None:
    launched = launch(["--config", str(config), "--", PY, "-c", CLIENT, "12"], env())
    report = launched.report()
    assert launched.returncode == 0 and launched.stdout.strip() == "pong", report
    summary = launched.summary
    assert summary is not None, report
    assert (summary.requests, summary.prevented, summary.survived) == (1, 1, 0), report
    assert summary.tokens_removed > 1000, report
    assert len(provider.requests) == 1, report  # through brim, which cut it
    assert gone(launched), report


def test_url_uses_a_running_brim_and_counts_only_what_ran(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(models={"small-4000": {"context_window": 4000, "max_output": 500}})
    first = launch(["--url", base, "--", PY, "-c", CLIENT, "1"], env())
    second = launch(["--url", base, "--", PY, "-c", CLIENT, "1"], env())
    for launched in (first, second):
        assert launched.returncode == 0, launched.report()
        assert launched.summary is not None and launched.summary.requests == 1, launched.report()
    assert listening(int(base.rsplit(":", 1)[1]))  # not brim run's to stop
    assert len(provider.requests) == 2


def test_url_where_no_brim_answers(closed_port: int) -> None:
    launched = launch(["--url", f"http://127.0.0.1:{closed_port}", "--", PY, "-c", ""], env())
    assert launched.returncode == 1, launched.report()
    assert "no brim answers" in launched.stderr, launched.report()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_sent_to_brim_run_reaches_the_command(
    config: Path, signum: signal.Signals
) -> None:
    process = start(["--config", str(config), "--", PY, "-c", SLEEPER], env())
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    os.kill(process.pid, signum)
    launched = finish(process, 30)
    report = launched.report()
    assert launched.stdout.split() == ["got", signum.name], report  # once
    assert launched.returncode == 41, report
    assert launched.summary is not None, report
    assert gone(launched), report


@pytest.mark.skipif(sys.platform != "linux", reason="the terminal is driven the Linux way")
@pytest.mark.parametrize("alone", [False, True], ids=["in-the-group", "alone"])
def test_ctrl_c_at_the_terminal_is_not_sent_twice(config: Path, alone: bool) -> None:
    """The terminal sends Ctrl-C's SIGINT to its whole foreground group, brim run and the
    command: the command gets it, and brim run does not send it again (Claude Code quits on a
    second Ctrl-C). A command that left the group shows that brim run sent nothing."""
    main, side = os.openpty()
    # brim run as the session leader of a terminal of its own, in its foreground group.
    leader = (
        "import os, sys; os.setsid(); os.close(os.open(os.ttyname(0), os.O_RDWR)); "
        "os.execv(sys.executable, sys.argv[1:])"
    )
    sleeper = [PY, "-c", SLEEPER, *(["alone"] if alone else [])]
    brim_run = [PY, "-m", "brim.proxy", "run", "--config", str(config), "--", *sleeper]
    process = subprocess.Popen(
        [PY, "-c", leader, *brim_run], env=brim_run_env(env()), stdin=side, stdout=side, stderr=side
    )
    os.close(side)
    output = b""
    while b"ready" not in output:
        output += os.read(main, 4096)
    os.write(main, b"\x03")
    try:
        returncode = process.wait(30)
        while chunk := _read(main):
            output += chunk
    finally:
        os.close(main)
    text = output.decode(errors="replace")
    expected = "got\r\n" if alone else "got SIGINT\r\n"
    assert returncode == (40 if alone else 41) and expected in text, text
    assert "brim: 0 requests" in text, text


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # the terminal's other side is closed
        return b""


# -- Each CLI's setup ---------------------------------------------------------------------------


def test_the_setup_is_chosen_by_the_commands_file_name() -> None:
    assert setup_for("/opt/bin/codex").argv is codex_argv
    assert setup_for("opencode").env is opencode_env
    assert setup_for("python").warnings([]) == []  # type: ignore[arg-type]
    assert generic_env(BASE) == {"OPENAI_BASE_URL": f"{BASE}/v1", "ANTHROPIC_BASE_URL": BASE}


def test_codex_gets_its_provider_as_overrides() -> None:
    argv = codex_argv(["codex", "exec", "hi"], BASE, {"OPENAI_API_KEY": "sk-x"})
    assert argv[0] == "codex" and argv[-2:] == ["exec", "hi"]
    overrides = dict(arg.split("=", 1) for arg in argv[2:-2:2])
    assert argv[1:-2:2] == ["-c"] * len(overrides)
    assert overrides == {
        "model_provider": '"brim"',
        "model_providers.brim.name": '"brim"',
        "model_providers.brim.base_url": f'"{BASE}/v1"',
        "model_providers.brim.wire_api": '"responses"',
        "model_providers.brim.env_key": '"OPENAI_API_KEY"',
    }
    without_key = codex_argv(["codex"], BASE, {})
    assert "model_providers.brim.requires_openai_auth=true" in without_key


def test_opencode_keeps_the_users_own_config_content() -> None:
    own = {"model": "anthropic/x", "provider": {"openai": {"options": {"apiKey": "k"}}}}
    content = json.loads(
        opencode_env(BASE, {"OPENCODE_CONFIG_CONTENT": json.dumps(own)})["OPENCODE_CONFIG_CONTENT"]
    )
    assert content["model"] == "anthropic/x"
    assert content["provider"]["openai"]["options"] == {"apiKey": "k", "baseURL": f"{BASE}/v1"}
    assert content["provider"]["anthropic"]["options"] == {"baseURL": f"{BASE}/v1"}
    assert content["provider"]["google"]["options"] == {"baseURL": f"{BASE}/v1beta"}


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_oauth_sign_ins_are_warned_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    home = {"HOME": str(tmp_path)}
    assert not claude_warnings(home) and not codex_warnings(home)
    assert not opencode_warnings(home)
    assert gemini_warnings(home)  # no API key: only a Google sign-in is left
    assert not gemini_warnings({**home, "GEMINI_API_KEY": "k"})

    _write(tmp_path / ".claude" / ".credentials.json", {"claudeAiOauth": {"accessToken": "t"}})
    _write(tmp_path / ".codex" / "auth.json", {"OPENAI_API_KEY": None, "tokens": {"id": "t"}})
    _write(
        tmp_path / ".gemini" / "settings.json",
        {"security": {"auth": {"selectedType": "oauth-personal"}}},
    )
    _write(tmp_path / ".local" / "share" / "opencode" / "auth.json", {"openai": {"type": "oauth"}})
    for warnings in (claude_warnings, codex_warnings, gemini_warnings, opencode_warnings):
        assert len(warnings(home)) == 1, warnings
    assert "signed in with Google" in gemini_warnings({**home, "GEMINI_API_KEY": "k"})[0]
    # An API key in the environment goes through brim whatever else is signed in.
    assert not claude_warnings({**home, "ANTHROPIC_API_KEY": "k"})
    assert not codex_warnings({**home, "OPENAI_API_KEY": "k"})


def test_totals_are_read_from_metrics() -> None:
    text = (
        'brim_requests_total{model="m",outcome="ok",route="r"} 3.0\n'
        'brim_requests_total{model="n",outcome="compressed",route="r"} 2.0\n'
        'brim_overflows_prevented_total{model="n"} 2.0\n'
        'brim_tokens_removed_total{model="n",policy="evict"} 1500.0\n'
        'brim_tokens_removed_total{model="n",policy="prune"} 500.0\n'
        'brim_restores_total{found="true",model="n"} 1.0\n'
        'brim_restores_total{found="false",model="n"} 4.0\n'
    )
    totals = Totals.parse(text)
    assert totals == Totals(requests=5, prevented=2, tokens_removed=2000, restores=1)
    assert (totals - Totals(requests=1)).line() == (
        "brim: 4 requests, 2 overflows prevented, 0 survived, 2,000 tokens removed, 1 restores"
    )


def test_run_is_a_brim_command() -> None:
    done = subprocess.run(
        [PY, "-m", "brim.proxy", "run", "--help"],
        capture_output=True,
        text=True,
        env={**env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / ".pythonpath")},
        check=False,
    )
    assert done.returncode == 0 and "COMMAND" in done.stdout
