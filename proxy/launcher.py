"""`brim run -- COMMAND [ARGS…]`: run a coding CLI (or any command) through brim.

brim starts in this process on a free loopback port (or `--url` names a running one), the
command runs attached to the terminal with what it needs to talk to brim, and when it exits
brim stops and one summary line goes to stderr. The command's exit status is `brim run`'s.

What each CLI needs is one small entry of `SETUPS`; every command, known or not, also gets
`OPENAI_BASE_URL` and `ANTHROPIC_BASE_URL` (`generic_env`). Nothing of the user's own config or
sign-in is written: overrides travel in the command's environment and arguments only.

Signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `brim run` (kill, a supervisor) are passed
to the command. Those the terminal sends (Ctrl-C, Ctrl-\\, a hang-up) reach the command by
themselves — it is in the terminal's foreground process group with brim — and are not sent a
second time (a second Ctrl-C would make Claude Code quit where the user meant to interrupt).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from brim.proxy.config import BrimConfig
from brim.proxy.status_view import ADMIN_KEY_ENV, open_direct

# Signals passed on to the command when a process (not the terminal) sends them to brim run.
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
NOT_FOUND = 127  # as a shell answers a command it cannot find
CANNOT_RUN = 126
FETCH_TIMEOUT_S = 5.0
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0

Env = Mapping[str, str]


# -- What each CLI needs ------------------------------------------------------------------------


def generic_env(base: str) -> dict[str, str]:
    """What every command gets: the base URLs the OpenAI and Anthropic SDKs read."""
    return {"OPENAI_BASE_URL": f"{base}/v1", "ANTHROPIC_BASE_URL": base}


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file of the user's, or {} when it is missing or not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _home(env: Env) -> Path:
    return Path(env.get("HOME") or Path.home())


def claude_warnings(env: Env) -> list[str]:
    """Claude Code signed in with a claude.ai account (no API key) is warned about."""
    if env.get("ANTHROPIC_API_KEY") or env.get("ANTHROPIC_AUTH_TOKEN"):
        return []
    folder = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else None
    state = _read_json((folder or _home(env)) / ".claude.json")
    credentials = _read_json((folder or _home(env) / ".claude") / ".credentials.json")
    if state.get("primaryApiKey") or not (
        state.get("oauthAccount") or credentials.get("claudeAiOauth")
    ):
        return []
    return [
        "Claude Code is signed in with a claude.ai account and no API key is set: its requests "
        "carry that sign-in's token, which brim forwards, but Anthropic's API may refuse it. "
        "Set ANTHROPIC_API_KEY (or sign in with a Console account) to go through brim reliably."
    ]


def codex_argv(argv: Sequence[str], base: str, env: Env) -> list[str]:
    """Codex's provider for this run, as `-c` overrides (right after `codex`, so for every
    subcommand): the user's config.toml, login and sessions stay as they are. The key: from
    OPENAI_API_KEY when it is set, else Codex's own login (`codex login --with-api-key`)."""
    settings: dict[str, object] = {
        "model_provider": "brim",
        "model_providers.brim.name": "brim",
        "model_providers.brim.base_url": f"{base}/v1",
        "model_providers.brim.wire_api": "responses",
    }
    if env.get("OPENAI_API_KEY"):
        settings["model_providers.brim.env_key"] = "OPENAI_API_KEY"
    else:
        settings["model_providers.brim.requires_openai_auth"] = True
    overrides = [f"{key}={json.dumps(value)}" for key, value in settings.items()]
    return [argv[0], *(arg for item in overrides for arg in ("-c", item)), *argv[1:]]


def codex_warnings(env: Env) -> list[str]:
    """Codex signed in with ChatGPT (and no API key) talks to ChatGPT's backend, not brim."""
    if env.get("OPENAI_API_KEY") or env.get("CODEX_API_KEY"):
        return []
    folder = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else _home(env) / ".codex"
    auth = _read_json(folder / "auth.json")
    if auth.get("OPENAI_API_KEY") or not auth.get("tokens"):
        return []
    return [
        "Codex is signed in with ChatGPT: that sign-in works only against ChatGPT's own backend "
        "and does not go through brim. Use an API key (OPENAI_API_KEY, or "
        "`codex login --with-api-key`) to go through brim."
    ]


def gemini_env(base: str, env: Env) -> dict[str, str]:
    return {"GOOGLE_GEMINI_BASE_URL": base}


