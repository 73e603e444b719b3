"""The real coding CLIs through a real brim: Claude Code, Codex, Gemini CLI and opencode.

Each test runs one CLI non-interactively (pinned in tests/real_clis.py, installed once with npm)
in a scratch folder with its own HOME, pointed at brim, which stands in front of a scripted fake
provider with a small context window (tests/scripted_provider.py). The fake has the CLI read big
files with its own file-reading tool, one after another, until the session is well past the
window, then answers. brim must keep every request inside the window: the CLI finishes (exit 0,
the final answer printed), the provider never sees an overflowing or unpaired request, and brim's
audit log shows the requests it compressed.

Through `brim run` (proxy/launcher.py), each CLI is started by brim run, which starts brim and
points the CLI at it itself; the CLI gets one answer, and brim run prints its summary.

In a second session per CLI the model fetches back what brim cut (tests/restoring_cli.py): it
calls `brim_restore` with a key it read in the cut request, brim answers that call itself in a
hidden round, and the CLI gets only the model's final answer, never the call (nothing it sends
brim, prints or keeps names it); brim's audit log and /metrics count the restore.

The CLIs run fully offline: update checks, telemetry and model-list downloads are switched off,
and any other connection goes to a dead proxy on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

import brim.proxy.app
from brim.middleware.stages.restore import RESTORE_TOOL
from brim.policies.clear import CLEARED_PREFIX
from brim.policies.evict import GISTS_HEADER, IDS_LABEL, NAMES_QUOTED
from brim.policies.information import is_long_number
from brim.policies.text import NAMES_LABEL, NAMES_SEPARATOR, listed_names, strings_of
from brim.policies.wires.base import NOTICE_PREFIX
from brim.proxy.app import bound_port, start
from brim.proxy.config import BrimConfig
from tests.brim_run import Launched, gone, launch
from tests.fakes import LoopThread, Seen, record, start_app, wait_for
from tests.real_clis import PINS, InstallError, install
from tests.restoring import restored
from tests.restoring_cli import RestoringSession
from tests.scripted_provider import OUTPUT_TOKENS, ScriptedProvider, tool_names, tool_uses

# The first test may install the CLIs (about 20 s on a fast link, 1.1 GB on disk); the runs
# themselves take seconds, and each has its own CLI_TIMEOUT_S.
pytestmark = pytest.mark.timeout(600)

CLI_TIMEOUT_S = 60
ADMIN = "real-clis-admin-key-0123456789"
# in a body's JSON; ids under one path written once (`…/pull/{1000,1001}`)
NAMES_LISTED = re.escape(NAMES_LABEL) + r"([\w./\-{},]+(?: [\w./\-{},]+)*)"
# A name only notes file N prints: `result_N_M`, `item-N-M`, `MARKER-N`.
FILE_NAME = re.compile(r"result_(\d+)_\d+|item-(\d+)-\d+|MARKER-(\d+)")
READS = 6  # big files the fake has the CLI read: far more than the window holds
FINAL = "All six notes are read: the answer is FINAL-7f3a."
RESTORED = "With the first notes file fetched back, the answer is RESTORED-5d2c."
PROMPT = "Read the notes files in this folder one by one, then tell me the answer."
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused


def note(step: int) -> str:
    """The content of big file `step`: ~200 lines of code-like text, distinct per file, with a
    first and a last line that show whether it reached the provider whole."""
    lines = [f"# MARKER-{step}: notes file {step}"]
    for i in range(200):
        lines.append(
            f"result_{step}_{i} = compute_{(i * 7 + step) % 13}(value={i * step + 3}, "
            f"label='item-{step}-{i}', weight={(i * 31 + step * 17) % 101})  # row {i}"
        )
    lines.append(f"# END-{step}: end of notes file {step}")
    return "\n".join(lines) + "\n"


def deadline(step: int) -> str:
    """The one long number notes file `step` (`numbered_note`) prints: a constant a later turn
    may write, which no other file holds."""
    return str(52_000 + 1_111 * step)


def numbered_note(step: int) -> str:
    """`note(step)` with a constant (`deadline`) on its second line."""
    first, rest = note(step).split("\n", 1)
    return f"{first}\nDEADLINE_MS_{step} = {deadline(step)}  # of notes file {step}\n{rest}"


def whole(step: int, text: str | None) -> bool:
    return text is not None and f"MARKER-{step}" in text and f"END-{step}:" in text


@dataclass(frozen=True)
class Cli:
    """How one CLI is driven: the wire API it speaks, the model (its window is the number at the
    end), its file-reading tool and that tool's arguments, and its command line."""

    name: str
    api: str  # the scripted provider's name for the wire API
    upstream: str  # brim's [upstreams] api
    model: str
    tool: str
    arguments: Callable[[Path, int], dict[str, Any]]
    # (executable, home, brim's base URL, model) -> (argv, environment). With no base URL, the
    # CLI is left for `brim run` to point at brim: only what keeps it offline and scripted.
    command: Callable[[Path, Path, str | None, str], tuple[list[str], dict[str, str]]]

    @property
    def window(self) -> int:
        return int(self.model.rsplit("-", 1)[1])

    def at_window(self, window: int) -> Cli:
        """The same CLI with a model of `window` tokens."""
        return dataclasses.replace(self, model=f"{self.model.rsplit('-', 1)[0]}-{window}")


def claude_command(
    exe: Path, home: Path, base: str | None, model: str
) -> tuple[list[str], dict[str, str]]:
    env = {
        **({"ANTHROPIC_BASE_URL": base} if base else {}),
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    }
    argv = [str(exe), "-p", PROMPT, "--model", model]
    return [*argv, "--allowedTools", "Read", "--max-turns", "20"], env


def codex_command(
    exe: Path, home: Path, base: str | None, model: str
) -> tuple[list[str], dict[str, str]]:
    # Windows far above the fake's, so that Codex leaves the window to brim.
    provider = (
        "[model_providers.brim]\n"
        'name = "brim"\n'
        f'base_url = "{base}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "OPENAI_API_KEY"\n'
    )
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        + ('model_provider = "brim"\n' if base else "")
        + "model_context_window = 1000000\n"
        "model_auto_compact_token_limit = 900000\n"
        "check_for_update_on_startup = false\n"
        "[analytics]\nenabled = false\n"
        "[feedback]\nenabled = false\n" + (provider if base else "")
    )
    env = {"CODEX_HOME": str(home), "OPENAI_API_KEY": "sk-test"}
    argv = [str(exe), "exec", "--skip-git-repo-check", "--color", "never"]
    argv += ["--dangerously-bypass-approvals-and-sandbox", "-o", str(home / "last-message.txt")]
    return [*argv, PROMPT], env


