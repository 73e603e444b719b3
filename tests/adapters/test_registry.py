from __future__ import annotations

import pytest

from adapters.config import UpstreamConfig
from adapters.errors import NoRoute
from adapters.registry import Upstreams

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
