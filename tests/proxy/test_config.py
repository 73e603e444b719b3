"""proxy.toml: defaults, file, environment overrides, unknown keys, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from brim.proxy.config import (
    ENV_NOT_CONFIG,
    BrimConfig,
    ConfigError,
    available_cores,
    describe_config,
    load_config,
    unknown_keys,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_a_file() -> None:
    config, warnings = load_config(None)
    assert warnings == []
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8787)
    assert config.server.max_body_bytes == 32 * 1024 * 1024
    assert config.upstreams["openai"].api == "openai"
    assert config.upstreams["openai"].base_url == "https://api.openai.com/v1"
    assert config.upstreams["openai"].api_key is None  # the client's key is passed through
    assert config.routes == {}


def test_the_shipped_proxy_toml_is_valid_and_warns_about_nothing() -> None:
    config, warnings = load_config(Path(__file__).parents[2] / "proxy.toml")
    assert warnings == []
    assert config.server.port == 8787
    assert "openai" in config.upstreams


def test_file_values_are_used(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [server]
        port = 9100
        max_body_mb = 2

        [upstreams.local]
        api = "openai"
        base_url = "http://127.0.0.1:8000/v1/"
        timeout_s = 30

        [routes]
        "llama-*" = "local"
        "*" = "local"

        [models."llama-3"]
        context_window = 8192
        max_output = 1024
        aliases = ["llama"]
        """,
    )
    config, warnings = load_config(path)
    assert warnings == []
    assert config.server.port == 9100
    assert list(config.upstreams) == ["local"]  # a file's upstreams replace the defaults
    assert config.upstreams["local"].base_url == "http://127.0.0.1:8000/v1"
    assert list(config.routes.items()) == [("llama-*", "local"), ("*", "local")]
    assert config.models["llama-3"].context_window == 8192
    assert config.models["llama-3"].aliases == ("llama",)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        '[server]\nport = 9100\nhost = "0.0.0.0"\n'
        '[upstreams.local]\napi = "openai"\nbase_url = "http://127.0.0.1:8000/v1"\n',
    )
    monkeypatch.setenv("BRIM_SERVER__PORT", "9000")
    monkeypatch.setenv("BRIM_UPSTREAMS__LOCAL__TIMEOUT_S", "12.5")
    config, _ = load_config(path)
    assert config.server.port == 9000
    assert config.server.host == "0.0.0.0"  # untouched keys keep the file's value
    assert config.upstreams["local"].timeout_s == 12.5
    assert config.upstreams["local"].base_url == "http://127.0.0.1:8000/v1"


def test_unknown_keys_warn_by_name_and_are_not_fatal(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[server]\nport = 9100\nlisten_backlog = 5\n"
        '[upstreams.openai]\napi = "openai"\nbase_url = "https://x.test/v1"\nregion = "eu"\n'
        "[telemetree]\nx = 1\n",
    )
    config, warnings = load_config(path)
    assert config.server.port == 9100
    joined = "\n".join(warnings)
    assert "'server.listen_backlog'" in joined
    assert "'upstreams.\"openai\".region'" in joined
    assert "'telemetree'" in joined
    assert len(warnings) == 3


def test_unknown_keys_does_not_flag_known_ones() -> None:
    raw = {"server": {"port": 1}, "routes": {"*": "openai"}, "models": {"m": {"max_output": 3}}}
    assert unknown_keys(raw, BrimConfig) == []


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[server]\nport = 70000\n", "server.port"),
        ('[server]\nport = "eighty"\n', "server.port"),
        ("[server]\nmax_body_mb = -1\n", "server.max_body_mb"),
        ('[upstreams.x]\napi = "grpc"\nbase_url = "http://a"\n', "upstreams.x.api"),
        ('[upstreams.x]\napi = "openai"\nbase_url = "ftp://a"\n', "upstreams.x.base_url"),
        ('[upstreams.x]\napi = "openai"\n', "base_url is required"),
        ('[upstreams.x]\napi = "openai"\nbase_url = "http://a"\n[routes]\n"*" = "y"\n', "routes"),
        (
            '[upstreams.x]\napi = "openai"\nbase_url = "http://a"\napi_key_env = "NOPE_UNSET"\n',
            "NOPE_UNSET",
        ),
        ('[server]\napi_keys_env = "NOPE_UNSET_KEYS"\n', "server"),
        ("[models.m]\ncontext_window = 0\n", "models.m.context_window"),
        ("[server\nport = 1\n", "not valid TOML"),
        ("[server]\nworkers = 0\n", "server.workers: must be a whole number from 1 to 1024"),
        ("[server]\nworkers = -2\n", "server.workers: must be a whole number from 1 to 1024"),
        ("[server]\nworkers = 2.5\n", "server.workers: must be a whole number"),
        ("[server]\nworkers = true\n", "server.workers: must be a whole number"),
        ('[server]\nworkers = "many"\n', """or "auto" (one per core), not 'many'"""),
        ("[server]\nworkers = 5000\n", "server.workers"),
        ('[server]\nworker_socket = "fork"\n', "server.worker_socket"),
    ],
)
def test_bad_values_refuse_and_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert named in str(caught.value)
    assert str(tmp_path) in str(caught.value)


