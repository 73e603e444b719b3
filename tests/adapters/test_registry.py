from __future__ import annotations

import pytest

from brim.adapters import registry as registry_module
from brim.adapters.cli import ChildEnv, CliAdapter
from brim.adapters.errors import NoRoute
from brim.adapters.registry import Upstreams, route_matches
from brim.adapters.upstream_config import UpstreamConfig

OPENAI = UpstreamConfig(api="openai", base_url="http://o.test/v1")
ANTHROPIC = UpstreamConfig(api="anthropic", base_url="http://a.test")
LITELLM = UpstreamConfig(api="litellm", model_prefix="bedrock/")


def test_first_matching_route_wins() -> None:
    upstreams = Upstreams(
        {"o": OPENAI, "l": LITELLM}, {"anthropic.*": "l", "gpt-4*": "o", "*": "l"}
    )
    assert upstreams.route("gpt-4o", "openai.chat") == "o"
    assert upstreams.route("anthropic.claude-v2", "openai.chat") == "l"
    assert upstreams.route("mistral", "openai.chat") == "l"


def test_routes_to_upstreams_of_another_wire_api_are_skipped() -> None:
    upstreams = Upstreams({"a": ANTHROPIC, "o": OPENAI}, {"claude-*": "a", "*": "o"})
    assert upstreams.route("claude-sonnet-4-5", "openai.chat") == "o"


def test_no_matching_route_is_no_route_naming_the_model() -> None:
    upstreams = Upstreams({"o": OPENAI}, {"gpt-*": "o"})
    with pytest.raises(NoRoute, match="llama") as caught:
        upstreams.route("llama", "openai.chat")
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")


def test_without_routes_the_first_upstream_of_the_wire_api_serves() -> None:
    upstreams = Upstreams({"a": ANTHROPIC, "o": OPENAI}, {})
    assert upstreams.route("anything", "openai.chat") == "o"
    assert upstreams.first_serving("openai.models") == "o"
    with pytest.raises(NoRoute):
        Upstreams({"a": ANTHROPIC}, {}).route("x", "openai.chat")


def test_a_route_is_matched_once_per_model_and_api(monkeypatch: pytest.MonkeyPatch) -> None:
    matched: list[tuple[str, str]] = []

    def counting(model: str, pattern: str) -> bool:
        matched.append((model, pattern))
        return route_matches(model, pattern)

    monkeypatch.setattr(registry_module, "route_matches", counting)
    upstreams = Upstreams({"a": ANTHROPIC, "o": OPENAI}, {"claude-*": "a", "*": "o"})
    for _ in range(3):
        assert upstreams.route("claude-sonnet-4-5", "openai.chat") == "o"
        assert upstreams.route("claude-sonnet-4-5", "anthropic.messages") == "a"
    assert matched == [
        ("claude-sonnet-4-5", "claude-*"),
        ("claude-sonnet-4-5", "*"),
        ("claude-sonnet-4-5", "claude-*"),
    ]
    # A model no route serves is refused every time (nothing is remembered for it).
    only = Upstreams({"o": OPENAI}, {"gpt-*": "o"})
    for _ in range(2):
        with pytest.raises(NoRoute):
            only.route("llama", "openai.chat")


def test_remembered_routes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "ROUTES_REMEMBERED", 4)
    upstreams = Upstreams({"o": OPENAI}, {"*": "o"})
    for n in range(20):
        assert upstreams.route(f"model-{n}", "openai.chat") == "o"
    assert len(upstreams._routed) <= 4


def test_a_reloaded_configuration_keeps_the_adapters_of_upstreams_that_did_not_change() -> None:
    cli = UpstreamConfig(api="cli", command="gemini")
    running = Upstreams({"o": OPENAI, "a": ANTHROPIC, "c": cli}, {})
    moved = UpstreamConfig(api="anthropic", base_url="http://b.test")
    reloaded = running.reconfigured({"o": OPENAI, "a": moved, "c": cli}, {})
    assert reloaded["o"] is running["o"] and reloaded["c"] is running["c"]
    assert reloaded["a"] is not running["a"]
    # A configuration that names other secrets: a CLI's runs must not inherit them either.
    secrets = ChildEnv(names=frozenset({"NEW_SECRET"}))
    rebuilt = reloaded.reconfigured(reloaded.configs, {}, secrets)
    assert rebuilt["o"] is reloaded["o"] and rebuilt["a"] is reloaded["a"]
    assert isinstance(rebuilt["c"], CliAdapter) and rebuilt["c"] is not reloaded["c"]
    assert rebuilt["c"].child_env == secrets