def gemini_warnings(env: Env) -> list[str]:
    """Gemini CLI signed in with Google (or on Vertex AI) ignores GOOGLE_GEMINI_BASE_URL."""
    selected = None
    for settings in (_home(env) / ".gemini" / "settings.json", Path(".gemini/settings.json")):
        data = _read_json(settings)
        security = data.get("security")
        auth = security.get("auth") if isinstance(security, dict) else None
        chosen = (auth.get("selectedType") if isinstance(auth, dict) else None) or data.get(
            "selectedAuthType"
        )
        selected = chosen if isinstance(chosen, str) else selected
    if selected == "gemini-api-key" or (
        selected is None and (env.get("GEMINI_API_KEY") or env.get("GOOGLE_API_KEY"))
    ):
        return []
    if selected is None:
        how = "not given a Gemini API key (GEMINI_API_KEY)"
    else:
        how = "on Vertex AI" if "vertex" in selected else "signed in with Google"
    return [
        f"Gemini CLI is {how}: only its Gemini API key mode uses GOOGLE_GEMINI_BASE_URL; a "
        "Google sign-in or Vertex AI goes straight to Google, not through brim."
    ]


# opencode's providers whose address brim run sets, and the path brim serves each under.
OPENCODE_PROVIDERS = {"openai": "/v1", "anthropic": "/v1", "google": "/v1beta"}


def opencode_env(base: str, env: Env) -> dict[str, str]:
    """opencode reads extra config from OPENCODE_CONFIG_CONTENT, merged over the user's: the
    `baseURL` of its OpenAI, Anthropic and Google providers (over any content already set)."""
    content = {}
    if env.get("OPENCODE_CONFIG_CONTENT"):
        try:
            content = json.loads(env["OPENCODE_CONFIG_CONTENT"])
        except ValueError:
            content = {}
    providers = content.setdefault("provider", {})
    for name, path in OPENCODE_PROVIDERS.items():
        options = providers.setdefault(name, {}).setdefault("options", {})
        options["baseURL"] = base + path
    return {"OPENCODE_CONFIG_CONTENT": json.dumps(content)}


def opencode_warnings(env: Env) -> list[str]:
    """opencode's OAuth sign-ins (ChatGPT, GitHub Copilot, …) use their own endpoints."""
    data = Path(env.get("XDG_DATA_HOME") or _home(env) / ".local" / "share")
    auth = _read_json(data / "opencode" / "auth.json")
    signed_in = sorted(
        name
        for name, entry in auth.items()
        if isinstance(entry, dict) and entry.get("type") == "oauth"
    )
    if not signed_in:
        return []
    return [
        f"opencode is signed in with OAuth to {', '.join(signed_in)}: brim run sets the address "
        f"of opencode's {', '.join(OPENCODE_PROVIDERS)} providers only, and an OAuth sign-in may "
        "send its requests to its own service instead of brim."
    ]


def _no_env(base: str, env: Env) -> dict[str, str]:
    return {}


def _same_argv(argv: Sequence[str], base: str, env: Env) -> list[str]:
    return list(argv)


def _no_warnings(env: Env) -> list[str]:
    return []


@dataclass(frozen=True)
class Setup:
    """What one CLI needs to talk to brim at `base` (http://127.0.0.1:PORT, no path), beyond
    `generic_env`: more environment, a changed command line, and warnings about sign-ins that
    would bypass brim (read from the environment and the CLI's own files, never written)."""

    env: Callable[[str, Env], dict[str, str]] = _no_env
    argv: Callable[[Sequence[str], str, Env], list[str]] = _same_argv
    warnings: Callable[[Env], list[str]] = _no_warnings


GENERIC = Setup()
SETUPS: dict[str, Setup] = {
    "claude": Setup(warnings=claude_warnings),  # ANTHROPIC_BASE_URL: generic_env
    "codex": Setup(argv=codex_argv, warnings=codex_warnings),
    "gemini": Setup(env=gemini_env, warnings=gemini_warnings),
    "opencode": Setup(env=opencode_env, warnings=opencode_warnings),
}


def setup_for(command: str) -> Setup:
    """The entry for a command by its file name (`/usr/local/bin/claude` is claude)."""
    return SETUPS.get(Path(command).name, GENERIC)


