"""How each coding CLI is run: its command line and environment (`CLIS`: one entry per CLI, the
flags of the versions pinned in tests/real_clis.py), the model flag a brim model id gives it,
and what of brim's environment its process does not inherit."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from brim.adapters.cli.readers import (
    ClaudeReader,
    CodexReader,
    CursorReader,
    GeminiReader,
    OpencodeReader,
    Reader,
)
from brim.adapters.errors import InvalidRequest
from brim.adapters.upstream_config import UpstreamConfig
from brim.policies.limits import CLI_MARKER


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
