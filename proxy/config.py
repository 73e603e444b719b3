"""brim's configuration: `proxy.toml` parsed once at start-up into frozen, validated objects.

Precedence, highest first: `BRIM_…` environment variables (nested keys joined by a double
underscore, e.g. `BRIM_SERVER__PORT=9000`, `BRIM_UPSTREAMS__OPENAI__BASE_URL=…`), the file, the
built-in defaults. Unknown keys are reported as warnings and otherwise ignored; a bad value is a
`ConfigError` naming the key, and brim refuses to start.

Secrets never live in the file: `api_key_env` / `api_keys_env` name environment variables, which
are read here, once, into `SecretStr` values.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from adapters.config import FrozenModel, UpstreamConfig, secret_from_env
from middleware.settings import (
    ArchiveConfig,
    AuditConfig,
    CacheConfig,
    GuardConfig,
    RetryConfig,
    SummarizeConfig,
    TelemetryConfig,
)
from policies.clients import ClientRule
from policies.limits import ModelFacts
from policies.nesting import SAFE_DEPTH

ENV_PREFIX = "BRIM_"
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
GEMINI_BASE_URL = "https://generativelanguage.googleapis.com"


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and the problem."""


def _key_list(raw: str) -> tuple[SecretStr, ...]:
    keys = tuple(SecretStr(key.strip()) for key in raw.split(",") if key.strip())
    if not keys:
        raise ValueError("the api_keys_env variable holds no key")
    return keys


class ServerConfig(FrozenModel):
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    max_body_mb: float = Field(32, gt=0)
    max_header_kb: int = Field(8, ge=1, le=1024)  # the request line and each header line
    max_headers: int = Field(128, ge=16, le=4096)
    max_json_depth: int = Field(SAFE_DEPTH, ge=8, le=200)  # orjson writes at most 254 levels
    api_keys_env: str | None = None
    admin_keys_env: str | None = None  # keys for /admin/*; unset: the admin endpoints are off
    allow_unauthenticated: bool = False  # serve beyond loopback without api_keys (say so here)
    shutdown_timeout_s: float = Field(10, ge=0)
    api_keys: tuple[SecretStr, ...] = Field(default=(), exclude=True)
    admin_keys: tuple[SecretStr, ...] = Field(default=(), exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _read_api_keys(cls, data: Any) -> Any:
        data = secret_from_env(data, "api_keys_env", "api_keys", _key_list)
        return secret_from_env(data, "admin_keys_env", "admin_keys", _key_list)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


def _default_upstreams() -> dict[str, UpstreamConfig]:
    return {
        "openai": UpstreamConfig(api="openai", base_url=OPENAI_BASE_URL),
        "anthropic": UpstreamConfig(api="anthropic", base_url=ANTHROPIC_BASE_URL),
        "gemini": UpstreamConfig(api="gemini", base_url=GEMINI_BASE_URL),
    }


class BrimConfig(BaseSettings):
    """The whole resolved configuration. Build it with `load_config`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
    )

    server: ServerConfig = ServerConfig()
    upstreams: dict[str, UpstreamConfig] = Field(default_factory=_default_upstreams)
    routes: dict[str, str | tuple[str, ...]] = Field(default_factory=dict)
    models: dict[str, ModelFacts] = Field(default_factory=dict)
    clients: dict[str, ClientRule] = Field(default_factory=dict)
    guard: GuardConfig = GuardConfig()
    retry: RetryConfig = RetryConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    audit: AuditConfig = AuditConfig()
    archive: ArchiveConfig = ArchiveConfig()
    summarize: SummarizeConfig = SummarizeConfig()
    cache: CacheConfig = CacheConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _summarizer_named(self) -> BrimConfig:
        if self.summarize.enabled and not self.summarize.chain():
            raise ValueError("summarize.provider is required when summarize.enabled is true")
        return self

    @model_validator(mode="after")
    def _routes_name_upstreams(self) -> BrimConfig:
        if not self.upstreams:
            raise ValueError("at least one upstream is required")
        for pattern, names in self.routes.items():
            for name in [names] if isinstance(names, str) else names:
                if name not in self.upstreams:
                    known = ", ".join(sorted(self.upstreams))
                    raise ValueError(
                        f'routes."{pattern}" names upstream {name!r}, which is not defined '
                        f"(defined: {known})"
                    )
        return self


def unknown_keys(data: Mapping[str, Any], model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of keys in `data` that `model` does not define, at any depth."""
    found: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None or field.exclude:
            found.append(path)
            continue
        annotation = field.annotation
        if isinstance(value, Mapping):
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                found += unknown_keys(value, annotation, f"{path}.")
            elif get_origin(annotation) is dict:
                item_type = get_args(annotation)[1]
                if isinstance(item_type, type) and issubclass(item_type, BaseModel):
                    for name, item in value.items():
                        if isinstance(item, Mapping):
                            found += unknown_keys(item, item_type, f'{path}."{name}".')
    return found


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{location}: {message}")
    return "; ".join(lines)


def load_config(path: str | Path | None) -> tuple[BrimConfig, list[str]]:
    """Read `path` (or nothing: defaults) plus the environment; return the config and warnings."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{source}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: cannot read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    warnings = [f"{source}: unknown key {key!r} ignored" for key in unknown_keys(raw, BrimConfig)]
    try:
        config = BrimConfig(**raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None
    except ValueError as exc:  # raised by the env source when a BRIM_ variable is not parseable
        raise ConfigError(f"{source}: {exc}") from None
    return config, warnings


def mask_secret(secret: SecretStr | None) -> str | None:
    if secret is None:
        return None
    value = secret.get_secret_value()
    if len(value) <= 8:
        return "****"
    return f"{value[:3]}…{value[-4:]}"


def describe_config(config: BrimConfig) -> dict[str, Any]:
    """The resolved configuration as plain data, with every secret masked."""
    data = config.model_dump(mode="json")
    data["server"]["api_keys"] = [mask_secret(key) for key in config.server.api_keys]
    data["server"]["admin_keys"] = [mask_secret(key) for key in config.server.admin_keys]
    for name, upstream in config.upstreams.items():
        data["upstreams"][name]["api_key"] = (
            mask_secret(upstream.api_key)
            if upstream.api_key
            else "(client's own key passed through)"
        )
    return data
