"""Building blocks for tests: conversations in Chat Completions shape, and exchanges."""

from __future__ import annotations

from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from brim.adapters.exchange import Exchange


def tool_turn(
    call_id: str, content: str, name: str = "read_file", said: str | None = None
) -> list[dict[str, Any]]:
    """An assistant turn making one tool call, and the tool message answering it."""
    return [
        {
            "role": "assistant",
            "content": said,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]


def tool_session(outputs: list[str], *, system: str | None = None) -> list[dict[str, Any]]:
    """A task, one `bash` call per output (answered by it), and a last question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": "go"})
    for n, output in enumerate(outputs):
        messages += tool_turn(f"c{n}", output, name="bash")
    messages.append({"role": "user", "content": "so?"})
    return messages


def exchange(
    api: str = "openai.chat",
    model: str = "m",
    body: dict[str, Any] | None = None,
    *,
    headers: dict[str, str] | None = None,
    endpoint: str = "/",
    query: str = "",
    stream: bool = False,
    upstream: str = "u",
    user_agent: str = "",
) -> Exchange:
    """An exchange as a route would build it, for driving stages directly."""
    body = {} if body is None else body
    return Exchange(
        api=api,
        method="POST",
        endpoint=endpoint,
        query=query,
        model=model,
        body=body,
        raw=orjson.dumps(body),
        headers=CIMultiDictProxy(CIMultiDict(headers or {})),
        stream=stream,
        upstream=upstream,
        request_id="r",
        user_agent=user_agent,
        addressed=upstream,
    )


def same_turn(sent: dict[str, Any], original: dict[str, Any]) -> bool:
    """Whether `sent` is the client's Anthropic `original` message: equal to it, or its tool
    results (the same calls, in order) with their text shrunk by a policy."""
    if sent is original or sent == original:
        return True
    ids = [b.get("tool_use_id") for b in sent["content"] if isinstance(b, dict)]
    return (
        ids != []
        and ids == [b.get("tool_use_id") for b in original["content"] if isinstance(b, dict)]
        and sent["role"] == original["role"]
    )


def without_named_whole(shortened: str, original: str) -> str:
    """A result prune shortened, without the note naming its whole — checked to name the key of
    `original` (in a last line, or as a JSON array's last item or an object's "brim" field)."""
    from brim.policies.conversation import archive_key
    from brim.policies.information import SHORTENED

    note = f"{SHORTENED}{archive_key(original)[:16]}]"
    if shortened.endswith(f"\n{note}"):
        return shortened.removesuffix(f"\n{note}")
    parsed = orjson.loads(shortened)
    if isinstance(parsed, list):
        assert parsed[-1] == note, parsed[-1]
        return orjson.dumps(parsed[:-1]).decode()
    assert parsed.pop("brim") == note
    return orjson.dumps(parsed).decode()
