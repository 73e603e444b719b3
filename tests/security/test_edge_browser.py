"""A web page cannot drive a loopback brim (issue 34, attack 7). A page's simple POST (a
foreign `Origin`, `Content-Type: text/plain`, no preflight) and a DNS-rebound page (its own
name as `Host`) are refused on every wire API, before anything is read or sent; a CORS
preflight from a foreign origin gets no permissive answer. brim's own pages (the `/ui`
dashboard, tests/proxy/test_dashboard.py in chromium), the SDKs and the CLIs go on as before,
and an origin the operator lists gets CORS. `/metrics` needs the admin key unless brim is bound
to loopback with no keys (`[server] metrics_public`)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider
from tests.proxy.test_bad_input import PATHS, shaped
from tests.security.test_edge_input import BODIES

EVIL = "http://evil.example"
ADMIN = "edge-admin-key-0123456789"
# What a page's `fetch(url, {method: "POST", body: JSON.stringify(...)})` sends: a simple
# request, without a preflight.
PAGE = {"Origin": EVIL, "Content-Type": "text/plain;charset=UTF-8", "Sec-Fetch-Mode": "no-cors"}
ACCESS_CONTROL = "access-control-"


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider) -> str:
    return brim(**every_api(provider))


def port_of(base: str) -> str:
    return base.rsplit(":", 1)[1]


def page_post(base: str, wire: str, headers: dict[str, str]) -> httpx.Response:
    content = orjson.dumps(BODIES[wire])
    return httpx.post(f"{base}{PATHS[wire]}", content=content, headers=headers)


def no_cors(reply: httpx.Response) -> bool:
    return not any(name.lower().startswith(ACCESS_CONTROL) for name in reply.headers)


@pytest.mark.parametrize("wire", list(PATHS))
def test_a_foreign_pages_simple_post_is_refused(
    base: str, provider: FakeProvider, wire: str
) -> None:
    reply = page_post(base, wire, PAGE)
    assert reply.status_code == 403
    assert EVIL in shaped(wire, reply) and "allowed_origins" in shaped(wire, reply)
    assert no_cors(reply)
    # Its JSON-typed request (which a browser preflights first) is refused the same way.
    reply = page_post(base, wire, {**PAGE, "Content-Type": "application/json"})
    assert reply.status_code == 403
    assert provider.requests == []


@pytest.mark.parametrize("wire", list(PATHS))
def test_a_text_plain_body_is_refused_whoever_sends_it(
    base: str, provider: FakeProvider, wire: str
) -> None:
    """Without an Origin (a page whose browser leaves it out, a sandboxed frame's `null` is
    refused above): the body type alone is refused."""
    reply = page_post(base, wire, {"Content-Type": "text/plain;charset=UTF-8"})
    assert reply.status_code == 415 and "application/json" in shaped(wire, reply)
    assert provider.requests == []


@pytest.mark.parametrize("wire", list(PATHS))
@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:{port}", "127.0.0.1.nip.io"]
)
def test_a_dns_rebound_page_is_refused_by_its_host(
    base: str, provider: FakeProvider, wire: str, host: str
) -> None:
    """The page's name now resolves to 127.0.0.1: its requests are same-origin to the browser,
    so `Origin` is its own name, as `Host` is."""
    named = host.format(port=port_of(base))
    origin = f"http://{named}"
    headers = {"Host": named, "Origin": origin, "Content-Type": "application/json"}
    reply = page_post(base, wire, headers)
    assert reply.status_code == 403
    assert "allowed_hosts" in shaped(wire, reply)
    assert reply.json()  # in the wire's shape (checked by `shaped`)
    reply = page_post(base, wire, {"Host": named, "Content-Type": "application/json"})
    assert reply.status_code == 403
    assert provider.requests == []


def preflight(url: str, origin: str, wanted: str) -> httpx.Response:
    """The CORS preflight a browser sends before a page's JSON POST to `url`."""
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": wanted,
    }
    return httpx.options(url, headers=headers)