def test_workers_default_to_one_and_auto_is_one_per_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = load_config(None)
    assert (config.server.workers, config.server.worker_count) == (1, 1)
    config, _ = load_config(write(tmp_path, '[server]\nworkers = "auto"\n'))
    assert config.server.workers == "auto"
    assert config.server.worker_count == available_cores() >= 1
    monkeypatch.setattr("brim.proxy.config.available_cores", lambda: 6)
    assert config.server.worker_count == 6
    monkeypatch.setenv("BRIM_SERVER__WORKERS", "3")
    config, _ = load_config(write(tmp_path, '[server]\nworkers = "auto"\n'))
    assert (config.server.workers, config.server.worker_count) == (3, 3)
    monkeypatch.setenv("BRIM_SERVER__WORKERS", "AUTO")
    assert load_config(None)[0].server.worker_count == 6
    monkeypatch.setenv("BRIM_SERVER__WORKERS", "0")
    with pytest.raises(
        ConfigError, match=r"environment variable BRIM_SERVER__WORKERS: server\.workers"
    ):
        load_config(None)


def test_bad_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRIM_SERVER__PORT", "not-a-port")
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_config(None)


def test_environment_changes_one_key_of_a_default_upstream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BRIM_UPSTREAMS__OPENAI__BASE_URL", "http://127.0.0.1:9/v1")
    config, warnings = load_config(None)
    assert warnings == []
    assert config.upstreams["openai"].base_url == "http://127.0.0.1:9/v1"
    assert config.upstreams["openai"].api == "openai"  # the rest of the default stays
    assert config.upstreams["anthropic"].base_url == "https://api.anthropic.com"
    assert list(config.upstreams) == ["openai", "anthropic", "gemini"]


def test_environment_changes_the_files_upstream_not_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        '[upstreams.Local]\napi = "openai"\nbase_url = "http://127.0.0.1:8000/v1"\ntimeout_s = 30\n',
    )
    monkeypatch.setenv("BRIM_UPSTREAMS__LOCAL__BASE_URL", "http://127.0.0.1:9/v1")
    config, warnings = load_config(path)
    assert warnings == []
    assert list(config.upstreams) == ["Local"]  # matched whatever the table's case
    assert config.upstreams["Local"].base_url == "http://127.0.0.1:9/v1"
    assert config.upstreams["Local"].timeout_s == 30


def test_an_upstream_only_the_environment_names_must_be_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, '[upstreams.local]\napi = "openai"\nbase_url = "http://a"\n')
    monkeypatch.setenv("BRIM_UPSTREAMS__OPENAI__BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError) as caught:
        load_config(path)  # the file's upstreams replace the defaults: no `openai` to change
    message = str(caught.value)
    assert message.startswith("environment variable BRIM_UPSTREAMS__OPENAI__BASE_URL: ")
    assert "upstreams.openai.api: Field required" in message
    assert str(tmp_path) not in message


def test_json_environment_values_replace_lists_and_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, '[routes]\n"*" = "openai"\n[guard]\npolicies = ["evict"]\n')
    monkeypatch.setenv("BRIM_GUARD__POLICIES", '["truncate", "evict"]')
    monkeypatch.setenv("BRIM_ROUTES", '{"claude-*": "anthropic", "*": "openai"}')
    monkeypatch.setenv("BRIM_RETRY__STEPS", "[0.25, 0.5]")
    config, warnings = load_config(path)
    assert warnings == []
    assert config.guard.policies == ("truncate", "evict")
    assert list(config.routes.items()) == [("claude-*", "anthropic"), ("*", "openai")]
    assert config.retry.steps == (0.25, 0.5)


