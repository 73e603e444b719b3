"""What brim tells a client about an upstream it could not reach names the upstream by its
name in the config, never by its address: an internal host, port or URL is the operator's
business (brim's log keeps it), not every client's.

The clients are the official SDKs (plain HTTP for Gemini) on all four wire APIs, against brims
whose upstreams cannot be reached: nothing listens on the port, the host name does not resolve,
TLS is spoken to a plain-HTTP port; and the same through litellm.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrimFactory
from tests.fakes import FakeProvider
from tests.security.test_learned_limits import APIS, HELLO, Api, Reply

NAME = "house-llm"  # the upstream's name in the config: what the client may be told


def addresses(provider: FakeProvider, closed_port: int) -> dict[str, tuple[str, list[str]]]:
    """Unreachable base URLs, with the parts of each that no client may see."""
    fake_host, fake_port = provider.url.removeprefix("http://").split(":")
    return {
        "refused": (f"http://127.0.0.1:{closed_port}", ["127.0.0.1", str(closed_port)]),
        "dns": (
            "http://llm-gateway.corp.invalid:8443",
            ["llm-gateway", "corp.invalid", "8443"],
        ),
        "tls": (f"https://{fake_host}:{fake_port}", [fake_host, fake_port]),
    }


def upstreams(api: Api, base_url: str) -> dict[str, Any]:
    kind = {"anthropic.messages": "anthropic", "gemini.generate": "gemini"}.get(api.name, "openai")
    path = "/v1" if kind == "openai" else ""
    return {"upstreams": {NAME: {"api": kind, "base_url": f"{base_url}{path}"}}}


def assert_hidden(reply: Reply, secrets: list[str]) -> None:
    assert reply.status == 502, reply.text
    assert f"upstream '{NAME}' is unreachable" in reply.text, reply.text
    for secret in secrets:
        assert secret not in reply.text, (secret, reply.text)


@pytest.mark.parametrize("way", ["refused", "dns", "tls"])
@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_an_unreachable_upstream_is_named_not_located(
    api: Api,
    way: str,
    brim: BrimFactory,
    provider: FakeProvider,
    closed_port: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base_url, secrets = addresses(provider, closed_port)[way]
    base = brim(**upstreams(api, base_url))
    with caplog.at_level(logging.WARNING, logger="brim.upstream"):
        reply = api.send(base, "sk-client", api.known_model, HELLO, {})
    assert_hidden(reply, secrets)
    # The operator still finds where brim tried to go.
    assert any(base_url in record.getMessage() for record in caplog.records), caplog.text


def test_litellms_words_for_a_connection_error_lose_the_address() -> None:
    """litellm's own message may name where it tried to connect."""
    from brim.adapters.translated import LitellmAdapter, import_litellm
    from brim.adapters.upstream_config import UpstreamConfig

    litellm = import_litellm()
    adapter = LitellmAdapter(NAME, UpstreamConfig(api="litellm"))
    said = "Cannot connect to host llm-gateway.corp.internal:8443 ssl:default [Connection refused]"
    error = litellm.APIConnectionError(message=said, llm_provider="openai", model="m")
    failure = adapter._failure(error)
    assert failure.status == 502 and f"upstream '{NAME}' is unreachable" in failure.message
    assert "llm-gateway" not in failure.message and "8443" not in failure.message


CLI = """#!{python}
import json, sys
sys.stdin.read()
print(json.dumps({{"type": "result", "is_error": True, "api_error_status": 502, "result":
    "API Error: Connection error (connect ECONNREFUSED 10.1.2.3:11434, see http://10.1.2.3:11434/v1)"}}))
"""


def test_a_cli_that_names_its_providers_address_is_relayed_without_it(
    brim: BrimFactory, tmp_path: Path
) -> None:
    script = tmp_path / "fake-claude"
    script.write_text(CLI.format(python=sys.executable))
    script.chmod(0o755)
    base = brim(
        upstreams={NAME: {"api": "cli", "cli": "claude", "command": str(script)}},
        routes={"*": NAME},
    )
    reply = APIS[0].send(base, "sk-client", "claude:sonnet", HELLO, {})
    assert reply.status == 502 and f"upstream '{NAME}'" in reply.text, reply.text
    assert "10.1.2.3" not in reply.text and "11434" not in reply.text, reply.text
