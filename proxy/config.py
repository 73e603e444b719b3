"""brim's configuration: `proxy.toml` parsed once at start-up into frozen, validated objects.

Layers, highest first: `BRIM_…` environment variables, the file, the built-in defaults. Each layer
deep-merges over the one below, except that a file's `[upstreams]` replaces the built-in ones.
A variable names a key path in capitals, nested keys joined by a double underscore
(`BRIM_SERVER__PORT=9000`, `BRIM_UPSTREAMS__OPENAI__BASE_URL=…`) and changes only that key; a value
starting with `[` or `{` is JSON and replaces the key's value whole (`BRIM_GUARD__POLICIES=[…]`,
`BRIM_ROUTES={…}`), any other is a string that validation converts. Unknown keys, in the file or
in a variable's name, are reported as warnings and otherwise ignored (`ENV_NOT_CONFIG` lists the
`BRIM_…` variables that are not configuration, and a variable an `…_env` key names is not one
either); a bad value is a `ConfigError` naming the key and where it came from (the file or the
variable), and brim refuses to start.

Secrets never live in the file: `api_key_env` / `api_keys_env` name environment variables, which
are read here, once, into `SecretStr` values.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator

from brim.adapters.upstream_config import FrozenModel, UpstreamConfig, secret_from_env
from brim.middleware.settings import (
    ArchiveConfig,
    AuditConfig,
    CacheConfig,
    GuardConfig,
    RestoreConfig,
    RetryConfig,
    SummarizeConfig,
    TelemetryConfig,
)
from brim.policies.clients import ClientRule
from brim.policies.limits import ModelFacts
from brim.policies.nesting import SAFE_DEPTH

ENV_PREFIX = "BRIM_"
ENV_DELIMITER = "__"
# `BRIM_…` variables that are not configuration keys (read by `brim`, dev.sh, tests or the bench).
ENV_NOT_CONFIG = frozenset(
    {
        "BRIM_CONFIG",
        "BRIM_VENV",
        "BRIM_LOG_LEVEL",
        "BRIM_LOG_FORMAT",
        "BRIM_BENCH_DIR",
        "BRIM_ADMIN_KEY",  # `brim status`
        "BRIM_TEST_ARTIFACTS",
    }
)
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
GEMINI_BASE_URL = "https://generativelanguage.googleapis.com"


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and the problem."""


