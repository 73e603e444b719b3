"""Use what the user configured before cutting: a request over its model's budget goes whole to
a configured fallback whose window holds it (`[guard] prefer_fallback`), on every wire API —
driven with the official openai and anthropic SDKs (Gemini over plain HTTP) through a running
brim in front of the fake provider."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from brim.policies.wires import WIRES
from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider
from tests.test_wire_contract import CASES, Case, session

SMALL = 6_000  # the model the client asks for: the session below is ~7 000 tokens
ROOMY = 100_000  # its fallback


@dataclass(frozen=True)
class Client:
    """How a client of one wire API asks for `model` and what it gets: the reply's headers."""

    case: Case
    small: str  # the model asked for (routed by every_api's routes)
    roomy: str  # its fallback

    def send(self, base: str, model: str, items: list[dict[str, Any]]) -> httpx.Headers:
        api = self.case.api
        if api == "openai.chat":
            sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
            chat = sdk.chat.completions.with_raw_response.create(
                model=model,
                messages=items,  # type: ignore[arg-type]
                max_tokens=256,
            )
            return chat.headers
        if api == "openai.responses":
            sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-client", max_retries=0)
            responses = sdk.responses.with_raw_response.create(
                model=model,
                input=items,  # type: ignore[arg-type]
                max_output_tokens=256,
            )
            return responses.headers
        if api == "anthropic.messages":
            claude = anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0)
            messages = claude.messages.with_raw_response.create(
                model=model,
                max_tokens=256,
                messages=items,  # type: ignore[arg-type]
            )
            return messages.headers
        reply = httpx.post(
            f"{base}/v1beta/models/{model}:generateContent",
            json={"contents": items},
            headers={"x-goog-api-key": "AIza-client"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return reply.headers


CLIENTS = {
    "openai.chat": Client(CASES["openai.chat"], "small", "roomy"),
    "openai.responses": Client(CASES["openai.responses"], "small", "roomy"),
    "anthropic.messages": Client(CASES["anthropic.messages"], "claude-small", "claude-roomy"),
    "gemini.generate": Client(CASES["gemini.generate"], "gem-small", "gem-roomy"),
}


def test_every_wire_api_has_a_client() -> None:
    assert set(CLIENTS) == set(WIRES)


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest) -> Client:
    return CLIENTS[request.param]


def start(
    brim: BrimFactory, provider: FakeProvider, client: Client, roomy: int = ROOMY, **guard: Any
) -> str:
    models = {
        client.small: {"context_window": SMALL, "max_output": 1_000, "fallbacks": [client.roomy]},
        client.roomy: {"context_window": roomy, "max_output": 1_000},
    }
    return brim(**every_api(provider), models=models, guard=guard)


def sent(provider: FakeProvider, client: Client) -> tuple[str, list[Any]]:
    """The model the provider was asked for last, and the conversation it got."""
    seen = provider.requests[-1]
    body = orjson.loads(seen.body)
    model = body.get("model") or seen.path.rpartition("/models/")[2].partition(":")[0]
    return model, client.case.wire.conversation(body)


def test_a_fallback_that_holds_the_request_gets_it_whole_instead_of_a_cut(
    brim: BrimFactory, provider: FakeProvider, client: Client
) -> None:
    base = start(brim, provider, client)
    items = session(client.case, 10)
    headers = client.send(base, client.small, items)
    assert headers["x-brim-actions"] == "fallback:1"
    assert int(headers["x-brim-tokens-in"]) > SMALL  # it was over the model asked for…
    assert int(headers["x-brim-budget"]) > SMALL  # …and the budget is the fallback's
    assert len(provider.requests) == 1  # no refusal first: the fallback was chosen up front
    model, conversation = sent(provider, client)
    assert model == client.roomy
    assert conversation == items  # whole: nothing was cut

    # A fallback too small for it, or prefer_fallback off: the guard cuts it, as before.
    for base in (
        start(brim, provider, client, roomy=SMALL + 500),
        start(brim, provider, client, prefer_fallback=False),
    ):
        headers = client.send(base, client.small, items)
        actions = headers["x-brim-actions"]
        assert "fallback" not in actions and actions != "none"
        model, conversation = sent(provider, client)
        assert model == client.small and conversation != items  # cut
