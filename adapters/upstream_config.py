"""Typed settings of one upstream, checked at construction (the `[upstreams.NAME]` table)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from brim.adapters.native import NATIVE_COUNTS

WireApi = Literal["openai", "anthropic", "gemini", "litellm", "cli"]
# The coding CLIs an `api = "cli"` upstream can run (`adapters.cli` has one entry for each).
CliName = Literal["claude", "codex", "gemini", "opencode", "cursor-agent"]
CLI_NAMES: tuple[str, ...] = ("claude", "codex", "gemini", "opencode", "cursor-agent")
# Upstreams with a token counter of their own (Anthropic `count_tokens`, Gemini `countTokens`).
NATIVE_COUNT_APIS = frozenset(NATIVE_COUNTS)


def cli_of(command: str) -> str | None:
    """The CLI a command runs, by its file name (`/opt/bin/claude` → claude), if it is one."""
    name = os.path.basename(command.strip().rstrip("/\\")).lower()
    for suffix in (".exe", ".cmd", ".js", ".mjs"):
        name = name.removesuffix(suffix)
    return name if name in CLI_NAMES else None


class FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


def secret_from_env(data: Any, env_field: str, field: str, parse: Callable[[str], Any]) -> Any:
    """For a before-validator: `field` is only ever filled from the environment variable that
    `env_field` names (a value for it in the file is dropped), parsed by `parse`."""
    if not isinstance(data, dict):
        return data
    data = {key: value for key, value in data.items() if key != field}
    name = data.get(env_field)
    if name:
        value = os.environ.get(name)
        if not value:
            raise ValueError(f"{env_field} names {name!r}, which is not set")
        data[field] = parse(value)
    return data


class UpstreamConfig(FrozenModel):
    api: WireApi
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = Field(600, gt=0)  # the wait for the reply to start, and between chunks
    connect_timeout_s: float = Field(10, gt=0)
    max_duration_s: float = Field(3600, gt=0)  # the longest one request may take, streaming too
    model_prefix: str = ""
    proxy_from_env: bool = False  # honour HTTP(S)_PROXY / NO_PROXY / .netrc (costs per request)
    # Ask the provider's own token counter when brim's estimate is too close to the budget to
    # tell (Claude, Gemini). "auto": on for the upstreams that have one (anthropic, gemini).
    native_count: Literal["auto"] | bool = "auto"
    native_count_timeout_s: float = Field(2, gt=0)  # then brim's own estimate decides
    # api = "cli": the command that runs the CLI (a name on PATH or a path), which CLI it is
    # (from the command's name unless set), extra arguments and environment for it, where the
    # scratch folders of its runs go, and its process pool: at most `max_concurrency` runs at
    # once, `max_queued` more waiting up to `queue_timeout_s`, any beyond answered 429.
    command: str | None = None
    cli: CliName | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    max_concurrency: int = Field(2, ge=1, le=256)
    max_queued: int = Field(16, ge=0, le=10_000)
    queue_timeout_s: float = Field(30, ge=0)
    api_key: SecretStr | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _read_api_key(cls, data: Any) -> Any:
        return secret_from_env(data, "api_key_env", "api_key", SecretStr)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https:// (got {value!r})")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _base_url_required(self) -> UpstreamConfig:
        if self.api not in ("litellm", "cli") and self.base_url is None:
            raise ValueError(f"base_url is required for api = {self.api!r}")
        return self

    @model_validator(mode="after")
    def _cli_named(self) -> UpstreamConfig:
        if self.api != "cli":
            if self.command is not None:
                raise ValueError(f'command is only for api = "cli", not api = {self.api!r}')
            return self
        if not self.command or not self.command.strip():
            raise ValueError(
                'command is required for api = "cli": the CLI to run, a name on PATH or a '
                f"path ({', '.join(CLI_NAMES)})"
            )
        if self.base_url is not None:
            raise ValueError(
                'base_url is not used by api = "cli"; point the CLI at its provider with its '
                "own settings (env, args)"
            )
        if self.cli is None and cli_of(self.command) is None:
            raise ValueError(
                f"cannot tell which CLI command {self.command!r} runs: set cli to one of "
                f"{', '.join(CLI_NAMES)}"
            )
        return self

    @property
    def cli_name(self) -> str | None:
        """Which CLI an `api = "cli"` upstream runs."""
        if self.api != "cli" or self.command is None:
            return None
        return self.cli or cli_of(self.command)

    @model_validator(mode="after")
    def _native_count_possible(self) -> UpstreamConfig:
        if self.native_count is True and self.api not in NATIVE_COUNT_APIS:
            raise ValueError(
                f"native_count = true needs an upstream with its own token counter "
                f"(api = anthropic or gemini), not api = {self.api!r}"
            )
        return self

    @property
    def counts_natively(self) -> bool:
        """Whether brim may ask this upstream for its own count of a request."""
        if self.native_count == "auto":
            return self.api in NATIVE_COUNT_APIS
        return self.native_count is True