# -- brim's own numbers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Totals:
    """What brim counted (its Prometheus counters at /metrics, summed over their labels)."""

    requests: float = 0
    prevented: float = field(default=0, metadata={"metric": "brim_overflows_prevented_total"})
    survived: float = field(default=0, metadata={"metric": "brim_overflows_survived_total"})
    tokens_removed: float = field(default=0, metadata={"metric": "brim_tokens_removed_total"})
    restores: float = field(default=0, metadata={"metric": "brim_restores_total"})

    @classmethod
    def parse(cls, text: str) -> Totals:
        """From /metrics text. Restores count only calls whose key was still there."""
        metric = {f.metadata.get("metric", f"brim_{f.name}_total"): f.name for f in fields(cls)}
        sums = dict.fromkeys(metric.values(), 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = metric.get(sample.name)
                if name and (name != "restores" or sample.labels.get("found") == "true"):
                    sums[name] += sample.value
        return cls(**sums)

    def __sub__(self, other: Totals) -> Totals:
        return Totals(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )

    def line(self) -> str:
        """The summary line `brim run` prints."""
        return (
            f"brim: {self.requests:.0f} requests, {self.prevented:.0f} overflows prevented, "
            f"{self.survived:.0f} survived, {self.tokens_removed:,.0f} tokens removed, "
            f"{self.restores:.0f} restores"
        )


def _get(url: str, headers: Mapping[str, str] | None = None) -> bytes | None:
    """GET `url` straight (never through the user's HTTP proxy); None if it fails."""
    try:
        with open_direct(
            urllib.request.Request(url, headers=dict(headers or {})), FETCH_TIMEOUT_S
        ) as reply:
            body: bytes = reply.read()
            return body
    except OSError:
        return None


def read_totals(base: str) -> Totals | None:
    """brim's totals at `base`, or None when its /metrics cannot be read (with the admin key in
    $BRIM_ADMIN_KEY, if set, for a brim whose /metrics needs it)."""
    admin_key = os.environ.get(ADMIN_KEY_ENV)
    text = _get(f"{base}/metrics", {"x-brim-admin-key": admin_key} if admin_key else None)
    try:
        return None if text is None else Totals.parse(text.decode())
    except ValueError:
        return None


# -- brim in this process -----------------------------------------------------------------------


class InProcessBrim:
    """brim on a free 127.0.0.1 port, on an event loop in a daemon thread."""

    def __init__(self, config: BrimConfig) -> None:
        # Private to this run: loopback, no brim keys (as `brim serve` on loopback needs none),
        # /metrics on, without the admin key, for the summary.
        server = {"host": LOOPBACK, "api_keys": (), "metrics_public": True}
        self.config = config.model_copy(
            update={
                "server": config.server.model_copy(update=server),
                "telemetry": config.telemetry.model_copy(update={"prometheus": True}),
            }
        )
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="brim", daemon=True)
        self._runner: Any = None

    def start(self) -> str:
        """Start listening; returns brim's base URL."""
        from brim.proxy.app import bound_port, start

        self._thread.start()
        self._runner = self._call(start(self.config, LOOPBACK, 0))
        return f"http://{LOOPBACK}:{bound_port(self._runner)}"

    def stop(self) -> None:
        """Finish what is in flight, close everything, stop the loop and its thread."""
        if self._runner is not None:
            self._call(self._runner.cleanup())
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
        self._loop.close()

    def _call(self, coro: Any) -> Any:
        import asyncio

        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(START_TIMEOUT_S + self.config.server.shutdown_timeout_s)


def _new_loop() -> Any:
    import asyncio

    from brim.proxy.app import loop_factory

    factory = loop_factory()
    return factory() if factory else asyncio.new_event_loop()


# -- The command --------------------------------------------------------------------------------


