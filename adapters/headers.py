"""Which headers cross the proxy (RFC 9110 §7.6.1 hop-by-hop rules)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from multidict import CIMultiDict

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Recomputed by the next hop, or owned by brim itself.
_NOT_FORWARDED_UPSTREAM = frozenset({"host", "content-length", "expect", "accept-encoding"})
_NOT_RELAYED_DOWNSTREAM = frozenset({"content-length", "content-encoding", "server", "date"})
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
BRIM_KEY_HEADER = "x-brim-api-key"
# How each kind of upstream (`[upstreams.NAME] api`) takes a configured key.
KEY_HEADER = {
    "openai": ("Authorization", "Bearer {}"),
    "litellm": ("Authorization", "Bearer {}"),
    "anthropic": ("x-api-key", "{}"),
    "gemini": ("x-goog-api-key", "{}"),
}


def _connection_tokens(headers: Mapping[str, str]) -> set[str]:
    tokens: set[str] = set()
    for key, value in headers.items():
        if key.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def end_to_end(headers: Mapping[str, str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """The headers that may be forwarded: no hop-by-hop ones, nor those named in `Connection`."""
    dropped = HOP_BY_HOP | _connection_tokens(headers) | {name.lower() for name in drop}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in dropped)


def upstream_request_headers(
    client_headers: Mapping[str, str], *, api: str, api_key: str | None
) -> CIMultiDict[str]:
    """Headers for the provider: the client's end-to-end ones, with the configured key if any.

    With no configured key, the client's own credentials pass through unchanged.
    """
    drop = set(_NOT_FORWARDED_UPSTREAM) | {BRIM_KEY_HEADER}
    if api_key is not None:
        drop |= CREDENTIAL_HEADERS
    headers = end_to_end(client_headers, drop)
    if api_key is not None:
        name, template = KEY_HEADER.get(api, KEY_HEADER["openai"])
        headers[name] = template.format(api_key)
    return headers


def client_response_headers(upstream_headers: Mapping[str, str]) -> CIMultiDict[str]:
    """Headers for the client. The body is relayed decoded, so its length and encoding go."""
    return end_to_end(upstream_headers, _NOT_RELAYED_DOWNSTREAM)
