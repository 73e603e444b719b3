"""The unit of work that travels from the HTTP layer through the pipeline to an adapter."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from multidict import CIMultiDictProxy

# The wire API the client spoke. Named by API, not by provider: Azure and vLLM speak "openai.chat".
ClientApi = Literal["openai.chat", "openai.models"]


@dataclass(frozen=True, slots=True)
class Exchange:
    """One client request as brim sees it.

    `raw` holds the client's body bytes exactly as received; `body` is the same request parsed.
    A stage that changes the request returns `with_body(new_body)`, which re-serializes; an
    exchange nobody changed is forwarded as `raw`, byte for byte.
    """

    api: ClientApi
    method: str
    endpoint: str  # the path after the API root, e.g. "/chat/completions"
    query: str
    model: str
    body: dict[str, Any] | None
    raw: bytes
    headers: CIMultiDictProxy[str]
    stream: bool
    upstream: str
    request_id: str
    user_agent: str = ""
    changed: bool = False
    notes: dict[str, Any] = field(default_factory=dict, compare=False)

    def with_body(self, body: dict[str, Any]) -> Exchange:
        return dataclasses.replace(self, body=body, raw=orjson.dumps(body), changed=True)