MAX_WORKERS = 1024


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it), at least 1:
    what `workers = "auto"` starts. CPU quotas (cgroup `cpu.max`) are not read."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counter is not None:
        return int(counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def parse_workers(value: Any) -> int | Literal["auto"]:
    """`[server] workers` and `--workers`: a whole number from 1 to `MAX_WORKERS`, or "auto".
    Strings (the environment, the command line) are read as such; anything else is refused
    with a ValueError that says what is allowed."""
    allowed = f'a whole number from 1 to {MAX_WORKERS}, or "auto" (one per core)'
    number = value
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        try:
            number = int(text)
        except ValueError:
            raise ValueError(f"must be {allowed}, not {value!r}") from None
    if isinstance(number, bool) or not isinstance(number, int):
        raise ValueError(f"must be {allowed}, not {value!r}")
    if not 1 <= number <= MAX_WORKERS:
        raise ValueError(f"must be {allowed}, not {number}")
    return number


def _key_list(raw: str) -> tuple[SecretStr, ...]:
    keys = tuple(SecretStr(key.strip()) for key in raw.split(",") if key.strip())
    if not keys:
        raise ValueError("the api_keys_env variable holds no key")
    return keys


class KeyLimits(FrozenModel):
    """`[server.key_limits.NAME]`: one brim key's own rate limits, in place of the server-wide
    ones (a limit left out here is the server-wide one). The key is read from `key_env`."""

    key_env: str
    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    key: SecretStr | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _read_key(cls, data: Any) -> Any:
        return secret_from_env(data, "key_env", "key", SecretStr)


class ServerConfig(FrozenModel):
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    max_body_mb: float = Field(32, gt=0)
    max_header_kb: int = Field(8, ge=1, le=1024)  # the request line and each header line
    max_headers: int = Field(128, ge=16, le=4096)
    max_json_depth: int = Field(SAFE_DEPTH, ge=8, le=200)  # orjson writes at most 254 levels
    api_keys_env: str | None = None
    admin_keys_env: str | None = None  # keys for /admin/*; unset: the admin endpoints are off
    # The secret owners are hashed with (`proxy.owners`); unset: a random one per brim run.
    owner_secret_env: str | None = None
    allow_unauthenticated: bool = False  # serve beyond loopback without api_keys (say so here)
    shutdown_timeout_s: float = Field(10, ge=0)
    # Hostile and heavy clients (README "Saturation and rate limits"):
    header_timeout_s: float = Field(15, gt=0)  # request line and headers, from the first byte
    body_timeout_s: float = Field(60, gt=0)  # the whole body, from the end of the headers
    max_connections: int = Field(1024, ge=1)  # open client connections; more are closed at once
    max_in_flight: int = Field(512, ge=1)  # requests being handled; more are answered 503
    max_body_buffer_mb: float = Field(256, gt=0)  # request bodies held in memory at once
    requests_per_minute: int | None = Field(None, ge=1)  # per brim key (else client address)
    tokens_per_minute: int | None = Field(None, ge=1)  # input tokens, as brim counts them
    key_limits: dict[str, KeyLimits] = Field(default_factory=dict)
    # The browser edge (`proxy.edge`): web origins whose pages may call brim (besides brim's own
    # pages), and host names a client may address it by besides the loopback names (checked
    # while bound to loopback, and wherever this list is set).
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    # /metrics without the admin key; unset: only while bound to loopback with no keys at all.
    metrics_public: bool | None = None
    # A compressed request body may decode to at most this many times its size (past 1 MiB).
    max_decompression_ratio: float = Field(100, ge=1)
    # Processes serving the port: 1 is one process, no supervisor; "auto" is one per core.
    workers: int | Literal["auto"] = 1
    # How several workers share the port: "reuse_port" (SO_REUSEPORT: one listening socket per
    # worker, the kernel spreads connections evenly), "shared" (one socket bound before the
    # workers are forked; an idle worker takes the next connection), "auto": reuse_port on
    # Linux, shared elsewhere (other systems' SO_REUSEPORT does not spread connections).
    worker_socket: Literal["auto", "reuse_port", "shared"] = "auto"
    api_keys: tuple[SecretStr, ...] = Field(default=(), exclude=True)
    admin_keys: tuple[SecretStr, ...] = Field(default=(), exclude=True)
    owner_secret: SecretStr | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _read_api_keys(cls, data: Any) -> Any:
        data = secret_from_env(data, "api_keys_env", "api_keys", _key_list)
        data = secret_from_env(data, "owner_secret_env", "owner_secret", SecretStr)
        return secret_from_env(data, "admin_keys_env", "admin_keys", _key_list)

    @model_validator(mode="after")
    def _key_limits_name_keys(self) -> ServerConfig:
        keys = {key.get_secret_value() for key in self.api_keys}
        for name, limits in self.key_limits.items():
            if limits.key is None or limits.key.get_secret_value() not in keys:
                raise ValueError(
                    f"key_limits.{name}: the key in {limits.key_env} is not one of the keys in "
                    "server.api_keys_env (a limit applies to a key brim accepts)"
                )
        return self

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> int | Literal["auto"]:
        return parse_workers(value)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(web_origin(origin) for origin in value)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host_name(host) for host in value)

    @property
    def loopback(self) -> bool:
        """Whether `host` is a loopback address or name (only this machine can connect)."""
        return is_loopback(self.host)

    @property
    def metrics_open(self) -> bool:
        """Whether /metrics is served without the admin key (`metrics_public`, or by default
        while bound to loopback with neither brim keys nor admin keys)."""
        if self.metrics_public is not None:
            return self.metrics_public
        return self.loopback and not self.api_keys and not self.admin_keys

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def max_body_buffer_bytes(self) -> int:
        return int(self.max_body_buffer_mb * 1024 * 1024)

    @property
    def rate_limited(self) -> bool:
        """Whether any request or token limit is set (else the limiter does no work at all)."""
        return bool(self.requests_per_minute or self.tokens_per_minute or self.key_limits)

    @property
    def worker_count(self) -> int:
        """How many processes `workers` means on this machine."""
        return available_cores() if self.workers == "auto" else self.workers


