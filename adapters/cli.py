"""CLI-backed providers (`api = "cli"`): a Chat Completions request answered by running a coding
CLI headless — `claude -p`, `codex exec`, `gemini -p`, `opencode run`, `cursor-agent -p`.

brim serves a model, not an agent: the conversation (system prompt, turns, tool calls and their
results) is rendered into one prompt, sent on the CLI's stdin, with the CLI's own tools switched
off; the CLI's JSON (or stream-JSON) output is read line by line into Chat Completions — an SSE
stream, or one `chat.completion` — with the usage the CLI reports.

Each run gets a scratch working directory (removed after) and its own process group, killed
whole when the run times out (`timeout_s`, the whole run), when the client goes away, and after
the CLI exits (whatever it left running goes too). At most `max_concurrency` runs at once per
upstream; up to `max_queued` more wait at most `queue_timeout_s`, and any other request is
answered 429 with `retry-after`. The CLI's stderr is logged, never sent to the client; a failure
becomes the documented error: the CLI missing (502, naming the command), not logged in (401),
timed out (504), or its own "prompt is too long" — a `ContextOverflow`, so that learned limits
and the retry stage work as with any provider.

Each CLI is one entry of `CLIS`: how to build its command line and environment, and how to read
its output. The flags are those of the versions pinned in tests/real_clis.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from multidict import CIMultiDict

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.errors import (
    AuthFailed,
    ContextOverflow,
    InvalidRequest,
    RateLimited,
    UpstreamError,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
    hide_addresses,
)
from brim.adapters.exchange import Exchange
from brim.adapters.overflow import Overflow, classify
from brim.adapters.upstream_config import UpstreamConfig
from brim.policies.limits import CLI_MARKER
from brim.policies.wires.base import ErrorInfo
from brim.policies.wires.chat import CHAT

log = logging.getLogger("brim.cli")
T = TypeVar("T")

_JSON = CIMultiDict({"Content-Type": "application/json"})
_SSE = CIMultiDict({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
LINE_LIMIT = 64 * 1024 * 1024  # one line of the CLI's JSON output (a whole answer, at most)
STDERR_KEPT = 64 * 1024  # the tail of the CLI's stderr kept for the log
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the process to be reaped

AUTH_WORDING = re.compile(
    r"not logged in|please run /login|/login\b|invalid api key|invalid x-api-key|"
    r"authentication|unauthori[sz]ed|auth method|api key not valid|missing api key|"
    r"no api key|OPENAI_API_KEY|GEMINI_API_KEY|ANTHROPIC_API_KEY|\blogin\b",
    re.I,
)
RATE_WORDING = re.compile(r"rate limit|too many requests|quota|usage limit|\b429\b", re.I)


# -- What a run reports -----------------------------------------------------------------------


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Used:
    prompt: int
    completion: int
    cached: int = 0


@dataclass(slots=True)
class Failed:
    """The CLI reported a failure: its message (the provider's, as the CLI words it), the HTTP
    status it names if any, and whether it says the prompt was too long."""

    message: str
    status: int | None = None
    overflow: bool = False


Event = Text | Used | Failed


class Reader:
    """Reads one CLI's JSON output, one parsed line at a time."""

    def __init__(self) -> None:
        self.texts = 0  # text events given
        self.final = False  # the CLI said its turn is over

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        raise NotImplementedError

    def end(self) -> list[Event]:
        """Events due once the output is over (a failure held back until the end)."""
        return []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class ClaudeReader(Reader):
    """`claude -p --output-format stream-json --verbose --include-partial-messages`: the API's
    own stream events (`stream_event`), then one `result` with the usage, or `is_error`."""

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        if kind == "stream_event":
            event = line.get("event") or {}
            delta = event.get("delta") or {}
            if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
                text = delta.get("text")
                if isinstance(text, str) and text:
                    self.texts += 1
                    return [Text(text)]
            return []
        if kind != "result":
            return []
        self.final = True
        usage = line.get("usage") or {}
        result = line.get("result")
        if line.get("is_error") or line.get("subtype") not in (None, "success"):
            status = line.get("api_error_status")
            message = result if isinstance(result, str) and result else str(line.get("subtype"))
            return [Failed(message, status if isinstance(status, int) else None)]
        events: list[Event] = []
        if not self.texts and isinstance(result, str) and result:
            self.texts += 1
            events.append(Text(result))
        cached = _int(usage.get("cache_read_input_tokens"))
        prompt = _int(usage.get("input_tokens")) + cached
        prompt += _int(usage.get("cache_creation_input_tokens"))
        events.append(Used(prompt, _int(usage.get("output_tokens")), cached))
        return events


class CursorReader(ClaudeReader):
    """`cursor-agent -p --output-format stream-json`: whole `assistant` messages (no partial
    ones asked for), then a `result` like Claude Code's."""

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        if line.get("type") == "assistant":
            message = line.get("message") or {}
            content = message.get("content")
            texts = [
                block.get("text")
                for block in (content if isinstance(content, list) else [])
                if isinstance(block, dict) and block.get("type") == "text"
            ]
            text = "".join(t for t in texts if isinstance(t, str))
            if text:
                self.texts += 1
                return [Text(text)]
            return []
        return super().feed(line)


class CodexReader(Reader):
    """`codex exec --json`: `item.completed` items (the answer is an `agent_message`), then
    `turn.completed` with the usage or `turn.failed`. Top-level `error` events may be followed by
    a retry, so only `turn.failed` (or the exit status) makes them final; an item of type
    `error` is a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        if kind == "item.completed":
            item = line.get("item") or {}
            text = item.get("text")
            if item.get("type") == "agent_message" and isinstance(text, str) and text:
                self.texts += 1
                return [Text(("\n\n" if self.texts > 1 else "") + text)]
            return []
        if kind == "error":
            message = line.get("message")
            if isinstance(message, str):
                self.errors.append(message)
            return []
        if kind == "turn.completed":
            self.final = True
            usage = line.get("usage") or {}
            cached = _int(usage.get("cached_input_tokens"))
            return [Used(_int(usage.get("input_tokens")), _int(usage.get("output_tokens")), cached)]
        if kind == "turn.failed":
            self.final = True
            error = line.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else None
            return [Failed(message if isinstance(message, str) else "; ".join(self.errors))]
        return []

    def end(self) -> list[Event]:
        return [Failed(self.errors[-1])] if self.errors and not self.final else []


class GeminiReader(Reader):
    """`gemini -p … --output-format stream-json`: `message` events (the assistant's as deltas),
    then a `result` with `stats`, or with `status` "error"."""

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        if kind == "message" and line.get("role") == "assistant":
            text = line.get("content")
            if isinstance(text, str) and text:
                self.texts += 1
                return [Text(text)]
            return []
        if kind == "error":
            message = line.get("message")
            return [Failed(message if isinstance(message, str) else json.dumps(line))]
        if kind != "result":
            return []
        self.final = True
        if line.get("status") not in (None, "success"):
            error = line.get("error") or {}
            message = error.get("message") if isinstance(error, dict) else None
            return [Failed(message if isinstance(message, str) else str(line.get("status")))]
        stats = line.get("stats") or {}
        return [
            Used(
                _int(stats.get("input_tokens")),
                _int(stats.get("output_tokens")),
                _int(stats.get("cached")),
            )
        ]


class OpencodeReader(Reader):
    """`opencode run --format json`: `text` parts (each whole), `step_finish` with the step's
    tokens, and `error` events (`ContextOverflowError` among them)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = Used(0, 0)
        self.steps = 0

    def feed(self, line: Mapping[str, Any]) -> list[Event]:
        kind = line.get("type")
        part = line.get("part") or {}
        if kind == "text":
            text = part.get("text")
            if isinstance(text, str) and text:
                self.texts += 1
                return [Text(("\n\n" if self.texts > 1 else "") + text)]
            return []
        if kind == "step_finish":
            tokens = part.get("tokens") or {}
            cache = tokens.get("cache") or {}
            self.used.prompt += _int(tokens.get("input")) + _int(cache.get("read"))
            self.used.completion += _int(tokens.get("output")) + _int(tokens.get("reasoning"))
            self.used.cached += _int(cache.get("read"))
            self.steps += 1
            return []
        if kind == "error":
            error = line.get("error") or {}
            data = error.get("data") or {}
            message = data.get("message") if isinstance(data, dict) else None
            name = str(error.get("name") or "")
            status = data.get("statusCode") if isinstance(data, dict) else None
            return [
                Failed(
                    message if isinstance(message, str) else name or "opencode failed",
                    status if isinstance(status, int) else None,
                    overflow="ContextOverflow" in name,
                )
            ]
        return []

    def end(self) -> list[Event]:
        return [self.used] if self.steps else []


# -- How each CLI is run ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    """One run's command line (after the executable) and the environment it adds."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


# Codex features that give the model tools (codex features list, 0.169); all off.
CODEX_TOOL_FEATURES = (
    "shell_tool",
    "unified_exec",
    "apps",
    "image_generation",
    "view_image",
    "browser_use",
    "browser_use_external",
    "in_app_browser",
    "computer_use",
    "sleep_tool",
    "tool_suggest",
    "skill_search",
    "goals",
    "multi_agent",
)


def _model_flag(model: str | None) -> list[str]:
    """`--model=VALUE`, one argument: a value can never be read as a flag of its own."""
    return [f"--model={model}"] if model else []


def claude_command(model: str | None, settings: Path | None, env: Mapping[str, str]) -> Command:
    args = ["-p", "--output-format", "stream-json", "--verbose", "--include-partial-messages"]
    args += ["--tools", "", "--no-session-persistence"]
    return Command(args + _model_flag(model))


def cursor_command(model: str | None, settings: Path | None, env: Mapping[str, str]) -> Command:
    # No flag switches its tools off; without --force it may not run commands or write.
    args = ["-p", "--output-format", "stream-json"]
    return Command(args + _model_flag(model))


def codex_command(model: str | None, settings: Path | None, env: Mapping[str, str]) -> Command:
    args = ["exec", "--json", "--skip-git-repo-check", "--ephemeral", "--color", "never"]
    args += ["--sandbox", "read-only", "-c", 'approval_policy="never"']
    args += ["-c", 'web_search="disabled"']
    for feature in CODEX_TOOL_FEATURES:
        args += ["--disable", feature]
    return Command(args + _model_flag(model) + ["-"])


def gemini_command(model: str | None, settings: Path | None, env: Mapping[str, str]) -> Command:
    # `-p ""`: headless, the prompt read from stdin. Its tools go off in a system settings file
    # (`tools.core = []`), the only place that can say so without touching the user's own.
    args = ["-p", "", "--output-format", "stream-json", "--skip-trust"]
    extra = {"GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(settings)} if settings else {}
    return Command(args + _model_flag(model), extra)


def opencode_command(model: str | None, settings: Path | None, env: Mapping[str, str]) -> Command:
    # Its tools go off in the config it merges last (OPENCODE_CONFIG_CONTENT), over any given.
    try:
        config = json.loads(env.get("OPENCODE_CONFIG_CONTENT") or "{}")
    except ValueError:
        config = {}
    if not isinstance(config, dict):
        config = {}
    config["tools"] = {**(config.get("tools") or {}), "*": False}
    args = ["run", "--format", "json", "--pure", "--title", "brim"]
    extra = {"OPENCODE_CONFIG_CONTENT": json.dumps(config)}
    return Command(args + _model_flag(model), extra)


@dataclass(frozen=True, slots=True)
class Cli:
    name: str
    command: Callable[[str | None, Path | None, Mapping[str, str]], Command]
    reader: Callable[[], Reader]
    login_hint: str  # how a user logs this CLI in


CLIS: dict[str, Cli] = {
    "claude": Cli(
        "claude",
        claude_command,
        ClaudeReader,
        "run `claude` once and /login, or set ANTHROPIC_API_KEY in brim's environment",
    ),
    "codex": Cli(
        "codex",
        codex_command,
        CodexReader,
        "run `codex login`, or set OPENAI_API_KEY in brim's environment",
    ),
    "gemini": Cli(
        "gemini",
        gemini_command,
        GeminiReader,
        "run `gemini` once and sign in, or set GEMINI_API_KEY in brim's environment",
    ),
    "opencode": Cli(
        "opencode",
        opencode_command,
        OpencodeReader,
        "run `opencode auth login`, or set the provider's API key in brim's environment",
    ),
    "cursor-agent": Cli(
        "cursor-agent",
        cursor_command,
        CursorReader,
        "run `cursor-agent login`, or set CURSOR_API_KEY in brim's environment",
    ),
}


# A model name a CLI is given: what model ids are made of (`sonnet[1m]`, `openai/gpt-4.1`,
# `openrouter/x:free`), never starting with "-" (a flag) and without spaces, quotes or "=".
CLI_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+\[\]-]{0,199}")


def cli_model(model: str) -> str | None:
    """The CLI's model flag for a brim model id: the part after the colon (`claude:sonnet` →
    sonnet, `[cli]gemini:flash` → flash, `opencode:openai/gpt-4.1` → openai/gpt-4.1); None, the
    CLI's own default, for an id without one. A part that is not a plain model name (`CLI_MODEL`:
    `claude:--proxy=…` would otherwise reach the CLI's argument parser) is `InvalidRequest`."""
    text = model.strip()
    if text.lower().startswith(CLI_MARKER):
        text = text[len(CLI_MARKER) :]
    head, colon, tail = text.partition(":")
    if not (colon and tail and "/" not in head):
        return None
    if CLI_MODEL.fullmatch(tail) is None:
        raise InvalidRequest(
            f"The model {model[:100]!r} names a CLI model {tail[:100]!r} that is not a plain "
            "model name (letters, digits and . _ : / @ + [ ] -, not starting with -).",
            param="model",
        )
    return tail


@dataclass(frozen=True, slots=True)
class ChildEnv:
    """What a CLI's process does not inherit from brim's environment: the variables brim's
    configuration names as secrets (`names`: every `…_env` key), every variable whose name starts
    with one of `prefixes` (brim's own `BRIM_…` settings), and every variable whose value holds
    one of `values` (a password in `[cache] url`). A CLI upstream's own `api_key_env` is the one
    secret its process keeps; its `env` table is added on top."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ("BRIM_",)
    values: tuple[str, ...] = ()

    def environment(self, parent: Mapping[str, str], config: UpstreamConfig) -> dict[str, str]:
        """The environment for a run of the CLI upstream `config`."""
        own = config.api_key_env
        kept = {
            name: value
            for name, value in parent.items()
            if name == own
            or (
                name not in self.names
                and not name.startswith(self.prefixes)
                and not any(secret in value for secret in self.values)
            )
        }
        kept.update(config.env)
        return kept


# Without a configuration to name its secrets (a test's or a tool's adapter): BRIM_… only.
BRIM_SETTINGS_ONLY = ChildEnv()


# -- The conversation as one prompt -----------------------------------------------------------

PREAMBLE = (
    "Below is a conversation between a user and an AI assistant, turn by turn. Reply as the "
    "assistant to the last turn: write only the assistant's next message."
)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part.get("refusal"), str):
                    parts.append(part["refusal"])
                elif kind in ("image_url", "input_image", "image"):
                    parts.append("[an image, not shown]")
                elif kind in ("input_audio", "audio"):
                    parts.append("[an audio clip, not shown]")
                elif kind in ("file", "input_file"):
                    parts.append("[a file, not shown]")
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def render_prompt(messages: Sequence[Any]) -> str:
    """The conversation as one prompt: a lone user message as it is; anything more as tagged
    turns — system and developer prompts, user and assistant turns, each tool call with its id,
    name and arguments, each tool result with the id it answers."""
    items = [m for m in messages if isinstance(m, dict)]
    if len(items) == 1 and items[0].get("role") == "user":
        return _content_text(items[0].get("content"))
    blocks = [PREAMBLE]
    for message in items:
        role = str(message.get("role") or "user")
        text = _content_text(message.get("content"))
        if role in ("system", "developer"):
            blocks.append(f"<system>\n{text}\n</system>")
        elif role == "assistant":
            lines = [text] if text else []
            for call in message.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                function = call.get("function") or {}
                lines.append(
                    f'<tool_call id="{call.get("id", "")}" name="{function.get("name", "")}">'
                    f"{function.get('arguments', '')}</tool_call>"
                )
            legacy = message.get("function_call")
            if isinstance(legacy, dict):
                lines.append(
                    f'<tool_call name="{legacy.get("name", "")}">'
                    f"{legacy.get('arguments', '')}</tool_call>"
                )
            body = "\n".join(lines)
            blocks.append(f"<assistant>\n{body}\n</assistant>")
        elif role in ("tool", "function"):
            answered = message.get("tool_call_id") or message.get("name") or ""
            blocks.append(f'<tool_result id="{answered}">\n{text}\n</tool_result>')
        else:
            blocks.append(f"<user>\n{text}\n</user>")
    return "\n\n".join(blocks) + "\n"


# -- The adapter ------------------------------------------------------------------------------


class CliAdapter:
    """Runs one configured CLI for each request (`api = "cli"`)."""

    def __init__(
        self, name: str, config: UpstreamConfig, child_env: ChildEnv = BRIM_SETTINGS_ONLY
    ) -> None:
        cli = config.cli_name
        if config.api != "cli" or cli is None or config.command is None:
            raise ValueError(f"upstream {name!r}: not a CLI upstream (api = {config.api!r})")
        self.name = name
        self.config = config
        self.child_env = child_env
        self.cli = CLIS[cli]
        self.command = config.command.strip()
        self._root: str | None = None  # where scratch folders go (None: the system's temp)
        if config.workdir is not None:
            root = Path(config.workdir).expanduser()
            self._root = str(root)
            if not root.is_dir():
                raise ValueError(
                    f"upstream {name!r}: workdir {str(root)!r} is not an existing folder"
                )
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._waiting = 0
        self._running: set[int] = set()  # process groups of runs in progress
        self._settings: Path | None = None
        if self.executable() is None:
            log.warning("upstream %r: %s", name, self._missing_message())

    # -- configuration checks ----------------------------------------------------------------

    def _path(self) -> str:
        path = self.config.env.get("PATH")
        return path if path is not None else os.environ.get("PATH", os.defpath)

    def executable(self) -> str | None:
        """The command's full path, if it can be run."""
        if os.sep in self.command or (os.altsep and os.altsep in self.command):
            path = os.path.expanduser(self.command)
            return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
        return shutil.which(self.command, path=self._path())

    def _missing_message(self) -> str:
        if os.sep in self.command:
            path = os.path.expanduser(self.command)
            why = "does not exist" if not os.path.exists(path) else "is not an executable file"
            return (
                f"upstream {self.name!r}: the {self.cli.name} CLI at {path!r} {why} "
                f"([upstreams.{self.name}] command)"
            )
        return (
            f"upstream {self.name!r}: the {self.cli.name} CLI {self.command!r} is not on PATH; "
            f"install it, or set [upstreams.{self.name}] command to its full path"
        )

    def _gemini_settings(self, env: Mapping[str, str]) -> Path | None:
        """A system settings file for Gemini CLI that turns its tools off (`tools.core = []`),
        over the system settings it would otherwise read. Gemini CLI skips a settings file in
        a folder that others may write to (any /tmp), so it lives in brim's cache folder."""
        if self._settings is not None:
            return self._settings
        base_path = env.get("GEMINI_CLI_SYSTEM_SETTINGS_PATH") or "/etc/gemini-cli/settings.json"
        settings: dict[str, Any] = {}
        try:
            settings = json.loads(Path(base_path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning(
                "upstream %r: cannot read Gemini CLI's system settings %s (%s); its tools stay on",
                self.name,
                base_path,
                exc,
            )
            return None
        if not isinstance(settings, dict):
            settings = {}
        tools = settings.get("tools")
        settings["tools"] = {**(tools if isinstance(tools, dict) else {}), "core": []}
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = Path(cache) / "brim" / "cli"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            safe = re.sub(r"[^\w.-]", "_", self.name)
            target = folder / f"gemini-settings-{os.getpid()}-{safe}.json"
            target.write_text(json.dumps(settings), encoding="utf-8")
            target.chmod(0o600)
        except OSError as exc:
            log.warning(
                "upstream %r: cannot write Gemini CLI settings to %s (%s); its tools stay on",
                self.name,
                folder,
                exc,
            )
            return None
        self._settings = target
        return target

    # -- the pool ----------------------------------------------------------------------------

    def _busy(self, why: str) -> RateLimited:
        retry_after = max(1, math.ceil(min(self.config.queue_timeout_s, 60) or 1))
        message = (
            f"upstream {self.name!r}: all {self.config.max_concurrency} {self.cli.name} CLI "
            f"processes are busy ({why}); retry after {retry_after} s"
        )
        headers = CIMultiDict({"Content-Type": "application/json", "retry-after": str(retry_after)})
        body = CHAT.error_body(ErrorInfo(429, "rate_limit_error", message, "cli_busy"))
        return RateLimited(upstream=self.name, status=429, headers=headers, body=body)

    async def _acquire(self) -> None:
        if self._slots.locked():
            if self._waiting >= self.config.max_queued:
                raise self._busy(f"{self._waiting} requests already waiting")
            self._waiting += 1
            try:
                async with asyncio.timeout(self.config.queue_timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise self._busy(
                    f"none came free within queue_timeout_s ({self.config.queue_timeout_s:g} s)"
                ) from None
            finally:
                self._waiting -= 1
        else:
            await self._slots.acquire()

    # -- errors ------------------------------------------------------------------------------

    def _failure(self, failed: Failed) -> UpstreamFailure:
        """A failure the CLI reported, as the documented error (its body in the Chat Completions
        error shape, the CLI's message in it)."""
        said, status = failed.message.strip() or "no message", failed.status
        overflow = classify(400, said)
        message = hide_addresses(said)  # the CLI's provider's address is not the client's
        if overflow is None and failed.overflow:
            overflow = Overflow(message=message)
        cli = self.cli.name
        if overflow is not None:
            body = CHAT.error_body(
                ErrorInfo(400, "invalid_request_error", message, "context_length_exceeded")
            )
            return ContextOverflow(
                upstream=self.name, status=400, headers=_JSON, body=body, overflow=overflow
            )
        if status in (401, 403) or (status is None and AUTH_WORDING.search(message)):
            text = (
                f"upstream {self.name!r}: the {cli} CLI is not logged in or its credentials were "
                f"refused ({self.cli.login_hint}): {message}"
            )
            body = CHAT.error_body(
                ErrorInfo(401, "authentication_error", text, "cli_not_logged_in")
            )
            return AuthFailed(
                upstream=self.name, status=401, headers=_JSON, body=body, message=text
            )
        if status == 429 or (status is None and RATE_WORDING.search(message)):
            text = f"upstream {self.name!r}: the {cli} CLI was rate limited: {message}"
            body = CHAT.error_body(ErrorInfo(429, "rate_limit_error", text, None))
            return RateLimited(upstream=self.name, status=429, headers=_JSON, body=body)
        code = status if isinstance(status, int) and 400 <= status < 600 else 502
        text = f"upstream {self.name!r}: the {cli} CLI failed: {message}"
        error_type = "invalid_request_error" if code < 500 else "upstream_error"
        body = CHAT.error_body(ErrorInfo(code, error_type, text, "cli_failed"))
        return UpstreamError(
            upstream=self.name, status=code, headers=_JSON, body=body, message=text
        )

    # -- a request ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        for group in list(self._running):
            _kill_group(group)
        if self._settings is not None:
            with contextlib.suppress(OSError):
                self._settings.unlink()
            self._settings = None

    async def send(self, exchange: Exchange) -> UpstreamResponse:
        if exchange.api != CHAT.name or exchange.body is None:
            raise UpstreamProtocolError(
                f"upstream {self.name!r} (api = cli) serves Chat Completions requests only",
                upstream=self.name,
            )
        messages = exchange.body.get("messages")
        prompt = render_prompt(messages if isinstance(messages, list) else [])
        executable = self.executable()
        if executable is None:
            raise UpstreamUnreachable(self._missing_message(), upstream=self.name)
        await self._acquire()
        try:
            run = await self._start(executable, exchange, prompt)
        except BaseException:
            self._slots.release()
            raise
        try:
            if not exchange.stream:
                return await self._whole(exchange, run)
            first = await run.first()
        except BaseException:
            await run.close()
            raise
        return UpstreamResponse(
            status=200,
            headers=_SSE,
            chunks=self._stream(exchange, run, first),
            closer=run.close,
        )

    async def _start(self, executable: str, exchange: Exchange, prompt: str) -> Run:
        env = self.child_env.environment(os.environ, self.config)
        settings = self._gemini_settings(env) if self.cli.name == "gemini" else None
        command = self.cli.command(cli_model(exchange.model), settings, env)
        env.update(command.env)
        scratch = Path(tempfile.mkdtemp(prefix="brim-cli-", dir=self._root))
        argv = [executable, *command.args, *self.config.args]
        log.debug("request %s: running %s in %s", exchange.request_id, argv, scratch)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=scratch,
                env=env,
                start_new_session=True,  # its own process group, killed whole
                limit=LINE_LIMIT,
            )
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise UpstreamUnreachable(
                f"{self._missing_message()} ({exc.strerror or exc})", upstream=self.name
            ) from exc
        return Run(self, process, scratch, prompt.encode(), exchange.request_id)

    async def _whole(self, exchange: Exchange, run: Run) -> UpstreamResponse:
        try:
            texts: list[str] = []
            used: Used | None = None
            async for event in run.events():
                if isinstance(event, Text):
                    texts.append(event.text)
                elif isinstance(event, Used):
                    used = event
        finally:
            await run.close()
        completion = _completion(exchange.model, "".join(texts), used)
        return UpstreamResponse(
            status=200, headers=_JSON, body=orjson.dumps(completion), payload=completion
        )

    async def _stream(
        self, exchange: Exchange, run: Run, first: Event | None
    ) -> AsyncIterator[bytes]:
        body = exchange.body or {}
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        head = {
            "id": f"chatcmpl-cli-{os.urandom(12).hex()}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": exchange.model,
        }
        used: Used | None = None
        try:
            yield _chunk(head, {"role": "assistant", "content": ""})
            if isinstance(first, Text):
                yield _chunk(head, {"content": first.text})
            elif isinstance(first, Used):
                used = first
            async for event in run.events():
                if isinstance(event, Text):
                    yield _chunk(head, {"content": event.text})
                elif isinstance(event, Used):
                    used = event
            yield _chunk(head, {}, "stop")
            if include_usage:
                usage = _usage(used)
                yield b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            await run.close()


def _usage(used: Used | None) -> dict[str, Any]:
    if used is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    usage: dict[str, Any] = {
        "prompt_tokens": used.prompt,
        "completion_tokens": used.completion,
        "total_tokens": used.prompt + used.completion,
    }
    if used.cached:
        usage["prompt_tokens_details"] = {"cached_tokens": used.cached}
    return usage


def _completion(model: str, text: str, used: Used | None) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-cli-{os.urandom(12).hex()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(used),
    }


def _chunk(head: Mapping[str, Any], delta: Mapping[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


class Run:
    """One CLI process: its prompt written to stdin, its stderr kept (the tail, for the log),
    its stdout read into events. `close` kills its process group, removes its scratch folder and
    gives its pool slot back, once."""

    def __init__(
        self,
        adapter: CliAdapter,
        process: asyncio.subprocess.Process,
        scratch: Path,
        prompt: bytes,
        request_id: str,
    ) -> None:
        self.adapter = adapter
        self.process = process
        self.scratch = scratch
        self.request_id = request_id
        self.reader = adapter.cli.reader()
        self.deadline = asyncio.get_running_loop().time() + min(
            adapter.config.timeout_s, adapter.config.max_duration_s
        )
        self.stderr = bytearray()
        self.closed = False
        self._rest: AsyncIterator[Event] | None = None
        adapter._running.add(process.pid)
        self._writer = asyncio.ensure_future(self._write(prompt))
        self._drain = asyncio.ensure_future(self._read_stderr())

    async def _write(self, prompt: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        with contextlib.suppress(ConnectionError, BrokenPipeError, OSError):
            stdin.write(prompt)
            await stdin.drain()
            stdin.close()

    async def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        while chunk := await stream.read(65536):
            self.stderr += chunk
            if len(self.stderr) > STDERR_KEPT:
                del self.stderr[: len(self.stderr) - STDERR_KEPT]

    def _timeout(self) -> UpstreamTimeout:
        limit = min(self.adapter.config.timeout_s, self.adapter.config.max_duration_s)
        return UpstreamTimeout(
            f"upstream {self.adapter.name!r}: the {self.adapter.cli.name} CLI did not finish "
            f"within timeout_s ({limit:g} s); it was stopped",
            upstream=self.adapter.name,
        )

    async def first(self) -> Event | None:
        """The run's first text (or its usage, for an answer without text), read before the
        client is told 200: a failure the CLI reports first raises here, where the retry stage
        can still act on it."""
        events = self.events()
        async for event in events:
            self._rest = events
            return event
        self._rest = events
        return None

    async def events(self) -> AsyncIterator[Event]:
        """The run's events to its end; a reported failure, a timeout or an exit without an
        answer raises the documented error."""
        rest = self._rest
        if rest is not None:
            self._rest = None
            async for event in rest:
                yield event
            return
        stdout = self.process.stdout
        assert stdout is not None
        reader = self.reader
        while True:
            try:
                line = await self._within(stdout.readline())
            except ValueError as exc:  # a line over LINE_LIMIT
                raise UpstreamProtocolError(
                    f"upstream {self.adapter.name!r}: the {self.adapter.cli.name} CLI wrote a "
                    f"line longer than {LINE_LIMIT} bytes",
                    upstream=self.adapter.name,
                ) from exc
            if not line:
                break
            parsed = _parse(line)
            if parsed is None:
                continue
            for event in reader.feed(parsed):
                if isinstance(event, Failed):
                    raise self._failed(event)
                yield event
        for event in reader.end():
            if isinstance(event, Failed):
                raise self._failed(event)
            yield event
        await self._within(asyncio.shield(self._drain))
        returncode = await self._within(self.process.wait())
        if (returncode != 0 or not reader.texts) and not reader.final:
            raise self._exited(returncode)

    async def _within(self, waiting: Awaitable[T]) -> T:
        """`waiting`, awaited no later than the run's deadline (each wait on its own: a timeout
        around a `yield` would fire in whatever the consumer is doing)."""
        try:
            async with asyncio.timeout_at(self.deadline):
                return await waiting
        except TimeoutError:
            self._log("timed out")
            raise self._timeout() from None

    def _failed(self, failed: Failed) -> UpstreamFailure:
        self._log(f"reported a failure: {failed.message[:300]!r}")
        return self.adapter._failure(failed)

    def _exited(self, returncode: int) -> UpstreamFailure:
        """The CLI ended without an answer or a failure of its own in its output: what its
        stderr says decides between "not logged in" and a plain failure (stderr itself stays in
        the log)."""
        self._log(f"exited with status {returncode} without an answer")
        tail = self.stderr.decode("utf-8", "replace")
        cli, name = self.adapter.cli, self.adapter.name
        if AUTH_WORDING.search(tail):
            return self.adapter._failure(Failed(f"exit status {returncode}", 401))
        status = f"status {returncode}" if returncode >= 0 else f"signal {-returncode}"
        text = (
            f"upstream {name!r}: the {cli.name} CLI exited with {status} without an answer "
            f"(its stderr is in brim's log, request {self.request_id})"
        )
        body = CHAT.error_body(ErrorInfo(502, "upstream_error", text, "cli_failed"))
        return UpstreamError(upstream=name, status=502, headers=_JSON, body=body, message=text)

    def _log(self, what: str) -> None:
        tail = self.stderr.decode("utf-8", "replace").strip()[-2000:]
        log.warning(
            "request %s: upstream %r: the %s CLI %s%s",
            self.request_id,
            self.adapter.name,
            self.adapter.cli.name,
            what,
            f"; its stderr ends: {tail}" if tail else "",
        )

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        process = self.process
        try:
            _kill_group(process.pid)
            self._writer.cancel()
            self._drain.cancel()
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                async with asyncio.timeout(KILL_WAIT_S):
                    await process.wait()
            await asyncio.gather(self._writer, self._drain, return_exceptions=True)
        finally:
            self.adapter._running.discard(process.pid)
            self.adapter._slots.release()
            # Shielded: the caller is often a handler being cancelled (its client went away); a
            # removal cancelled before its thread took it up would leave the folder for good.
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, self.scratch, True))


def _parse(line: bytes) -> dict[str, Any] | None:
    text = line.strip()
    if not text.startswith(b"{"):
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