def gemini_command(
    exe: Path, home: Path, base: str | None, model: str
) -> tuple[list[str], dict[str, str]]:
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }
    (home / ".gemini").mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    env = {
        **({"GOOGLE_GEMINI_BASE_URL": base} if base else {}),
        "GEMINI_API_KEY": "AIza-test",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    return [str(exe), "-p", PROMPT, "-m", model], env


def opencode_command(
    exe: Path, home: Path, base: str | None, model: str
) -> tuple[list[str], dict[str, str]]:
    # Its own provider at brim; or, for `brim run` to point, its OpenAI one (the Responses API).
    name = "brim" if base else "openai"
    own = {"npm": "@ai-sdk/openai-compatible", "name": "brim", "options": {"baseURL": f"{base}/v1"}}
    provider: dict[str, Any] = own if base else {"options": {}}
    provider["options"]["apiKey"] = "sk-test"
    # A window far above the fake's, so that opencode leaves the window to brim.
    provider["models"] = {model: {"name": model, "limit": {"context": 1_000_000, "output": 2_000}}}
    config = {
        "autoupdate": False,
        "share": "disabled",
        "model": f"{name}/{model}",
        "small_model": f"{name}/{model}",
        "provider": {name: provider},
    }
    env = {
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_AUTOCOMPACT": "1",
        "OPENCODE_DISABLE_PRUNE": "1",
    }
    return [str(exe), "run", "--pure", "-m", f"{name}/{model}", PROMPT], env


# Claude Code sends a model it does not know as its newest one, with role "system" messages in
# the conversation (beta mid-conversation-system-2026-04-07); a known family keeps the classic
# shape. The windows sit between the CLI's fixed prompt plus two files and all six files.
CLAUDE = Cli(
    "claude",
    "messages",
    "anthropic",
    "claude-sonnet-4-5-45000",
    "Read",
    lambda work, step: {"file_path": str(work / f"notes_{step}.txt")},
    claude_command,
)
CODEX = Cli(
    "codex",
    "responses",
    "openai",
    "resp-16000",
    "exec_command",
    lambda work, step: {"cmd": f"cat notes_{step}.txt"},
    codex_command,
)
GEMINI = Cli(
    "gemini",
    "gemini",
    "gemini",
    "gem-20000",
    "read_file",
    lambda work, step: {"file_path": f"notes_{step}.txt"},
    gemini_command,
)
OPENCODE = Cli(
    "opencode",
    "chat",
    "openai",
    "chat-20000",
    "read",
    lambda work, step: {"filePath": str(work / f"notes_{step}.txt")},
    opencode_command,
)


@pytest.fixture(scope="session")
def cli_bin() -> Path:
    """The pinned CLIs, installed on first use (CI installs them before the suite). Without
    node and npm they are skipped; where those are there but the registry cannot be reached
    they are skipped too — but fail under CI (`CI` set), so that these tests cannot pass there
    without having run, as with tests/conftest.py's redis-server."""
    try:
        return install() / "bin"
    except InstallError as exc:
        if exc.offline:
            if os.environ.get("CI") and shutil.which("node") and shutil.which("npm"):
                pytest.fail(f"the real CLIs cannot be installed under CI: {exc}")
            pytest.skip(f"the real CLIs cannot be installed here: {exc}")
        raise


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    fake: ScriptedProvider
    audit: list[dict[str, Any]]
    home: Path
    work: Path
    received: list[Seen]  # every request brim received from the CLI
    metrics: str  # brim's /metrics once it had answered them all
    token_ratios: list[dict[str, Any]]  # /admin/status's, then

    def report(self) -> str:
        calls = [(c.api, c.tokens, c.reply) for c in self.fake.calls]
        outcomes = [
            (e["outcome"], e["tokens_in"], e["tokens_out"], e["restored"]) for e in self.audit
        ]
        return (
            f"exit {self.returncode} after {self.seconds:.1f} s\ncalls {calls}\n"
            f"received {[f'{s.method} {s.path}' for s in self.received]}\n"
            f"audit {outcomes}\noverflows {self.fake.overflows}\n"
            f"rejections {self.fake.rejections}\nunknown paths {self.fake.unknown_paths}\n"
            f"stdout {self.stdout[-2000:]}\nstderr {self.stderr[-3000:]}"
        )


def offline_env(bin_dir: Path, home: Path) -> dict[str, str]:
    """A clean environment (nothing of the developer's own: no keys, no proxies): the CLIs and
    node on PATH, a private HOME, and every outside connection sent to a dead proxy."""
    node = shutil.which("node")
    path = [str(bin_dir), *([str(Path(node).parent)] if node else []), "/usr/bin", "/bin"]
    env = {
        "PATH": os.pathsep.join(dict.fromkeys(path)),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "npm_config_offline": "true",
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = DEAD_PROXY
    return env


class Drive(Protocol):
    def __call__(
        self,
        cli: Cli,
        *,
        restore: bool = False,
        notes: Callable[[int], str] = ...,
        **sections: Any,
    ) -> Run: ...


@pytest.fixture
def drive(
    cli_bin: Path, loop_thread: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Drive]:
    """Runs one CLI through a fresh brim in front of a fresh scripted provider: the session of
    `ScriptedProvider`, or with `restore` that of `RestoringSession`, reading the files `notes`
    writes; `sections` are more of brim's configuration. brim's app records every request it receives (as the CLI sent it) and
    when it has answered it."""
    runners: list[Any] = []
    received: list[Seen] = []
    answered: list[Seen] = []
    monkeypatch.setenv("REAL_CLIS_ADMIN_KEYS", ADMIN)

    @web.middleware
    async def recorded(request: web.Request, handler: Any) -> web.StreamResponse:
        seen = await record(request)  # aiohttp keeps the body for brim's own read
        received.append(seen)
        try:
            response: web.StreamResponse = await handler(request)
            return response  # a stream: written to its end, and brim's records made
        finally:
            answered.append(seen)

    create_app = brim.proxy.app.create_app

    def recording_app(config: BrimConfig, **options: Any) -> web.Application:
        app = create_app(config, **options)
        app.middlewares.append(recorded)
        return app

    monkeypatch.setattr(brim.proxy.app, "create_app", recording_app)

    def run(
        cli: Cli, *, restore: bool = False, notes: Callable[[int], str] = note, **sections: Any
    ) -> Run:
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        for step in range(1, READS + 1):
            (work / f"notes_{step}.txt").write_text(notes(step))
        session = RestoringSession if restore else ScriptedProvider
        fake = session(
            cli.tool, lambda step: cli.arguments(work, step), READS, RESTORED if restore else FINAL
        )
        fake_runner, url = loop_thread.run(start_app(fake.app()))
        runners.append(fake_runner)
        fake.url = url
        audit = tmp_path / "audit.jsonl"
        config = BrimConfig(
            upstreams={
                "fake": {
                    "api": cli.upstream,
                    "base_url": f"{url}/v1" if cli.upstream == "openai" else url,
                }
            },
            **{
                "models": {cli.model: {"context_window": cli.window, "max_output": 2_000}},
                "audit": {"path": str(audit)},
                "server": {"admin_keys_env": "REAL_CLIS_ADMIN_KEYS"},
                **sections,
            },
        )
        brim_runner = loop_thread.run(start(config, "127.0.0.1", 0))
        runners.append(brim_runner)
        base = f"http://127.0.0.1:{bound_port(brim_runner)}"
        argv, extra = cli.command(cli_bin / cli.name, home, base, cli.model)
        started = time.monotonic()
        process = subprocess.Popen(
            argv,
            cwd=work,
            env={**offline_env(cli_bin, home), **extra},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed whole on a timeout
        )
        try:
            stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        finally:  # whatever it left running in the background goes too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        seconds = time.monotonic() - started
        wait_for(lambda: len(answered) == len(received))  # brim has counted every request
        admin = {"x-brim-admin-key": ADMIN}  # /metrics too: this brim has admin keys
        metrics = httpx.get(f"{base}/metrics", headers=admin).raise_for_status().text
        status = httpx.get(f"{base}/admin/status", headers=admin).json()
        loop_thread.run(runners.pop().cleanup())  # brim: every request done and audited
        events = (
            [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
        )
        return Run(
            process.returncode,
            stdout.decode(errors="replace"),
            stderr.decode(errors="replace"),
            seconds,
            fake,
            events,
            home,
            work,
            [s for s in received if s.path not in ("/metrics", "/admin/status")],
            metrics,
            status["token_ratios"],
        )

    yield run
    for runner in reversed(runners):
        loop_thread.run(runner.cleanup())


def check_run(cli: Cli, run: Run, final: str) -> None:
    """What every run must show: the CLI finished and printed `final`; the provider saw no
    request over its window and none with a broken tool pairing; the requests came from the
    pinned CLI (its User-Agent names the version), and each one brim compressed fit the budget."""
    report = run.report()
    assert run.returncode == 0, report
    assert final in run.stdout, report
    assert run.seconds < CLI_TIMEOUT_S, report
    assert run.fake.overflows == [] and run.fake.rejections == [], report
    assert run.fake.unknown_paths == [], report
    assert 0 < run.fake.max_tokens_seen() <= cli.window, report
    assert all(PINS[cli.name][1] in e["client"] for e in run.audit), report
    compressed = [e for e in run.audit if e["outcome"] == "compressed"]
    assert compressed, report
    assert all(e["tokens_out"] <= e["budget"] < cli.window for e in compressed), report


def check_session(cli: Cli, run: Run) -> None:
    """What every CLI's session must show."""
    check_run(cli, run, FINAL)
    report = run.report()
    # The CLI went through the whole script: each file asked for once, then the final answer.
    replies = [c.reply for c in run.fake.main_calls]
    assert replies == [f"read {n}" for n in range(1, READS + 1)] + ["final"], report

    # The last request: every call of the tool answered by its own result, the newest file
    # whole and as the CLI sent it, and older files not all there as the CLI sent them (brim
    # cleared or evicted them, keeping each call with its result).
    last = run.fake.main_calls[-1]
    uses = tool_uses(cli.api, last.body, cli.tool)
    assert uses and all(use.result is not None for use in uses), report
    assert uses[-1].arguments == cli.arguments(run.work, READS), report
    assert whole(READS, uses[-1].result), report
    bodies = [orjson.loads(seen.body) for seen in run.received if seen.body]
    (as_sent,) = [b for b in bodies if tool_uses(cli.api, b, cli.tool)[-1:] == uses[-1:]]
    kept = [use for use in uses if use in tool_uses(cli.api, as_sent, cli.tool)]
    assert uses[-1] in kept and (len(kept) < len(uses) or len(uses) < READS), report

    # The session grew past the window.
    compressed = [e for e in run.audit if e["outcome"] == "compressed"]
    assert max(e["tokens_in"] for e in compressed) > cli.window, report

    # brim learned the model's token ratio from the usage in the provider's replies to the
    # CLI's requests: the fake counts as brim does (o200k_base; Messages: brim's Claude
    # estimate, 1.15 × o200k_base, each message rounded up), so that is the ratio.
    (ratio,) = [r for r in run.token_ratios if r["model"] == cli.model]
    assert ratio["replies"] >= READS, (ratio, report)
    low, high = (1.15, 1.2) if cli.api == "messages" else (1.0, 1.0)
    assert low <= ratio["ratio"] <= high, (ratio, report)

    # brim's GenAI client metrics hold the tokens the provider reported for each answer it gave
    # (read from the CLI's streams as they passed).
    answered = [c for c in run.fake.calls if c.reply not in ("overflow", "invalid")]
    expected = {"input": sum(c.tokens for c in answered), "output": OUTPUT_TOKENS * len(answered)}
    assert tokens_used(run.metrics) == expected, report


def holding(home: Path, needle: str) -> list[Path]:
    """The files under `home` (the CLI's own: transcripts, session stores) that hold `needle`."""
    return [p for p in home.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def tokens_used(metrics: str) -> dict[str, float]:
    """gen_ai.client.token.usage at /metrics: the sum of each token type over all series."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "gen_ai_client_token_usage_sum":
                kind = sample.labels["gen_ai_token_type"]
                sums[kind] = sums.get(kind, 0) + sample.value
    return sums


def restores_counted(metrics: str) -> dict[str, float]:
    """brim_restores_total at /metrics, by its `found` label."""
    return {
        sample.labels["found"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "brim_restores_total"
    }


def names_listed(run: Run) -> list[list[str]]:
    """The names lists (`NAMES_LABEL`) in the requests the provider received."""
    return [
        listed_names(found)
        for call in run.fake.main_calls
        for found in re.findall(NAMES_LISTED, orjson.dumps(call.body).decode())
    ]


def long_number_printed(name: str, step: int) -> bool:
    """Whether `name`, if it is a long number, is one notes file `step` (`numbered_note`)
    printed as a value — its `deadline` or a row's `value=` (file 6's reach four digits): not one
    of Codex's envelope around a command's output (its chunk id, its token count), which is
    neither a line nor a name."""
    if not is_long_number(name):
        return True
    return name == deadline(step) or f"value={name}," in numbered_note(step)


def notice_names(run: Run) -> list[tuple[str, list[str]]]:
    """The quoted lines of evict's notices in the requests the provider received that list
    names (`> tool: line · Names in it: a b`): each line, and the names a removed result
    printed."""
    found = []
    for call in run.fake.main_calls:
        for text in strings_of(call.body):
            if text.startswith(NOTICE_PREFIX) and GISTS_HEADER in text:
                for line in text.split(GISTS_HEADER, 1)[1].split("\n"):
                    said, label, named = line.partition(f" · {NAMES_LABEL}")
                    if label:
                        found.append((said, listed_names(named)))
    return found


def check_restore(cli: Cli, run: Run) -> None:
    """A session brim cut, in which the model called brim_restore with a key it read in a
    placeholder or notice: brim answered the call with the original in a hidden round, the
    model answered, and the CLI got that answer and nothing of the round."""
    check_run(cli, run, RESTORED)
    report = run.report()
    fake = run.fake
    assert isinstance(fake, RestoringSession), report
    # The script: files read until a request showed a key (brim cut it); then a turn that
    # called brim_restore with that key; then, with the original back, the final answer.
    replies = [c.reply for c in fake.main_calls]
    reads = len(replies) - 2
    assert 1 < reads < READS, report
    assert replies == [f"read {n}" for n in range(1, reads + 1)] + ["restore", "final"], report
    asked, answered = fake.asked, fake.answered
    assert asked is not None and answered is not None, report
    assert fake.main_calls[-2:] == [asked.call, answered], report

    # The request the model read the key in: brim cut it (a placeholder or notice names the
    # key) and offered brim_restore.
    cut = orjson.dumps(asked.call.body).decode()
    assert RESTORE_TOOL.name in tool_names(cli.api, asked.call.body), report
    assert asked.key in cut, report
    # The hidden round: the model's brim_restore call answered by its own result (paired by
    # id; the provider checked the pairing). That result is a file the CLI read — the marker
    # planted in its first line there — with lines the cut request no longer had, as the CLI
    # sent them.
    (call,) = tool_uses(cli.api, answered.body, RESTORE_TOOL.name)
    assert call.arguments == {"key": asked.key}, report
    (original,) = restored(cli.api, answered.body)
    back = {
        n: [line for line in note(n).splitlines() if line in original and line not in cut]
        for n in range(1, reads + 1)
        if f"MARKER-{n}:" in original
    }
    assert any(back.values()), report + f"\nrestored {original}"
    from_cli = b"".join(seen.body for seen in run.received).decode()
    assert all(line in from_cli for lines in back.values() for line in lines), report

    # The CLI never saw the call: nothing it sent brim names brim_restore or the key, nor does
    # anything it printed or kept (its transcript, which holds the final answer).
    for seen in run.received:
        assert RESTORE_TOOL.name.encode() not in seen.body, report
        assert asked.key.encode() not in seen.body, report
    assert RESTORE_TOOL.name not in run.stdout + run.stderr, report
    assert asked.key not in run.stdout + run.stderr, report
    assert holding(run.home, RESTORED), report
    assert holding(run.home, RESTORE_TOOL.name) == [] == holding(run.home, asked.key), report

    # brim counted the restore: its audit line names the key, /metrics counts it.
    assert [e["restored"] for e in run.audit if e["restored"]] == [[asked.key]], report
    assert restores_counted(run.metrics) == {"true": 1}, report


def test_claude_code_session_past_the_window(drive: Drive) -> None:
    check_session(CLAUDE, drive(CLAUDE))


def test_codex_session_past_the_window(drive: Drive) -> None:
    run = drive(CODEX)
    check_session(CODEX, run)
    assert (run.home / "last-message.txt").read_text().strip() == FINAL, run.report()


def test_gemini_cli_session_past_the_window(drive: Drive) -> None:
    check_session(GEMINI, drive(GEMINI))


def test_opencode_session_past_the_window(drive: Drive) -> None:
    check_session(OPENCODE, drive(OPENCODE))


# Claude Code takes a model it does not know for its newest, and then sends role "system"
# messages between the turns (beta mid-conversation-system-2026-04-07).
CLAUDE_NEWEST = dataclasses.replace(CLAUDE, model="claude-next-45000")


def test_claude_code_with_a_model_it_does_not_know(drive: Drive) -> None:
    run = drive(CLAUDE_NEWEST)
    check_session(CLAUDE_NEWEST, run)
    # Its system messages reached the provider (which checks where they stand), and those of
    # the first turn are still there, whole, in the last request.
    first = run.fake.main_calls[0].body["messages"]
    last = run.fake.main_calls[-1].body["messages"]
    sent = [m for m in first if m.get("role") == "system"]
    assert sent and all(m in last for m in sent), run.report()


SUMMARIZER = "claude-haiku-summaries"  # a Claude model the fake gives no window (no number)


def test_claude_code_summarizes_with_a_claude_model_on_its_own_key(drive: Drive) -> None:
    """A Claude Code user with only an Anthropic key: what brim evicts is summarized by a
    Claude model on the same upstream, asked on the Messages API with the CLI's own key."""
    run = drive(
        CLAUDE,
        guard={"policies": ["evict", "truncate"]},
        summarize={"enabled": True, "provider": SUMMARIZER, "max_retries": 0},
    )
    check_run(CLAUDE, run, FINAL)
    report = run.report()
    replies = [c.reply for c in run.fake.main_calls]
    assert replies == [f"read {n}" for n in range(1, READS + 1)] + ["final"], report
    asked = [s for s in run.fake.seen if orjson.loads(s.body).get("model") == SUMMARIZER]
    assert asked and all(s.path == "/v1/messages" for s in asked), report
    assert all(s.headers.get("x-api-key") == "sk-ant-test" for s in asked), report
    last = orjson.dumps(run.fake.main_calls[-1].body).decode()
    assert "[brim: a summary of earlier messages" in last, report
    assert any("summarize" in e["actions"] for e in run.audit), report


@pytest.mark.parametrize("cli", [CLAUDE, GEMINI], ids=lambda cli: cli.name)
def test_a_fallback_that_holds_the_session_takes_it_whole(drive: Drive, cli: Cli) -> None:
    """The model has a configured fallback with a window the whole session fits: the requests
    over the model's budget go to it whole (Gemini's in its URL), and nothing is cut."""
    roomy = f"{cli.model.rsplit('-', 1)[0]}-200000"
    run = drive(
        cli,
        models={
            cli.model: {"context_window": cli.window, "max_output": 2_000, "fallbacks": [roomy]},
            roomy: {"context_window": 200_000, "max_output": 2_000},
        },
    )
    report = run.report()
    assert run.returncode == 0 and FINAL in run.stdout, report
    assert run.fake.overflows == [] and run.fake.rejections == [], report
    main = run.fake.main_calls
    assert [c.reply for c in main] == [f"read {n}" for n in range(1, READS + 1)] + ["final"]
    assert main[-1].model == roomy and main[-1].tokens > cli.window, report
    uses = tool_uses(cli.api, main[-1].body, cli.tool)
    assert [whole(n, use.result) for n, use in enumerate(uses, 1)] == [True] * READS, report
    assert run.audit and all(e["actions"] == "fallback:1" for e in run.audit), report


# The same sessions, in which the model fetches back a file that brim cut.


def file_reads(cli: Cli, run: Run, bodies: Iterable[Any]) -> list[tuple[int, str]]:
    """Each read of a notes file in `bodies` (requests): the file, and its result as the
    request carried it."""
    read = {orjson.dumps(cli.arguments(run.work, n)): n for n in range(1, READS + 1)}
    return [
        (read[called], use.result or "")
        for body in bodies
        for use in tool_uses(cli.api, body, cli.tool)
        if (called := orjson.dumps(use.arguments)) in read
    ]


def results_as_sent(cli: Cli, run: Run) -> dict[int, str]:
    """Each notes file's result as the CLI sent it (whole, before brim cut it), by file."""
    bodies = (orjson.loads(seen.body) for seen in run.received if seen.body)
    return {step: text for step, text in file_reads(cli, run, bodies) if text}


def cleared_names_shares(cli: Cli, run: Run) -> list[float]:
    """The names lists of the placeholders the provider received, each checked to be of one
    file's own names (`compute_N`, `result_N_M`, `item-N-M`), all sent by the CLI, the file's
    one long number (`deadline`) among them and no long number it did not print (not Codex's
    chunk id or token count); each list's share of that file's result as the CLI sent it."""
    report = run.report()
    sent = "\n".join(seen.body.decode(errors="replace") for seen in run.received if seen.body)
    as_sent = results_as_sent(cli, run)
    lists = names_listed(run)
    assert lists, report
    shares = []
    for listed in lists:
        assert all(name in sent for name in listed), (listed, report)
        files = [int(m[1] or m[2] or m[3]) for m in map(FILE_NAME.fullmatch, listed) if m]
        assert len(files) >= 3 and len(set(files)) == 1, (listed, report)  # one file's own
        assert deadline(files[0]) in listed, (listed, report)
        assert all(long_number_printed(name, files[0]) for name in listed), (listed, report)
        line = len(NAMES_LABEL + NAMES_SEPARATOR.join(listed))
        shares.append(round(line / len(as_sent[files[0]]), 3))
    return shares


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_cleared_file_keeps_the_names_it_printed(drive: Drive, cli: Cli) -> None:
    # Only the newest result kept whole (`keep = 1`, none spared as `recent`), so the older
    # files are cleared (not all evicted): each placeholder the provider received lists
    # identifiers of its own file and its long number (`cleared_names_shares`), in at most 30 %
    # of its characters. (The files have about 200 lines: the CLIs' own line numbers stay
    # under four digits; tests/policies/test_information.py checks that a read's line numbers
    # are never listed.)
    run = drive(cli, notes=numbered_note, guard={"clear_tool_results": {"keep": 1, "recent": 0}})
    check_run(cli, run, FINAL)
    shares = cleared_names_shares(cli, run)
    assert max(shares) <= 0.3, (shares, run.report())


# Windows where the cuts are shallow: the files clearing takes reach the batch's grid point even
# listing their names in 30 % of their characters.
SHALLOW_WINDOWS = {"claude": 65_000, "codex": 24_000, "gemini": 40_000, "opencode": 43_000}


SMALL_NOTES = (2, 4)  # `mixed_note`: these notes files are a few lines long


def mixed_note(step: int) -> str:
    """`numbered_note(step)`, but for `SMALL_NOTES`: eight short lines, with its constant."""
    if step not in SMALL_NOTES:
        return numbered_note(step)
    rows = [f"item-{step}-{i} = {100 + 37 * i}  # row {i} of the small file" for i in range(5)]
    return "\n".join(
        [
            f"# MARKER-{step}: notes file {step}",
            f"DEADLINE_MS_{step} = {deadline(step)}  # of notes file {step}",
            *rows,
            f"# END-{step}: end of notes file {step}",
        ]
    )


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_small_file_stays_whole_unless_its_placeholder_lists_its_names(
    drive: Drive, cli: Cli
) -> None:
    # Two of the six files are a few lines long: where a placeholder saving two thirds of one
    # has no room for the names it printed, it is worth its tokens — every request that carries
    # it carries it whole, or (a CLI whose read wraps the file in more) cleared with its names,
    # its constant among them; the long files around it are cleared.
    run = drive(cli, notes=mixed_note, guard={"clear_tool_results": {"keep": 1, "recent": 0}})
    check_run(cli, run, FINAL)
    report = run.report()
    sent = file_reads(cli, run, (call.body for call in run.fake.main_calls))
    assert {step for step, _ in sent} >= set(SMALL_NOTES), report
    small = [(step, text) for step, text in sent if step in SMALL_NOTES]
    assert all(whole(step, text) or deadline(step) in text for step, text in small), report
    assert any(CLEARED_PREFIX in text for step, text in sent if step not in SMALL_NOTES), report


# Not opencode: its read wraps a file in more (a header, a gutter), so a small notes file's
# placeholder lists every name it printed — not a small result, cleared at any share.
@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI], ids=lambda cli: cli.name)
def test_small_files_past_their_share_of_the_budget_are_cleared(drive: Drive, cli: Cli) -> None:
    # The same session where small results kept whole may take none of the budget
    # (`small_whole_share = 0`): the small files are cleared as any result is, where their
    # placeholder saves two thirds (a few lines: its head and gist, no room for names). Kept
    # whole without the bound (fails on the code before it).
    guard = {"clear_tool_results": {"keep": 1, "recent": 0, "small_whole_share": 0}}
    run = drive(cli, notes=mixed_note, guard=guard)
    check_run(cli, run, FINAL)
    report = run.report()
    sent = file_reads(cli, run, (call.body for call in run.fake.main_calls))
    small = [text for step, text in sent if step in SMALL_NOTES]
    assert small and any(CLEARED_PREFIX in text for text in small), report


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_shallow_cut_lists_more_of_a_cleared_file_s_names(drive: Drive, cli: Cli) -> None:
    # The session's cuts clear files whose placeholders, listing names in 30 % of their
    # characters (`names_share_with_room`), still save all that their batch reached: they list
    # more than the 15 % (`names_share`) a deeper cut gives them.
    cli = cli.at_window(SHALLOW_WINDOWS[cli.name])
    run = drive(cli, notes=numbered_note, guard={"clear_tool_results": {"keep": 1, "recent": 0}})
    check_run(cli, run, FINAL)
    shares = cleared_names_shares(cli, run)
    assert 0.15 < max(shares) <= 0.3, (shares, run.report())


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_an_evicted_file_is_quoted_with_the_names_it_printed(drive: Drive, cli: Cli) -> None:
    # A window 6 000 tokens larger than the other sessions': evicting old turns is enough, so
    # the notice keeps its quoted lines; nothing is cleared first, so every name listed is one
    # the notice found in a whole removed result. Each line quotes a removed file's line with
    # the names its result printed: names the CLI sent, all of that line's own file (none of
    # Codex's envelope around the output: its chunk id).
    cli = cli.at_window(cli.window + 6_000)
    # Each line lists its file's one long number (`deadline`), and no long number the file did
    # not print.
    run = drive(cli, notes=numbered_note, guard={"policies": ["evict", "truncate"]})
    check_run(cli, run, FINAL)
    report = run.report()
    sent = "\n".join(seen.body.decode(errors="replace") for seen in run.received if seen.body)
    quoted = notice_names(run)
    assert quoted, report
    for said, listed in quoted:
        # the line names its file: a row of it, or its path (opencode's `<path>` line)
        match = FILE_NAME.search(said) or re.search(r"notes_(\d+)\.txt", said)
        assert match is not None, (said, report)
        step = int(next(g for g in match.groups() if g))
        notes = (run.work / f"notes_{step}.txt").read_text()
        assert listed and all(name in sent for name in listed), (said, listed, report)
        assert all(name in notes for name in listed), (said, listed, report)  # the file's own
        assert deadline(step) in listed or deadline(step) in said, (said, listed, report)
        assert all(long_number_printed(name, step) for name in listed), (listed, report)
    # The notice's share has room left once each removed file has its line: the lines list
    # more of each file's names than `NAMES_QUOTED` characters hold.
    assert any(len(NAMES_SEPARATOR.join(listed)) > NAMES_QUOTED for _, listed in quoted), report


GREP_FROM = 1_000  # `grepped_note`'s rows start past this line: four-digit line numbers
# Every fifth row and the constant, with a line of context either side (`-n -C 1`).
GREP_PATTERN = r"DEADLINE|row [0-9]*[05]$"
GREPS = {
    "claude": (
        "Grep",
        lambda work, step: {
            "pattern": GREP_PATTERN,
            "path": str(work / f"notes_{step}.txt"),
            "output_mode": "content",
            "-n": True,
            "-C": 1,
        },
    ),
    "codex": (
        "exec_command",
        lambda work, step: {"cmd": f"grep -n -C 1 -E '{GREP_PATTERN}' notes_{step}.txt"},
    ),
}


def grepped_note(step: int) -> str:
    """`numbered_note(step)` after `GREP_FROM` short lines the grep does not print."""
    return "".join(f"# {n}\n" for n in range(GREP_FROM)) + numbered_note(step)


# Claude Code's Grep and Codex's shell print grep's context lines; Gemini CLI's and opencode's
# search tools print matches alone (`L12:`, `Line 12:`).
@pytest.mark.parametrize("cli", [CLAUDE, CODEX], ids=lambda cli: cli.name)
def test_a_cleared_grep_lists_no_line_numbers(drive: Drive, cli: Cli) -> None:
    # The CLI greps each notes file with a line of context either side: every line it prints
    # starts with its line number, four digits, then a colon (a match) or a dash (context).
    # Each placeholder lists its file's names and constant, and no line number (before, a
    # context line's number was listed, alone or glued to its row's name: `1004-result_2_1`).
    tool, arguments = GREPS[cli.name]
    command = cli.command

    def allowing_grep(*args: Any) -> tuple[list[str], dict[str, str]]:
        argv, env = command(*args)  # Claude Code's tools allowed: its Grep too
        return [f"Read,{tool}" if arg == "Read" else arg for arg in argv], env

    cli = dataclasses.replace(cli, tool=tool, arguments=arguments, command=allowing_grep)
    run = drive(cli, notes=grepped_note, guard={"clear_tool_results": {"keep": 1, "recent": 0}})
    check_run(cli, run, FINAL)
    report = run.report()
    sent = results_as_sent(cli, run)
    assert any(f"\n{GREP_FROM + 4}-" in text for text in sent.values()), report  # context
    lists = names_listed(run)
    assert lists, report
    for listed in lists:
        files = [int(m[1] or m[2] or m[3]) for m in map(FILE_NAME.fullmatch, listed) if m]
        assert files and len(set(files)) == 1, (listed, report)
        step = files[0]
        assert deadline(step) in listed, (listed, report)
        assert all(long_number_printed(name, step) for name in listed), (listed, report)
        assert not any(re.match(r"\d+-", name) for name in listed), (listed, report)


def notices_and_files_gone(run: Run) -> Iterator[tuple[str, list[int]]]:
    """Each evict notice the provider received, with the notes files its request no longer
    carries (by their first line), in order: call k of the session carries files 1 to k."""
    for reads, call in enumerate(run.fake.main_calls):
        texts = strings_of(call.body)
        notices = [text for text in texts if text.startswith(NOTICE_PREFIX)]
        if notices:
            (notice,) = notices
            kept = "\n".join(text for text in texts if not text.startswith(NOTICE_PREFIX))
            yield notice, [n for n in range(1, reads + 1) if f"MARKER-{n}:" not in kept]


def notices_with_few_lines(
    drive: Drive, cli: Cli, notes: Callable[[int], str]
) -> tuple[str, list[tuple[str, list[int], list[str]]]]:
    """The sessions at 6 000 tokens more than the CLI's window, with the notice's quoted lines
    held to one or none (`gist_share` 0.003): the run's report, and each notice the provider
    received with the notes files its request no longer carries and the names its ids line
    lists — only names the CLI sent."""
    cli = cli.at_window(cli.window + 6_000)
    guard = {"policies": ["evict", "truncate"], "evict": {"gist_share": 0.003}}
    run = drive(cli, notes=notes, guard=guard)
    check_run(cli, run, FINAL)
    report = run.report()
    sent = "\n".join(seen.body.decode(errors="replace") for seen in run.received if seen.body)
    found = []
    for notice, removed in notices_and_files_gone(run):
        assert removed, report
        last = notice.split("\n")[-1]
        listed = listed_names(last.removeprefix(IDS_LABEL)) if last.startswith(IDS_LABEL) else []
        assert all(name in sent for name in listed), (listed, report)
        found.append((notice, removed, listed))
    return report, found


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_an_evicted_file_with_no_line_of_its_own_is_named_by_its_ids(
    drive: Drive, cli: Cli
) -> None:
    # The same sessions, with the notice's quoted lines held to one or none: the removed files
    # that get no line are still named by the ids they printed. Every notice the provider
    # received names the constant (`deadline`) of each file its request no longer carries, on a
    # quoted line or on the ids line.
    report, found = notices_with_few_lines(drive, cli, numbered_note)
    only_by_id = 0
    for notice, removed, listed in found:
        quoted = notice.split("\n")[:-1]
        for n in removed:
            assert deadline(n) in notice, (n, notice, report)
            only_by_id += deadline(n) in listed and not any(deadline(n) in line for line in quoted)
    assert only_by_id, report


def artifacts_note(step: int) -> str:
    """`numbered_note(step)` that also lists 30 build artifacts, each a long path with a number
    in it (an id of a dozen tokens, where the file's constant takes three)."""
    first, rest = numbered_note(step).split("\n", 1)
    built = [f"artifact {i}: {artifact(step, i)}" for i in range(30)]
    return "\n".join([first, *built, rest])


def artifact(step: int, i: int) -> str:
    return f"dist/releases/build_{step}{i:03d}/notes-{step}.{i}.tar.gz"


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_an_evicted_file_is_named_by_its_constant_beside_longer_ids(drive: Drive, cli: Cli) -> None:
    # As above, with each file also printing 30 long artifact paths: the ids line gives the
    # newest removed file's ids a quarter of its room, and the rest to the cheapest ids of all
    # the others — every older file's constant (three tokens) before their paths (a dozen).
    # Every notice names the constant of each file its request no longer carries; listed newest
    # first alone, the newest files' paths filled the line and the older constants went.
    report, found = notices_with_few_lines(drive, cli, artifacts_note)
    for notice, removed, _ in found:
        assert all(deadline(n) in notice for n in removed), (removed, notice, report)
    older_paths_left = sum(
        any(artifact(n, i) not in notice for n in removed[:-1] for i in range(30))
        for notice, removed, _ in found
    )
    assert older_paths_left, report  # the line had no room for every path


def links_note(step: int) -> str:
    """`numbered_note(step)` that also lists 30 merged pull requests, each a link under the
    same path (`https://github.com/acme/notes/pull/N`)."""
    first, rest = numbered_note(step).split("\n", 1)
    merged = [f"merged {PULLS}{step}{i:03d}" for i in range(30)]
    return "\n".join([first, *merged, rest])


PULLS = "https://github.com/acme/notes/pull/"


def many_links_note(step: int) -> str:
    """`numbered_note(step)` with 120 merged pull requests under its constant, each a link
    under the same path: written whole, they would take a third of the file."""
    first, constant, rest = numbered_note(step).split("\n", 2)
    merged = [f"merged {PULLS}{step}{i:03d}" for i in range(120)]
    return "\n".join([first, constant, *merged, rest])


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_cleared_file_lists_its_links_under_their_shared_path(drive: Drive, cli: Cli) -> None:
    # Each file prints 120 links under one path (4 000 characters whole, more than the 15 % of
    # the file a placeholder's names take): a cleared file's placeholder writes the path once
    # and the numbers under it (`github.com/acme/notes/pull/{1000,1001,…}`), in the order the
    # result as the CLI sent it printed them (Codex cuts a long output's middle), beside the
    # file's constant and its own names — more links than its whole names line could hold
    # written out.
    run = drive(cli, notes=many_links_note, guard={"clear_tool_results": {"keep": 1, "recent": 0}})
    check_run(cli, run, FINAL)
    report = run.report()
    shared = PULLS.removeprefix("https://")
    placeholders = {
        text
        for call in run.fake.main_calls
        for text in strings_of(call.body)
        if text.startswith(CLEARED_PREFIX)
    }
    assert placeholders, report
    as_sent = results_as_sent(cli, run)
    for placeholder in placeholders:
        *_, last = placeholder.split("\n")
        assert last.startswith(NAMES_LABEL) and f" {shared}{{" in last, (placeholder, report)
        listed = listed_names(last.removeprefix(NAMES_LABEL))
        (step,) = {int(m[1] or m[2] or m[3]) for m in map(FILE_NAME.fullmatch, listed) if m}
        assert deadline(step) in listed, (placeholder, report)
        printed = as_sent[step]
        links = [f"{shared}{step}{i:03d}" for i in range(120) if f"{step}{i:03d}" in printed]
        assert len(links) >= 40, (printed, report)
        quoted = [link for link in links if link in placeholder.split(NAMES_LABEL)[0]]
        got = [name for name in listed if name.startswith(shared)]
        assert got == [link for link in links if link not in quoted][: len(got)], report
        assert len(quoted) <= 1, (placeholder, report)
        # more links than the whole names line could hold written whole
        assert len(got) * len(NAMES_SEPARATOR + links[0]) > len(last), (placeholder, report)


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_an_evicted_file_s_links_are_listed_under_their_shared_path(drive: Drive, cli: Cli) -> None:
    # Each file also prints 30 links under one path: the ids line writes the path once and the
    # numbers under it (`github.com/acme/notes/pull/{1000,1001}`), every number one the CLI
    # sent; and it still names the constant of every file its request no longer carries.
    report, found = notices_with_few_lines(drive, cli, links_note)
    shared = PULLS.removeprefix("https://")
    groups = [n for notice, _, _ in found if f"{shared}{{" in (n := notice.split("\n")[-1])]
    assert groups, report
    for notice, removed, _ in found:
        assert all(deadline(n) in notice for n in removed), (removed, notice, report)
    most = max(sum(name.startswith(shared) for name in listed) for _, _, listed in found)
    assert most >= 10, (most, report)


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_notice_with_little_room_quotes_what_fits(drive: Drive, cli: Cli) -> None:
    # At the sessions' own window, with every old turn evicted, the CLI's fixed cost and the
    # turns kept leave the notice less room than its share: its quoted lines shrink to what
    # fits under the budget, the newest removed file's first (they all went before). Every
    # notice the provider received quotes the newest file it removed, and every request is
    # within its budget. Where the recent turns had to go too (compress's last resorts), the
    # first pass's notice goes into the new one whole: every notice names the constant of every
    # file its request no longer carries, and says it removed two messages per file at least
    # (before, it said "3 earlier messages" for five files, and named the newest alone).
    # Codex's envelope around a command's output (its chunk id, wall time, exit code) is
    # neither a quoted line nor a name: a notice says what the commands printed.
    run = drive(cli, notes=numbered_note, guard={"policies": ["evict", "truncate"]})
    check_run(cli, run, FINAL)
    report = run.report()
    sent = "\n".join(seen.body.decode(errors="replace") for seen in run.received if seen.body)
    chunks = set(re.findall(r"Chunk ID: (\w+)", sent))
    assert bool(chunks) == (cli is CODEX), report
    checked = 0
    for notice, removed in notices_and_files_gone(run):
        assert not any(chunk in notice for chunk in chunks), (notice, report)
        assert "Wall time:" not in notice, (notice, report)
        assert removed and GISTS_HEADER in notice, (notice, report)
        assert deadline(removed[-1]) in notice.split(GISTS_HEADER, 1)[1], (notice, report)
        assert all(deadline(n) in notice for n in removed), (removed, notice, report)
        count = re.match(re.escape(NOTICE_PREFIX) + r"(\d+) earlier messages", notice)
        assert count is not None and int(count[1]) >= 2 * len(removed), (notice, report)
        checked += 1
    assert checked, report
    assert all(e["tokens_out"] <= e["budget"] for e in run.audit), report


def short_and_long_note(step: int) -> str:
    """Notes files 1 to 3 short (ten rows), file 4 five times a file's length (the CLIs' own read
    tools may cut it), 5 and 6 as usual."""
    first, *rows, end, _ = note(step).split("\n")
    if step <= 3:
        rows = rows[:10]
    elif step == 4:
        rows = [
            row.replace(f"result_{step}_", f"result_{step}{k}_") for k in "abcde" for row in rows
        ]
    return "\n".join([first, *rows, end]) + "\n"


# Windows where the cut that evicts file 4's long result saves more than the batch needed.
# Codex is not here: its exec_command gives back about 4K tokens of a long output (head and
# tail), less than a batch (30 % of the budget), so no one result of its outweighs one.
PUT_BACK_WINDOWS = {"claude": 66_000, "gemini": 52_000, "opencode": 45_000}


@pytest.mark.parametrize("cli", [CLAUDE, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_the_short_files_before_a_long_one_stay_when_it_goes(drive: Drive, cli: Cli) -> None:
    # Three short files, then a long one: the cut that removes the long file's turn, the batch's
    # last, saves more than the batch needed, so the short files before it, which went first,
    # go back: a request reaches the provider with files 1 to 3 whole and file 4 gone (before,
    # all four went: files 5 and 6 alone).
    cli = cli.at_window(PUT_BACK_WINDOWS[cli.name])
    run = drive(cli, notes=short_and_long_note, guard={"policies": ["evict", "truncate"]})
    check_run(cli, run, FINAL)
    report = run.report()
    texts = ["\n".join(strings_of(call.body)) for call in run.fake.main_calls]
    carried = [{n for n in range(1, READS + 1) if whole(n, text)} for text in texts]
    cuts = [files for files, text in zip(carried, texts, strict=True) if "MARKER-4:" not in text]
    assert any({5, 6} <= files for files in cuts), (carried, report)  # the cut came
    assert any({1, 2, 3, 5, 6} <= files for files in cuts), (carried, report)


def escaped_note(step: int) -> str:
    """Big file `step`, larger than what any window here leaves for it, its lines full of what
    JSON escapes — tabs, quotes, backslashes: each two characters where an API carries the
    file in a JSON string, as Gemini's function responses do — with the first and last lines
    `whole` looks for."""
    lines = [f"# MARKER-{step}: notes file {step}"]
    for i in range(700):
        row = f'{{"id": "item-{step}-{i}", "path": "C:\\\\notes\\\\{step}\\\\{i}.txt"}}'
        lines.append(f'{i:6}\t{row}\t"ok"')
    lines.append(f"# END-{step}: end of notes file {step}")
    return "\n".join(lines) + "\n"


def long_numbered_note(step: int) -> str:
    """Big file `step` (`note`), its rows three and a half times over, larger than what any window
    here leaves for it, with its constant (`deadline`) in the middle."""
    first, *rows, end, _ = note(step).split("\n")
    rows = (rows * 4)[:700]
    rows.insert(350, f"DEADLINE_MS_{step} = {deadline(step)}  # of notes file {step}")
    return "\n".join([first, *rows, end]) + "\n"


CUT_NAMES = re.compile(
    r"tokens cut from the middle by brim; the whole is sha256:[0-9a-f]{16} …\]\n"
    + re.escape(NAMES_LABEL)
    + r"(.*)\n"
)


@pytest.mark.parametrize("cli", [CLAUDE, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_file_cut_in_the_middle_lists_the_names_that_went(drive: Drive, cli: Cli) -> None:
    # Every file is larger than the room the window leaves, its constant in the middle: the
    # newest one is cut in the middle, and the marker lists the names the middle printed — the
    # constant among them (a planted number in a Read alone over the budget was lost with its
    # middle) — and the request still shows the constants of the files before it. Codex is not
    # in it: its exec_command keeps a long output's head and tail itself, so the middle never
    # reaches brim.
    run = drive(cli, notes=long_numbered_note)
    check_run(cli, run, FINAL)
    report = run.report()
    cuts: list[tuple[int, str, list[str], str]] = []  # file, its text, names listed, request
    for call in run.fake.main_calls:
        texts = strings_of(call.body)
        sent = "\n".join(texts)
        for text in texts:
            for found in CUT_NAMES.findall(text):
                step = int(re.findall(r"MARKER-(\d+)", text)[0])  # the file whose head it is
                cuts.append((step, text, listed_names(found), sent))
    assert max((step for step, *_ in cuts), default=0) > 1, report  # files came before a cut
    for step, text, listed, sent in cuts:
        assert deadline(step) in listed and deadline(step) not in CUT_NAMES.sub("", text)
        files = {int(m[1] or m[2] or m[3]) for m in map(FILE_NAME.fullmatch, listed) if m}
        assert files <= {step}, (listed, report)  # none of another file
        printed = long_numbered_note(step)
        assert all(name in printed for name in listed), (listed, report)
        # The files read before it, which the request no longer carries whole, still show
        # their constants: in a placeholder, or in the notice's ids line beside a file that
        # takes the whole budget.
        assert all(deadline(k) in sent for k in range(1, step)), (step, report)


def test_codex_beside_an_output_over_the_budget_still_shows_the_earlier_constants(
    drive: Drive,
) -> None:
    # Codex keeps a long output's head and tail itself (about 4K tokens): at a 9K window, its
    # instructions and one output are over the budget, so each request cuts the newest output
    # and evicts every file before it. The notice still lists the constants those files
    # printed (each file's `deadline`, on its second line): before, beside a turn over the
    # budget, it was bare.
    cli = CODEX.at_window(9_000)
    run = drive(cli, notes=numbered_note)
    check_run(cli, run, FINAL)
    report = run.report()
    sent = ["\n".join(strings_of(call.body)) for call in run.fake.main_calls]
    newest = [max(map(int, re.findall(r"MARKER-(\d+)", text)), default=0) for text in sent]
    cut = [
        (text, step)
        for text, step in zip(sent, newest, strict=True)
        if step > 1 and "tokens cut from the middle by brim" in text
    ]
    assert len(cut) >= 4, report
    for text, step in cut:
        assert all(deadline(k) in text for k in range(1, step)), (step, report)
        assert re.search(rf"{re.escape(IDS_LABEL)}.*\b{deadline(step - 1)}\b", text), report


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_a_cut_into_escaped_text_uses_the_budget(drive: Drive, cli: Cli) -> None:
    # Every file is larger than the room the window leaves: each newest one is cut into (Codex
    # caps a command's output itself: there the older files are), evict and clear take the
    # older ones. A cut into text goes only as far as the budget needs,
    # measured as the request carries the text (in the bench's Gemini requests a token of such
    # lines took 1.2, and a cut sized by the text's own tokens went out at 71 % of the budget;
    # the CLIs' own requests carry them at about one, so this checks the cut, all four ways).
    run = drive(cli, notes=escaped_note)
    check_run(cli, run, FINAL)
    report = run.report()
    cut = [
        e
        for e in run.audit
        if e["outcome"] == "compressed" and re.search(r"\b(prune|truncate):", e["actions"] or "")
    ]
    assert cut, report
    assert all(e["tokens_out"] >= 0.95 * e["budget"] for e in cut), report


def test_claude_code_restores_what_brim_cut(drive: Drive) -> None:
    check_restore(CLAUDE, drive(CLAUDE, restore=True))


def test_codex_restores_what_brim_cut(drive: Drive) -> None:
    run = drive(CODEX, restore=True)
    check_restore(CODEX, run)
    assert (run.home / "last-message.txt").read_text().strip() == RESTORED, run.report()


def test_gemini_cli_restores_what_brim_cut(drive: Drive) -> None:
    check_restore(GEMINI, drive(GEMINI, restore=True))


def test_opencode_restores_what_brim_cut(drive: Drive) -> None:
    check_restore(OPENCODE, drive(OPENCODE, restore=True))


# Through `brim run`: brim run starts brim from a proxy.toml and points the CLI at it.


@dataclass
class Launch:
    launched: Launched
    fake: ScriptedProvider

    def report(self) -> str:
        calls = [(c.api, c.model, c.reply) for c in self.fake.calls]
        return f"{self.launched.report()}\ncalls {calls}\nunknown {self.fake.unknown_paths}"


class BrimRun(Protocol):
    def __call__(self, cli: Cli) -> Launch: ...


@pytest.fixture
def brim_run(cli_bin: Path, loop_thread: LoopThread, tmp_path: Path) -> Iterator[BrimRun]:
    """Runs one CLI with `brim run --config proxy.toml -- CLI …` in a scratch folder, one prompt
    answered at once by a scripted fake provider that only the proxy.toml names."""
    runners: list[Any] = []

    def run(cli: Cli) -> Launch:
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        fake = ScriptedProvider(cli.tool, lambda step: cli.arguments(work, step), 0, FINAL)
        runner, url = loop_thread.run(start_app(fake.app()))
        runners.append(runner)
        config = tmp_path / "proxy.toml"
        base_url = f"{url}/v1" if cli.upstream == "openai" else url
        config.write_text(
            f'[upstreams.fake]\napi = "{cli.upstream}"\nbase_url = "{base_url}"\n'
            f'[models."{cli.model}"]\ncontext_window = {cli.window}\nmax_output = 2000\n'
        )
        argv, extra = cli.command(cli_bin / cli.name, home, None, cli.model)
        env = {**offline_env(cli_bin, home), **extra}
        return Launch(
            launch(["--config", str(config), "--", *argv], env, work, CLI_TIMEOUT_S), fake
        )

    yield run
    for runner in runners:
        loop_thread.run(runner.cleanup())


@pytest.mark.parametrize("cli", [CLAUDE, CODEX, GEMINI, OPENCODE], ids=lambda cli: cli.name)
def test_brim_run_points_the_cli_at_brim(brim_run: BrimRun, cli: Cli) -> None:
    run = brim_run(cli)
    launched, report = run.launched, run.report()
    assert launched.returncode == 0, report
    assert FINAL in launched.stdout, report
    # The provider, which only brim knows, answered the CLI's prompt.
    assert [c.reply for c in run.fake.calls if c.main] == ["final"], report
    summary = launched.summary
    assert summary is not None and summary.requests >= 1, report
    assert gone(launched), report
