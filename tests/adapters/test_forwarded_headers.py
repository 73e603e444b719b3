from __future__ import annotations

from multidict import CIMultiDict

from brim.adapters.forwarded_headers import (
    client_response_headers,
    end_to_end,
    upstream_request_headers,
)


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    headers = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"),
            ("X-Kept", "a"),
            ("X-Kept", "b"),
        ]
    )
    assert list(end_to_end(headers).items()) == [("X-Kept", "a"), ("X-Kept", "b")]


def test_upstream_headers_without_configured_key_pass_client_credentials() -> None:
    client = CIMultiDict(
        {
            "Authorization": "Bearer c",
            "Host": "brim:8787",
            "Content-Length": "9",
            "x-brim-api-key": "b",
        }
    )
    sent = upstream_request_headers(client, api="openai", api_key=None)
    assert dict(sent) == {"Authorization": "Bearer c"}


def test_configured_key_replaces_every_client_credential() -> None:
    client = CIMultiDict({"Authorization": "Bearer c", "x-api-key": "c", "api-key": "c"})
    sent = upstream_request_headers(client, api="openai", api_key="sk-conf")
    assert dict(sent) == {"Authorization": "Bearer sk-conf"}


def test_to_an_upstream_the_client_did_not_address_no_credential_or_cookie_goes() -> None:
    client = CIMultiDict(
        {"Authorization": "Bearer c", "x-api-key": "c", "Cookie": "s=1", "X-Trace": "t"}
    )
    sent = upstream_request_headers(client, api="anthropic", api_key=None, addressed=False)
    assert dict(sent) == {"X-Trace": "t"}
    own = upstream_request_headers(client, api="anthropic", api_key="sk-own", addressed=False)
    assert dict(own) == {"X-Trace": "t", "x-api-key": "sk-own"}


def test_client_response_headers_drop_length_and_encoding() -> None:
    upstream = CIMultiDict(
        {
            "Content-Length": "10",
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
            "x-request-id": "u1",
        }
    )
    assert dict(client_response_headers(upstream)) == {
        "Content-Type": "application/json",
        "x-request-id": "u1",
    }
