"""Upstream faults, each with its documented answer (the rest of the matrix lives beside the
routes: refused → 502, timeout → 504, cut-off stream, disconnects, in-stream overflow)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.conftest import BrimFactory, fake_upstream
from tests.fakes import FakeProvider

HELLO = [{"role": "user", "content": "ping"}]


def post(base: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions", json={"model": model, "messages": HELLO, **extra}, timeout=30
    )


def test_dns_failure_is_502(brim: BrimFactory) -> None:
    base = brim(
        upstreams={
            "nowhere": {
                "api": "openai",
                "base_url": "http://no-such-host.invalid/v1",
                "connect_timeout_s": 5,
            }
        }
    )
    reply = post(base, "m")
    assert reply.status_code == 502 and reply.json()["error"]["code"] == "upstream_unreachable"


def test_tls_failure_is_502(brim: BrimFactory, provider: FakeProvider) -> None:
    base = brim(
        upstreams={
            "tls": {
                "api": "openai",
                "base_url": provider.url.replace("http://", "https://") + "/v1",
            }
        }
    )
    reply = post(base, "m")
    assert reply.status_code == 502 and reply.json()["error"]["code"] in (
        "upstream_unreachable",
        "upstream_protocol_error",
    )
    assert "Traceback" not in reply.text


@pytest.mark.parametrize("status", [502, 503, 529])
def test_overloaded_and_gateway_errors_are_relayed(brim: BrimFactory, status: int) -> None:
    reply = post(brim(), f"error-{status}")
    assert reply.status_code == status and reply.json()["error"]["code"] == f"fake_{status}"


def test_a_stream_that_stalls_ends_with_an_error_event(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(upstreams={"fake": fake_upstream(provider, timeout_s=0.5)})
    reply = post(base, "stalled-stream", stream=True)
    assert reply.status_code == 200
    events = [line for line in reply.text.splitlines() if line.startswith("data: ")]
    assert "first" in events[1]
    assert orjson.loads(events[-1].removeprefix("data: "))["error"]["code"] == "upstream_timeout"


def test_malformed_json_from_the_provider_is_relayed_not_crashed_on(brim: BrimFactory) -> None:
    reply = post(brim(), "garbage")
    assert reply.status_code == 200 and reply.content == b"{not json at all"
