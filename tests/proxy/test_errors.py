"""Every error brim answers, in OpenAI's shape; provider errors relayed unchanged. (Upstream
faults — unreachable, timeouts, broken streams — are in tests/adapters/test_faults.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import BrimFactory
from tests.fakes import FakeProvider

HELLO = [{"role": "user", "content": "ping"}]


def post(base: str, body: Any = None, *, raw: bytes | None = None, **kwargs: Any) -> httpx.Response:
    content = raw if raw is not None else orjson.dumps(body)
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    return httpx.post(
        f"{base}/v1/chat/completions", content=content, headers=headers, timeout=10, **kwargs
    )


def error_of(reply: httpx.Response) -> dict[str, Any]:
    body = reply.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert reply.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"model": "fake-model", "messages": [', "parse the JSON"),
        (b"", "empty"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "fake-model", "messages": [{"role": "user", "content": "\xff"}]}', "JSON"),
    ],
)
def test_unparseable_bodies_are_400_invalid_request(
    brim: BrimFactory, provider: FakeProvider, raw: bytes, fragment: str
) -> None:
    reply = post(brim(), raw=raw)
    assert reply.status_code == 400
    error = error_of(reply)
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]
    assert provider.requests == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HELLO}, "model"),
        ({"model": "fake-model"}, "messages"),
        ({"model": "fake-model", "messages": []}, "messages"),
        ({"model": 7, "messages": HELLO}, "model"),
        (
            {"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
        ),
        ({"model": "fake-model", "messages": [{"content": "x"}]}, "messages[0].role"),
        (
            {"model": "fake-model", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
        ),
        ({"model": "fake-model", "messages": HELLO, "stream": "yes"}, "stream"),
        (
            {"model": "fake-model", "messages": [*HELLO, {"role": "tool", "content": "x"}]},
            "messages[1].tool_call_id",
        ),
        ({"model": "fake-model", "messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bodies_that_are_not_chat_requests_name_the_parameter(
    brim: BrimFactory, provider: FakeProvider, body: dict[str, Any], param: str
) -> None:
    reply = post(brim(), body)
    assert reply.status_code == 400
    error = error_of(reply)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param in error["message"]
    assert provider.requests == []


def test_sdk_sees_brims_400_as_bad_request(brim: BrimFactory) -> None:
    sdk = openai.OpenAI(base_url=f"{brim()}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model="fake-model", messages=[{"role": "wizard", "content": "x"}]
        )  # type: ignore[misc, list-item]
    assert caught.value.status_code == 400
    assert "messages[0].role" in caught.value.message


def test_body_over_the_limit_is_413(brim: BrimFactory, provider: FakeProvider) -> None:
    base = brim(server={"max_body_mb": 0.01})  # 10 KiB
    big = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 20_000}]}
    reply = post(base, big)
    assert reply.status_code == 413
    assert error_of(reply)["code"] == "request_too_large"

    def chunked() -> Any:  # no Content-Length: the limit is enforced while reading
        yield orjson.dumps(big)

    reply = httpx.post(
        f"{base}/v1/chat/completions",
        content=chunked(),
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 413
    assert error_of(reply)["type"] == "invalid_request_error"
    assert provider.requests == []


def test_no_route_for_the_model_is_404_model_not_found(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(routes={"gpt-*": "fake"})
    reply = post(base, {"model": "llama-3", "messages": HELLO})
    assert reply.status_code == 404
    error = error_of(reply)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "llama-3" in error["message"]
    assert post(base, {"model": "gpt-x", "messages": HELLO}).status_code == 200
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="llama-3", messages=HELLO)  # type: ignore[arg-type]


def test_unknown_path_and_method_are_wire_shaped(brim: BrimFactory) -> None:
    base = brim()
    missing = httpx.post(f"{base}/v1/embeddingz", json={})
    assert missing.status_code == 404
    assert error_of(missing)["code"] == "unknown_url"
    wrong_method = httpx.get(f"{base}/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert error_of(wrong_method)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path", "status", "api"),
    [
        ("POST", "/v1/embeddingz", 404, "openai"),
        ("GET", "/v1/chat/completions", 405, "openai"),
        ("DELETE", "/healthz", 405, "openai"),
        ("POST", "/nothing/here", 404, "openai"),
        ("GET", "/v1/messages", 405, "anthropic"),
        ("POST", "/v1/messages/nope", 404, "anthropic"),
        ("GET", "/v1beta/models/gemini-2.5-pro:generateContent", 405, "gemini"),
        ("POST", "/v1beta/nope/x", 404, "gemini"),
    ],
)
def test_unserved_urls_get_404_or_405_in_the_wire_format_of_their_api(
    brim: BrimFactory, provider: FakeProvider, method: str, path: str, status: int, api: str
) -> None:
    reply = httpx.request(method, f"{brim()}{path}", json={}, timeout=10)
    assert reply.status_code == status
    assert reply.headers["x-brim-request-id"]
    body = reply.json()
    if api == "openai":
        assert error_of(reply)["code"] == ("unknown_url" if status == 404 else "method_not_allowed")
    elif api == "anthropic":
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        assert (body["type"], body["error"]["type"]) == ("error", kind)
        assert path in body["error"]["message"]
    else:
        assert (body["error"]["code"], body["error"]["status"]) == (
            status,
            "NOT_FOUND" if status == 404 else "INVALID_ARGUMENT",
        )
    if status == 405:  # the methods the URL is served for, as RFC 9110 asks
        served = {m.strip() for m in reply.headers["allow"].split(",")}
        assert served & {"GET", "POST"} and method not in served
    assert provider.requests == []


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 429, 500, 503])
def test_upstream_error_replies_are_relayed_unchanged(
    brim: BrimFactory, provider: FakeProvider, status: int
) -> None:
    provider.error_bodies[status] = b'{"error": {"message": "exact \\u00e9 bytes", "code": 1}}  '
    reply = post(brim(), {"model": f"error-{status}", "messages": HELLO})
    assert reply.status_code == status
    assert reply.content == provider.error_bodies[status]
    assert reply.headers["x-fake-error"] == "yes"
    assert reply.headers["retry-after"] == "7"


def test_sdk_sees_the_providers_own_error(brim: BrimFactory) -> None:
    sdk = openai.OpenAI(base_url=f"{brim()}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.chat.completions.create(model="error-429", messages=HELLO)  # type: ignore[arg-type]
    assert caught.value.code == "fake_429"
    assert "fake provider says 429" in caught.value.message


def test_streaming_request_with_an_upstream_error_is_relayed_unchanged(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    reply = post(brim(), {"model": "error-400", "messages": HELLO, "stream": True})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "fake_400"


class TestBrimKeys:
    @pytest.fixture
    def base(self, brim: BrimFactory, monkeypatch: pytest.MonkeyPatch) -> str:
        monkeypatch.setenv("TEST_BRIM_KEYS", "brim-key-one, brim-key-two")
        return brim(server={"api_keys_env": "TEST_BRIM_KEYS"})

    def test_missing_key_is_401(self, base: str, provider: FakeProvider) -> None:
        reply = post(base, {"model": "fake-model", "messages": HELLO})
        assert reply.status_code == 401
        assert error_of(reply)["code"] == "invalid_api_key"
        assert provider.requests == []

    def test_wrong_key_is_401(self, base: str, provider: FakeProvider) -> None:
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="not-a-brim-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            sdk.chat.completions.create(model="fake-model", messages=HELLO)  # type: ignore[arg-type]
        assert provider.requests == []

    def test_brim_key_is_accepted_and_never_forwarded(
        self, base: str, provider: FakeProvider
    ) -> None:
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="brim-key-two", max_retries=0)
        assert sdk.chat.completions.create(model="fake-model", messages=HELLO).choices  # type: ignore[arg-type]
        assert "authorization" not in provider.last.headers

        reply = post(
            base,
            {"model": "fake-model", "messages": HELLO},
            headers={"x-brim-api-key": "brim-key-one", "Authorization": "Bearer sk-provider"},
        )
        assert reply.status_code == 200
        assert provider.last.headers["authorization"] == "Bearer sk-provider"
        assert "x-brim-api-key" not in provider.last.headers

    def test_health_needs_no_key(self, base: str) -> None:
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