def is_loopback(host: str) -> bool:
    """A loopback address (127.0.0.0/8, ::1) or `localhost`."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def web_origin(text: str) -> str:
    """An `allowed_origins` entry as browsers send it in `Origin` (`scheme://host[:port]`,
    lowercase, no path: `http://localhost:3000`, `app://obsidian.md`), or "*" for any origin."""
    value = text.strip().lower().rstrip("/")
    if value == "*":
        return value
    try:
        parts = urlsplit(value)
        valid = bool(parts.scheme and parts.hostname) and not (parts.path or parts.query)
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(
            f'{text!r} is not a web origin: write it as browsers send it, e.g. "http://localhost:'
            '3000" (scheme, host and port, no path), or "*" for any'
        )
    return value


def host_name(text: str) -> str:
    """An `allowed_hosts` entry: a host name or address, any port (lowercase, no brackets)."""
    value = text.strip().lower().strip("[]").rstrip(".")
    if not value or any(c in value for c in "/@ ") or value.count(":") == 1:
        raise ValueError(
            f'{text!r} is not a host name: write the name alone, e.g. "brim.internal" '
            "(any port is accepted)"
        )
    return value


DEFAULT_UPSTREAMS: dict[str, dict[str, str]] = {
    "openai": {"api": "openai", "base_url": OPENAI_BASE_URL},
    "anthropic": {"api": "anthropic", "base_url": ANTHROPIC_BASE_URL},
    "gemini": {"api": "gemini", "base_url": GEMINI_BASE_URL},
}


def _default_upstreams() -> dict[str, UpstreamConfig]:
    return {name: UpstreamConfig.model_validate(raw) for name, raw in DEFAULT_UPSTREAMS.items()}


class BrimConfig(FrozenModel):
    """The whole resolved configuration. Build it with `load_config`."""

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
    restore: RestoreConfig = RestoreConfig()
    cache: CacheConfig = CacheConfig()

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


KeyPath = tuple[str, ...]


def _nested(path: KeyPath, value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _named_variables(data: Any) -> set[str]:
    """The environment variables that `…_env` keys anywhere in `data` name (secrets, not keys)."""
    found: set[str] = set()
    if isinstance(data, Mapping):
        for key, value in data.items():
            if isinstance(key, str) and key.endswith("_env") and isinstance(value, str):
                found.add(value)
            else:
                found |= _named_variables(value)
    elif isinstance(data, list):
        for item in data:
            found |= _named_variables(item)
    return found


def _parse_value(text: str) -> Any:
    """JSON for a value that looks like an array or object, else the string as it is."""
    return json.loads(text) if text.lstrip().startswith(("[", "{")) else text


class _Environment:
    """The `BRIM_…` variables merged over the lower layers, remembering which variable set what."""

    def __init__(self, environ: Mapping[str, str], file_raw: Mapping[str, Any]) -> None:
        candidates: list[tuple[str, KeyPath, str]] = []
        for name, text in environ.items():
            upper = name.upper()
            if upper.startswith(ENV_PREFIX) and upper not in ENV_NOT_CONFIG:
                path = tuple(name[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER))
                candidates.append((name, path, text))
        named = _named_variables(file_raw)
        for _, path, text in candidates:
            with contextlib.suppress(json.JSONDecodeError):  # reported below, if configuration
                named |= _named_variables(_nested(path, _parse_value(text)))
        # Shorter paths first, so that a more specific variable wins over a JSON table.
        self.variables: list[tuple[str, KeyPath, Any]] = []
        for name, path, text in sorted(candidates, key=lambda item: (len(item[1]), item[0])):
            if name in named:
                continue
            try:
                value = _parse_value(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"environment variable {name}: not valid JSON: {exc}") from None
            self.variables.append((name, path, value))
        self.set_by: dict[KeyPath, str] = {}  # the key each variable set
        self.created_by: dict[KeyPath, list[str]] = {}  # tables no lower layer had

    def warnings(self) -> list[str]:
        return [
            f"environment variable {name}: unknown key {key!r} ignored"
            for name, path, value in self.variables
            for key in unknown_keys(_nested(path, value), BrimConfig)
        ]

    def merge_into(self, data: dict[str, Any]) -> None:
        """Set each variable's key in `data`, creating tables on the way; a table's existing key
        is matched whatever its case (`BRIM_UPSTREAMS__LOCAL__…` reaches `[upstreams.Local]`)."""
        for name, path, value in self.variables:
            node = data
            resolved: list[str] = []
            for depth, part in enumerate(path):
                key = next((k for k in node if isinstance(k, str) and k.lower() == part), part)
                resolved.append(key)
                if depth == len(path) - 1:
                    node[key] = value
                    break
                child = node.get(key)
                if not isinstance(child, dict):
                    child = node[key] = {}
                    self.created_by.setdefault(tuple(resolved), []).append(name)
                node = child
            self.set_by[tuple(resolved)] = name

    def origin(self, loc: KeyPath, file: str | None) -> str:
        """Where the value at `loc` came from: a variable, the file, or both."""

        def covering(paths: Mapping[KeyPath, Any]) -> KeyPath | None:
            return max((p for p in paths if loc[: len(p)] == p), key=len, default=None)

        if (path := covering(self.set_by)) is not None:
            return _variables([self.set_by[path]])
        if (path := covering(self.created_by)) is not None:
            return _variables(self.created_by[path])
        beneath = sorted({name for path, name in self.set_by.items() if path[: len(loc)] == loc})
        if file is None:
            return _variables(beneath) if beneath else "built-in defaults"
        return f"{file} with {_variables(beneath)}" if beneath else file


def _variables(names: list[str]) -> str:
    if len(names) == 1:
        return f"environment variable {names[0]}"
    return f"environment variables {', '.join(names)}"


def _describe(error: ValidationError, environment: _Environment, file: str | None) -> str:
    lines = []
    for item in error.errors():
        loc = tuple(str(part) for part in item["loc"])
        location = ".".join(loc) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{environment.origin(loc, file)}: {location}: {message}")
    return "; ".join(lines)


def load_config(path: str | Path | None) -> tuple[BrimConfig, list[str]]:
    """Read `path` (or nothing: defaults) plus the environment; return the config and warnings."""
    raw: dict[str, Any] = {}
    file = None if path is None else str(path)
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{file}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: cannot read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    warnings = [f"{file}: unknown key {key!r} ignored" for key in unknown_keys(raw, BrimConfig)]
    environment = _Environment(os.environ, raw)
    warnings += environment.warnings()
    merged = copy.deepcopy({"upstreams": DEFAULT_UPSTREAMS, **raw})
    environment.merge_into(merged)
    try:
        config = BrimConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, environment, file)) from None
    return config, warnings


def secret_variables(config: BrimConfig) -> frozenset[str]:
    """The environment variables the configuration names as holding secrets: every `…_env`
    key's value, at any depth (`api_key_env`, `api_keys_env`, `admin_keys_env`, `key_env`)."""
    return frozenset(_named_variables(config.model_dump()))


def refuse_open_without_keys(config: BrimConfig) -> None:
    """Bound beyond loopback, anyone who can reach brim spends your provider keys: require
    `api_keys_env`, or an explicit `allow_unauthenticated = true`."""
    server = config.server
    if server.loopback or server.api_keys or server.allow_unauthenticated:
        return
    raise ConfigError(
        f"server.host: {server.host!r} is reachable from other machines and no api_keys are "
        "set; set server.api_keys_env (or BRIM_SERVER__API_KEYS_ENV), or "
        "server.allow_unauthenticated = true if that is really what you want"
    )


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
    # No part of it shown: it keys the owners' hashes.
    data["server"]["owner_secret"] = "(set)" if config.server.owner_secret else "(one per run)"
    for name, upstream in config.upstreams.items():
        data["upstreams"][name]["api_key"] = (
            mask_secret(upstream.api_key)
            if upstream.api_key
            else "(client's own key passed through)"
        )
    if config.cache.url:
        data["cache"]["url"] = mask_url_password(config.cache.url)
    return data


def mask_url_password(url: str) -> str:
    """`url` with the password in it (`redis://:password@host`) masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}****@{host}"))
