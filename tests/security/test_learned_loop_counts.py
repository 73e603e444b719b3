"""The loop guard's counts are facts about one client's request, not about a body anyone may send.

Two clients of one brim (each with its own brim key, brim holding the provider key) send the same
body. One of them adds a header that makes the provider refuse it — an `anthropic-beta` it does
not know — until the loop guard stops it; the other's request, without that header, still
reaches the provider and is answered.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from aiohttp import web

from tests.conftest import BrimFactory
from tests.fakes import FakeProvider, LoopThread, start_app

BODY: Any = [{"role": "user", "content": "Summarize the design doc."}]


@pytest.fixture
def beta_checking(loop_thread: LoopThread) -> Any:
    """The fake provider, refusing an `anthropic-beta` it does not know, as Anthropic does."""
    provider = FakeProvider()

    @web.middleware
    async def betas(request: web.Request, handler: Any) -> web.StreamResponse:
        beta = request.headers.get("anthropic-beta")
        if beta is not None:
            message = f"Unexpected value(s) `{beta}` for the `anthropic-beta` header."
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": message},
            }
            return web.json_response(error, status=400)
        response: web.StreamResponse = await handler(request)
        return response

    app = provider.app()
    app.middlewares.append(betas)
    runner, url = loop_thread.run(start_app(app))
    provider.url = url
    yield provider
    loop_thread.run(runner.cleanup())


def send(base: str, key: str, **extra: Any) -> int:
    sdk = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    try:
        sdk.messages.create(model="claude-haiku-4-5", max_tokens=50, messages=BODY, **extra)
    except anthropic.APIStatusError as error:
        return error.status_code
    return 200


BOGUS: Any = {"extra_headers": {"anthropic-beta": "no-such-beta-2099-01-01"}}


@pytest.fixture
def base(brim: BrimFactory, beta_checking: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> str:
    """brim with two brim keys (clients A and B), holding the provider key itself, the loop
    guard stopping a request after two failures in a minute."""
    monkeypatch.setenv("LOOP_BRIM_KEYS", "key-of-a,key-of-b")
    monkeypatch.setenv("LOOP_PROVIDER_KEY", "sk-ant-brims-own")
    base = brim(
        upstreams={
            "anthropic": {
                "api": "anthropic",
                "base_url": beta_checking.url,
                "api_key_env": "LOOP_PROVIDER_KEY",
            }
        },
        server={"api_keys_env": "LOOP_BRIM_KEYS"},
        guard={"loop_limit": 2, "loop_window_s": 60},
    )
    return base


def test_a_failure_one_client_brings_about_with_a_header_blocks_no_other_client(base: str) -> None:
    assert [send(base, "key-of-a", **BOGUS) for _ in range(3)] == [400, 400, 429]
    assert send(base, "key-of-b") == 200  # the same body, without the header
    assert send(base, "key-of-a", **BOGUS) == 429  # still blocked for what fails


def test_one_clients_failures_never_block_another_client_sending_the_same_request(
    base: str,
) -> None:
    """Two brim-key clients behind brim's one provider key, sending byte-identical requests: the
    provider sees the same thing from both, but the count of failures is each client's own."""
    assert [send(base, "key-of-a", **BOGUS) for _ in range(3)] == [400, 400, 429]
    # B's identical request goes to the provider and gets the provider's own answer.
    assert send(base, "key-of-b", **BOGUS) == 400
    assert send(base, "key-of-a", **BOGUS) == 429  # A is still stopped