def exit_code(status: int) -> int:
    """The command's exit code; killed by signal N: 128 + N, as a shell reports it."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def spawn(argv: Sequence[str], env: Env) -> int:
    """Start the command (found on `env`'s PATH) with every signal unblocked; its pid."""
    path = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if path is None:
        raise FileNotFoundError(argv[0])
    # Python ignores SIGPIPE and SIGXFSZ; the command gets their defaults back, as subprocess does.
    restored = (signal.SIGPIPE, signal.SIGXFSZ)
    return os.posix_spawn(path, list(argv), dict(env), setsigmask=(), setsigdef=restored)


def wait(pid: int) -> int:
    """Wait for the command, passing on the signals a process sends brim run; its exit code.

    Where the system says who sent a signal (`sigwaitinfo`: Linux, the BSDs), those the
    kernel sent for the terminal are not passed on (the command got them too). Elsewhere
    SIGINT and SIGQUIT are not passed on while brim run is in the terminal's foreground (where
    they come from the keyboard); the others always are.
    """
    if hasattr(signal, "sigwaitinfo"):
        watched = {*RELAYED, signal.SIGCHLD}
        while True:
            info = signal.sigwaitinfo(watched)
            if info.si_signo == signal.SIGCHLD:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return exit_code(status)
            elif info.si_code <= 0:  # SI_USER, SI_QUEUE, SI_TKILL: sent by a process
                _send(pid, info.si_signo)

    def relay(signum: int, frame: object) -> None:
        if signum in (signal.SIGINT, signal.SIGQUIT) and _foreground():
            return
        _send(pid, signum)

    for signum in RELAYED:
        signal.signal(signum, relay)
    _, status = os.waitpid(pid, 0)
    return exit_code(status)


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has just exited: wait will say so
        os.kill(pid, signum)


def _foreground() -> bool:
    try:
        with open("/dev/tty") as tty:
            return os.tcgetpgrp(tty.fileno()) == os.getpgrp()
    except OSError:
        return False


class _Signals:
    """The relayed signals (and SIGCHLD) blocked, for `wait` to take with `sigwaitinfo`, in this
    thread and in the threads started meanwhile (brim's); the old mask and handlers back
    after, with what arrived in between dropped."""

    def __enter__(self) -> None:
        self._handlers = {s: signal.getsignal(s) for s in RELAYED}
        self._mask: set[int] | None = None
        if hasattr(signal, "sigwaitinfo"):
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*RELAYED, signal.SIGCHLD})

    def __exit__(self, *exc: object) -> None:
        if self._mask is not None:
            watched = {*RELAYED, signal.SIGCHLD}
            while signal.sigtimedwait(watched, 0) is not None:
                pass
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)


def run(args: argparse.Namespace) -> int:
    """`brim run`: the command's exit code (2 for brim's own usage and config errors)."""
    from brim.proxy.commands import _load

    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("brim run: name the command to run, e.g. brim run -- claude", file=sys.stderr)
        return 2
    config = None if args.url else _load(args.config)
    source = "already running" if args.url else args.config or "built-in defaults"
    setup = setup_for(argv[0])
    with _Signals():
        brim = None if config is None else InProcessBrim(config)
        try:
            base = args.url.rstrip("/") if brim is None else brim.start()
            if brim is None and _get(f"{base}/healthz") is None:
                print(f"brim run: no brim answers at {base}", file=sys.stderr)
                return 1
            before = read_totals(base) if brim is None else Totals()
            print(f"brim run: brim at {base} ({source})", file=sys.stderr)
            env = {**os.environ, **generic_env(base)}
            env.update(setup.env(base, env))
            for warning in setup.warnings(env):
                print(f"brim run: warning: {warning}", file=sys.stderr)
            try:
                pid = spawn(setup.argv(argv, base, env), env)
            except FileNotFoundError:
                print(f"brim run: command not found: {argv[0]}", file=sys.stderr)
                return NOT_FOUND
            except OSError as exc:
                print(f"brim run: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
                return CANNOT_RUN
            code = wait(pid)
            after = read_totals(base)
        finally:
            if brim is not None:
                brim.stop()
    if after is None or before is None:
        print(f"brim: no counts: {base}/metrics could not be read", file=sys.stderr)
    else:
        print((after - before).line(), file=sys.stderr)
    return code


def add_command(commands: Any) -> None:
    """Register `brim run` on the `brim` command's subparsers."""
    run_command = commands.add_parser(
        "run",
        help="run a command (claude, codex, gemini, opencode, …) through brim",
        description="Start brim on a free loopback port (or use --url), run COMMAND pointed at "
        "it, stop brim when COMMAND exits and print a summary line. Exit status: COMMAND's.",
    )
    run_command.add_argument(
        "--config", help="proxy.toml for the brim this starts (default as for serve)"
    )
    run_command.add_argument(
        "--url", help="use the brim running at this URL (e.g. http://127.0.0.1:8787)"
    )
    run_command.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS…]", help="what to run"
    )
    run_command.set_defaults(func=run)
