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
# Recomputed by the next hop, or owned by brim itself: brim decodes a compressed request body
# and sends it on as it decoded it (`proxy.decoding`); a web page's `Origin` is brim's to judge
# (`proxy.edge`), and the provider's client is brim.
_NOT_FORWARDED_UPSTREAM = frozenset(
    {"host", "content-length", "expect", "accept-encoding", "content-encoding", "origin"}
)
_NOT_RELAYED_DOWNSTREAM = frozenset({"content-length", "content-encoding", "server", "date"})
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
# What of a client's never goes to an upstream it did not address (a fallback's, a summarizer's):
# its credentials, and the cookies its provider set for it.
CLIENT_ONLY_HEADERS = CREDENTIAL_HEADERS | {"cookie"}
BRIM_KEY_HEADER = "x-brim-api-key"
# How each kind of upstream (`[upstreams.NAME] api`) takes a configured key.
KEY_HEADER = {
    "openai": ("Authorization", "Bearer {}"),
    "litellm": ("Authorization", "Bearer {}"),
    "anthropic": ("x-api-key", "{}"),
    "gemini": ("x-goog-api-key", "{}"),
}


# Everything dropped on each way, lowercased once here rather than per request.
_UPSTREAM_DROP = HOP_BY_HOP | _NOT_FORWARDED_UPSTREAM | {BRIM_KEY_HEADER}
_UPSTREAM_DROP_KEYED = _UPSTREAM_DROP | CREDENTIAL_HEADERS
_UPSTREAM_DROP_FOREIGN = _UPSTREAM_DROP | CLIENT_ONLY_HEADERS
_DOWNSTREAM_DROP = HOP_BY_HOP | _NOT_RELAYED_DOWNSTREAM


def _kept(headers: Mapping[str, str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """`headers` without the lowercase names in `dropped` (which holds `HOP_BY_HOP`) nor those
    a `Connection` header names; one pass over them, a second only when `Connection` names any."""
    kept: list[tuple[str, str]] = []
    named: set[str] | None = None
    for key, value in headers.items():
        lower = key.lower()
        if lower in dropped:
            if lower == "connection":
                tokens = {t.strip().lower() for t in value.split(",")}
                named = tokens if named is None else named | tokens
            continue
        kept.append((key, value))
    if named:
        kept = [(key, value) for key, value in kept if key.lower() not in named]
    return CIMultiDict(kept)


def end_to_end(headers: Mapping[str, str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """The headers that may be forwarded: no hop-by-hop ones, nor those named in `Connection`."""
    return _kept(headers, HOP_BY_HOP.union(name.lower() for name in drop))


def upstream_request_headers(
    client_headers: Mapping[str, str], *, api: str, api_key: str | None, addressed: bool = True
) -> CIMultiDict[str]:
    """Headers for the provider: the client's end-to-end ones, with the configured key if any.

    With no configured key, the client's own credentials pass through unchanged — to the
    upstream the client addressed only (`addressed`). To any other (a fallback's, a
    summarizer's) neither its credentials nor its cookies go: only the upstream's own key.
    """
    if not addressed:
        headers = _kept(client_headers, _UPSTREAM_DROP_FOREIGN)
    elif api_key is None:
        return _kept(client_headers, _UPSTREAM_DROP)
    else:
        headers = _kept(client_headers, _UPSTREAM_DROP_KEYED)
    if api_key is not None:
        name, template = KEY_HEADER.get(api, KEY_HEADER["openai"])
        headers[name] = template.format(api_key)
    return headers


def client_response_headers(upstream_headers: Mapping[str, str]) -> CIMultiDict[str]:
    """Headers for the client. The body is relayed decoded, so its length and encoding go."""
    return _kept(upstream_headers, _DOWNSTREAM_DROP)