def test_environment_value_that_is_not_json_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BRIM_GUARD__POLICIES", '["evict",')
    with pytest.raises(ConfigError, match=r"^environment variable BRIM_GUARD__POLICIES: not valid"):
        load_config(None)


def test_misspelled_environment_variables_warn_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRIM_SERVR__PORT", "9000")
    monkeypatch.setenv("BRIM_SERVER__PROT", "9000")
    monkeypatch.setenv("BRIM_UPSTREAMS__OPENAI__BASE_ULR", "http://a")
    config, warnings = load_config(write(tmp_path, "[server]\nport = 9100\n"))
    assert config.server.port == 9100
    assert sorted(warnings) == [
        "environment variable BRIM_SERVER__PROT: unknown key 'server.prot' ignored",
        "environment variable BRIM_SERVR__PORT: unknown key 'servr' ignored",
        "environment variable BRIM_UPSTREAMS__OPENAI__BASE_ULR: unknown key "
        "'upstreams.\"openai\".base_ulr' ignored",
    ]


def test_brim_variables_that_are_not_config_keys_do_not_warn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert {"BRIM_CONFIG", "BRIM_VENV", "BRIM_LOG_LEVEL", "BRIM_LOG_FORMAT"} <= ENV_NOT_CONFIG
    for name in ENV_NOT_CONFIG:
        monkeypatch.setenv(name, "[not json, not a key")
    # The variables that `…_env` keys name hold secrets, not configuration.
    monkeypatch.setenv("BRIM_API_KEYS", "brim-aaaaaaaaaaaa")
    monkeypatch.setenv("BRIM_SERVER__API_KEYS_ENV", "BRIM_API_KEYS")
    config, warnings = load_config(None)
    assert warnings == []
    assert [key.get_secret_value() for key in config.server.api_keys] == ["brim-aaaaaaaaaaaa"]


def test_a_bad_environment_value_is_blamed_on_the_variable_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "[server]\nport = 9100\nmax_body_mb = -1\n")
    monkeypatch.setenv("BRIM_SERVER__PORT", "notaport")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    parts = str(caught.value).split("; ")
    assert sorted(parts) == sorted(
        [
            f"{path}: server.max_body_mb: Input should be greater than 0",
            "environment variable BRIM_SERVER__PORT: server.port: Input should be a valid "
            "integer, unable to parse string as an integer",
        ]
    )


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.toml")


def test_secrets_come_from_the_environment_and_are_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSTREAM_KEY_FOR_TEST", "sk-live-0123456789abcdef")
    monkeypatch.setenv("BRIM_KEYS_FOR_TEST", "brim-aaaaaaaaaaaa,brim-bbbbbbbbbbbb")
    path = write(
        tmp_path,
        '[server]\napi_keys_env = "BRIM_KEYS_FOR_TEST"\n'
        '[upstreams.x]\napi = "openai"\nbase_url = "http://a"\n'
        'api_key_env = "UPSTREAM_KEY_FOR_TEST"\napi_key = "sk-from-file-ignored"\n',
    )
    config, warnings = load_config(path)
    assert config.upstreams["x"].api_key is not None
    assert config.upstreams["x"].api_key.get_secret_value() == "sk-live-0123456789abcdef"
    assert [k.get_secret_value() for k in config.server.api_keys] == [
        "brim-aaaaaaaaaaaa",
        "brim-bbbbbbbbbbbb",
    ]
    assert any("api_key" in w for w in warnings)  # keys in the file are refused loudly
    shown = repr(describe_config(config))
    for secret in ("sk-live-0123456789abcdef", "brim-aaaaaaaaaaaa", "sk-from-file-ignored"):
        assert secret not in shown
    assert "sk-…cdef" in shown
    assert secret not in repr(config)


def test_the_cache_section_and_its_redis_password_masked(tmp_path: Path) -> None:
    config, warnings = load_config(None)
    cache = config.cache
    assert (cache.url, cache.refresh_s, cache.retry_s, cache.timeout_s) == (None, 1, 5, 2)
    path = write(tmp_path, '[cache]\nurl = "redis://brim:hunter2-secret@redis.internal:6379/0"\n')
    config, warnings = load_config(path)
    assert warnings == []
    shown = describe_config(config)["cache"]["url"]
    assert shown == "redis://brim:****@redis.internal:6379/0"
    for text, named in [
        ("[cache]\nrefresh_s = 0\n", "cache.refresh_s"),
        ("[cache]\nretry_s = -1\n", "cache.retry_s"),
        ('[cache]\ntimeout_s = "soon"\n', "cache.timeout_s"),
    ]:
        with pytest.raises(ConfigError, match=named):
            load_config(write(tmp_path, text))