def test_a_foreign_preflight_gets_no_permissive_answer(base: str) -> None:
    for path in ("/v1/chat/completions", "/v1/messages", "/admin/status", "/metrics"):
        reply = preflight(f"{base}{path}", EVIL, "content-type,x-api-key")
        assert reply.status_code == 403 and no_cors(reply)


def test_loopback_names_and_listed_hosts_are_served(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    base = brim(server={"allowed_hosts": ["brim.internal"]}, **every_api(provider))
    port = port_of(base)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "LOCALHOST", "brim.internal"):
        reply = page_post(base, "openai", {"Host": host, "Content-Type": "application/json"})
        assert reply.status_code == 200, (host, reply.text)
    # brim's own origin, as its dashboard sends it: served.
    own = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    assert page_post(base, "openai", {**own, "Content-Type": "application/json"}).status_code == 200
    assert httpx.get(f"{base}/healthz", headers=own).status_code == 200


def test_the_dashboards_own_fetch_is_answered(brim: BrimFactory, monkeypatch: Any) -> None:
    monkeypatch.setenv("EDGE_ADMIN_KEYS", ADMIN)
    base = brim(server={"admin_keys_env": "EDGE_ADMIN_KEYS"})
    own = {"Origin": base, "x-brim-admin-key": ADMIN}
    assert httpx.get(f"{base}/admin/status", headers=own).status_code == 200
    foreign = {"Origin": EVIL, "x-brim-admin-key": ADMIN}
    assert httpx.get(f"{base}/admin/status", headers=foreign).status_code == 403


def test_the_sdks_are_served_as_before(base: str, provider: FakeProvider) -> None:
    chat = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-x", max_retries=0)
    answer = chat.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content
    assert chat.responses.create(model="fake-model", input="hi").output_text
    messages = anthropic.Anthropic(base_url=base, api_key="sk-ant-x", max_retries=0)
    told = messages.messages.create(
        model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    assert told.content
    assert len(provider.requests) == 3


def test_a_listed_origin_gets_cors(brim: BrimFactory, provider: FakeProvider) -> None:
    """An operator who lists an origin lets its pages call brim: the preflight is answered, and
    the replies say the page may read them. The provider sees brim, not the page's origin."""
    app = "http://localhost:3000"
    base = brim(server={"allowed_origins": [app]}, **every_api(provider))
    answered = preflight(f"{base}/v1/chat/completions", app, "authorization,content-type")
    assert answered.status_code == 204
    assert answered.headers["access-control-allow-origin"] == app
    assert answered.headers["access-control-allow-headers"] == "authorization,content-type"
    reply = page_post(base, "openai", {"Origin": app, "Content-Type": "application/json"})
    assert reply.status_code == 200
    assert reply.headers["access-control-allow-origin"] == app
    assert "origin" not in provider.last.headers
    assert page_post(base, "openai", PAGE).status_code == 403  # another origin still is not


def test_metrics_need_the_admin_key_once_keys_are_set(brim: BrimFactory, monkeypatch: Any) -> None:
    assert httpx.get(f"{brim()}/metrics").status_code == 200  # loopback, no keys: public
    monkeypatch.setenv("EDGE_API_KEYS", "sk-brim-edge")
    monkeypatch.setenv("EDGE_ADMIN_KEYS", ADMIN)
    keyed = brim(server={"api_keys_env": "EDGE_API_KEYS", "admin_keys_env": "EDGE_ADMIN_KEYS"})
    for headers in ({}, {"Authorization": "Bearer sk-brim-edge"}):
        refused = httpx.get(f"{keyed}/metrics", headers=headers)
        assert refused.status_code in (401, 403) and "admin" in refused.json()["error"]["message"]
    scraped = httpx.get(f"{keyed}/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    assert scraped.status_code == 200 and "brim_requests" in scraped.text
    only_api = brim(server={"api_keys_env": "EDGE_API_KEYS"})
    off = httpx.get(f"{only_api}/metrics")
    assert off.status_code == 403 and "metrics_public" in off.json()["error"]["message"]
    public = brim(server={"api_keys_env": "EDGE_API_KEYS", "metrics_public": True})
    assert httpx.get(f"{public}/metrics").status_code == 200