def test_guard_clients_and_model_facts_sections(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [guard]
        safety_margin = 0.1
        claude_token_factor = 1.3

        [clients.claude-code]
        user_agent = "claude-cli/*"
        cli = "claude"

        [clients.internal]
        header = "x-agent: batch-*"
        cli_overhead = 5000

        [models."local"]
        context_window = 32768
        tokenizer = "cl100k_base"
        fallbacks = ["local-128k"]

        [retry]
        max_attempts = 2
        steps = [0.25, 0.5]
        """,
    )
    config, warnings = load_config(path)
    assert warnings == []
    assert config.guard.safety_margin == 0.1
    assert config.guard.claude_token_factor == 1.3
    assert config.clients["claude-code"].overhead == 60_000
    assert config.clients["internal"].overhead == 5_000
    assert list(config.clients) == ["claude-code", "internal"]  # file order: first match wins
    assert config.models["local"].tokenizer == "cl100k_base"
    assert config.models["local"].fallbacks == ("local-128k",)
    assert (config.retry.max_attempts, config.retry.steps) == (2, (0.25, 0.5))


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[guard]\nsafety_margin = 0.7\n", "guard.safety_margin"),
        ("[guard]\nclaude_token_factor = 0.5\n", "guard.claude_token_factor"),
        ('[clients.x]\ncli = "claude"\n', "clients.x"),
        ('[clients.x]\nuser_agent = "a/*"\n', "cli or cli_overhead"),
        ('[clients.x]\nheader = "no-colon"\ncli = "codex"\n', "clients.x"),
        ('[models.m]\ntokenizer = "p99k"\n', "models.m.tokenizer"),
        ('[guard]\npolicies = ["evict", "summarize_everything"]\n', "summarize_everything"),
        ("[guard]\nlow_water = 1.5\n", "guard.low_water"),
        ("[guard.evict]\nkeep_recent_turns = -1\n", "guard.evict.keep_recent_turns"),
        ("[retry]\nsteps = [0.2, 1.5]\n", "retry.steps"),
        ("[retry]\nmax_attempts = 99\n", "retry.max_attempts"),
    ],
)
def test_bad_guard_client_and_model_values_are_named(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert named in str(caught.value)


def test_the_browser_edge_settings_are_written_as_browsers_send_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[server]\n"
        'allowed_origins = ["http://LocalHost:3000/", "app://obsidian.md"]\n'
        'allowed_hosts = ["Brim.Internal", "[fd00::1]"]\n',
    )
    server = load_config(path)[0].server
    assert server.allowed_origins == ("http://localhost:3000", "app://obsidian.md")
    assert server.allowed_hosts == ("brim.internal", "fd00::1")
    for key, bad in (
        ("allowed_origins", '["localhost:3000"]'),  # no scheme
        ("allowed_origins", '["http://x/path"]'),
        ("allowed_origins", '["null"]'),
        ("allowed_hosts", '["brim:8080"]'),  # a port: any is taken
        ("allowed_hosts", '["http://brim"]'),
    ):
        with pytest.raises(ConfigError, match=f"server.{key}"):
            load_config(write(tmp_path, f"[server]\n{key} = {bad}\n"))


@pytest.mark.parametrize(
    ("server", "public"),
    [
        ({}, True),
        ({"host": "::1"}, True),
        ({"host": "0.0.0.0", "allow_unauthenticated": True}, False),
        ({"host": "localhost.example.com", "allow_unauthenticated": True}, False),
        ({"admin_keys_env": "CONFIG_TEST_ADMIN"}, False),
        ({"admin_keys_env": "CONFIG_TEST_ADMIN", "metrics_public": True}, True),
        ({"metrics_public": False}, False),
    ],
)
def test_metrics_are_public_by_default_only_on_loopback_without_keys(
    monkeypatch: pytest.MonkeyPatch, server: dict[str, object], public: bool
) -> None:
    monkeypatch.setenv("CONFIG_TEST_ADMIN", "admin-key-for-this-test")
    assert BrimConfig(server=server).server.metrics_open is public
