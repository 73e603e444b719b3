"""A fake Anthropic Messages API provider on 127.0.0.1, for tests.

Its behaviour is chosen by the request's model name, so one running provider serves every test:

- the real window is the number after the last dash ("claude-window-6000" holds 6000 tokens);
  a model without a numeric suffix has no window;
- "claude-streamerr-N" refuses an overflowing request inside a 200 event stream, not with a 400;
- "claude-shared-N" counts the request's `max_tokens` against its window too, and says so as
  Anthropic does: "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000";
- "claude-nocount-..." answers 404 on /v1/messages/count_tokens, like an upstream without it;
- "claude-slowcount-..." answers /v1/messages/count_tokens only after SLOW_COUNT_S (and leaves
  `count_calls` alone, so a late answer never shows up in a later test);
- "claude-scaledNN-..." counts NN % of brim's own estimate (`token_count`), on count_tokens, in
  its window check and in `usage`: a provider whose real tokenizer differs from brim's estimate
  ("claude-scaled90-6000": 90 %, a 6000-token window).

Requests are checked against Anthropic's rules by `anthropic_errors`, written independently of
brim's dialect code. A thinking block is valid only with `signature == thinking_signature(text)`
(sha256 of the thinking text, first 32 hex digits), so an edited thinking block is refused, as
Anthropic's signature check refuses it.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes import Seen, client_tools, counted, record

OUTPUT_TOKENS = 12
STREAMERR_PREFIX = "claude-streamerr-"
SHARED_PREFIX = "claude-shared-"
NOCOUNT_PREFIX = "claude-nocount-"
SLOWCOUNT_PREFIX = "claude-slowcount-"
SLOW_COUNT_S = 3.0
_SCALED = re.compile(r"claude-scaled(\d+)-")


def token_count(body: dict[str, Any]) -> int:
    """What the fake counts for a request: brim's own Claude estimate of it."""
    return counted("anthropic.messages", body, "claude")


def provider_count(body: dict[str, Any]) -> int:
    """What the fake itself counts: `token_count`, scaled for a "claude-scaledNN-" model."""
    scaled = _SCALED.match(str(body.get("model", "")))
    tokens = token_count(body)
    return tokens * int(scaled.group(1)) // 100 if scaled else tokens


def thinking_signature(thinking: str) -> str:
    """The only signature the fake accepts on a thinking block with this text."""
    return hashlib.sha256(thinking.encode()).hexdigest()[:32]


def window_of(model: str) -> int | None:
    """The model's real window: the number after its last dash, or None for no limit."""
    suffix = model.rsplit("-", 1)[-1]
    return int(suffix) if "-" in model and suffix.isdigit() else None


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _of_type(blocks: list[Any], kind: str) -> list[dict[str, Any]]:
    return [b for b in blocks if isinstance(b, dict) and b.get("type") == kind]


def anthropic_errors(messages: Any) -> list[str]:
    """Anthropic's rules for `messages`, each problem as "messages.N: ...":
    the first message is the user's; roles are user, assistant or system; a user message's
    tool_result blocks come first and answer tool_use ids of the assistant message just before
    it; every tool_use of an assistant message is answered in the very next message; every
    thinking block carries the signature of its own text; a system message (mid-conversation)
    holds text only, comes right after a user message (or an assistant one ending in a server
    tool's use) and right before an assistant message, or last."""
    if not isinstance(messages, list) or not messages:
        return ["messages: at least one message is required"]
    errors: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant", "system"):
            errors.append(
                f"messages.{index}: unexpected role {role!r}; use user, assistant or system"
            )
            continue
        if index == 0 and role != "user":
            errors.append(f"messages.{index}: the first message must use the user role")
        if role == "system":
            errors.extend(_system_errors(index, messages))
            continue
        blocks = _blocks(message)
        for position, block in enumerate(blocks):
            if not isinstance(block, dict) or block.get("type") != "thinking":
                continue
            text = block.get("thinking")
            if not isinstance(text, str) or block.get("signature") != thinking_signature(text):
                errors.append(
                    f"messages.{index}: invalid `signature` in `thinking` block at content.{position}"
                )
        if role == "user":
            errors.extend(_user_errors(index, blocks, messages[index - 1] if index else None))
        else:
            following = messages[index + 1] if index + 1 < len(messages) else None
            errors.extend(_assistant_errors(index, blocks, following))
    return errors


def _system_errors(index: int, messages: list[Any]) -> list[str]:
    errors: list[str] = []
    if any(b.get("type") != "text" for b in _blocks(messages[index]) if isinstance(b, dict)):
        errors.append(f"messages.{index}: a system message holds text blocks only")
    before = messages[index - 1] if index else None
    last_block = (_blocks(before) or [None])[-1] if isinstance(before, dict) else None
    server_turn = (
        isinstance(before, dict)
        and before.get("role") == "assistant"
        and isinstance(last_block, dict)
        and last_block.get("type") in ("server_tool_use", "mcp_tool_use")
    )
    if (
        index
        and not (isinstance(before, dict) and before.get("role") == "user")
        and not server_turn
    ):
        errors.append(f"messages.{index}: a system message must immediately follow a user turn")
    after = messages[index + 1] if index + 1 < len(messages) else None
    if after is not None and not (isinstance(after, dict) and after.get("role") == "assistant"):
        errors.append(
            f"messages.{index}: a system message must precede an assistant turn or end the list"
        )
    return errors


def _user_errors(index: int, blocks: list[Any], previous: Any) -> list[str]:
    results = _of_type(blocks, "tool_result")
    if not results:
        return []
    errors: list[str] = []
    kinds = [b.get("type") if isinstance(b, dict) else None for b in blocks]
    first_other = next((i for i, k in enumerate(kinds) if k != "tool_result"), len(kinds))
    if "tool_result" in kinds[first_other:]:
        errors.append(
            f"messages.{index}: `tool_result` blocks must come before any other content blocks"
        )
    offered: set[Any] = set()
    if isinstance(previous, dict) and previous.get("role") == "assistant":
        offered = {b.get("id") for b in _of_type(_blocks(previous), "tool_use")}
    unexpected = [b.get("tool_use_id") for b in results if b.get("tool_use_id") not in offered]
    if unexpected:
        errors.append(
            f"messages.{index}: unexpected `tool_use_id` found in `tool_result` blocks: "
            f"{', '.join(map(str, unexpected))}. Each `tool_result` block must have a "
            "corresponding `tool_use` block in the previous message."
        )
    return errors


def _assistant_errors(index: int, blocks: list[Any], following: Any) -> list[str]:
    uses = [b.get("id") for b in _of_type(blocks, "tool_use")]
    if not uses:
        return []
    if len(set(uses)) != len(uses):
        return [f"messages.{index}: `tool_use` ids must be unique"]
    answered: set[Any] = set()
    if isinstance(following, dict) and following.get("role") == "user":
        answered = {b.get("tool_use_id") for b in _of_type(_blocks(following), "tool_result")}
    missing = [use for use in uses if use not in answered]
    if not missing:
        return []
    return [
        f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(map(str, missing))}. Each `tool_use` block must have a corresponding "
        "`tool_result` block in the next message."
    ]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _split(text: str, parts: int = 2) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass
class FakeAnthropic:
    requests: list[Seen] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    count_calls: int = 0
    url: str = ""

    def reset(self) -> None:
        self.requests.clear()
        self.counts.clear()
        self.rejections.clear()
        self.count_calls = 0

    @property
    def last(self) -> Seen:
        return self.requests[-1]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        return app

    async def _record(self, request: web.Request) -> bytes:
        seen = await record(request)
        self.requests.append(seen)
        return seen.body

    def _refuse(self, message: str, status: int = 400) -> web.Response:
        self.rejections.append(message)
        return web.json_response(_error("invalid_request_error", message), status=status)

    @staticmethod
    def _parse(raw: bytes) -> dict[str, Any] | str:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return f"invalid JSON body: {exc}"
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return "model: Field required"
        return body

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = self._parse(await self._record(request))
        if isinstance(body, str):
            return self._refuse(f"count_tokens: {body}")
        if body["model"].startswith(NOCOUNT_PREFIX):
            return web.json_response(_error("not_found_error", "Not Found"), status=404)
        problems = anthropic_errors(body.get("messages"))
        if problems:
            return self._refuse(f"count_tokens: {problems[0]}")
        if body["model"].startswith(SLOWCOUNT_PREFIX):
            await asyncio.sleep(SLOW_COUNT_S)
            return web.json_response({"input_tokens": provider_count(body)})
        self.count_calls += 1
        return web.json_response({"input_tokens": provider_count(body)})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = self._parse(await self._record(request))
        if isinstance(body, str):
            return self._refuse(body)
        problems = anthropic_errors(body.get("messages"))
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            problems.append("max_tokens: Input should be a valid integer")
        if problems:
            return self._refuse("; ".join(problems) if len(problems) > 1 else problems[0])
        model: str = body["model"]
        count = provider_count(body)
        window = window_of(model)
        if window is not None and count > window:
            message = f"prompt is too long: {count} tokens > {window} maximum"
            if not model.startswith(STREAMERR_PREFIX):
                return self._refuse(message)
            self.rejections.append(message)
            return web.Response(
                body=_sse("error", _error("invalid_request_error", message)),
                content_type="text/event-stream",
            )
        shared = model.startswith(SHARED_PREFIX) and isinstance(max_tokens, int)
        if window is not None and shared and count + int(max_tokens or 0) > window:
            return self._refuse(
                f"input length and `max_tokens` exceed context limit: {count} + {max_tokens} > "
                f"{window}, decrease input length or `max_tokens` and try again"
            )
        self.counts.append(count)
        turn = len(self.counts)
        content, stop_reason = self._reply(body, turn)
        if body.get("stream"):
            return await self._stream(request, model, turn, count, content, stop_reason)
        return web.json_response(
            {
                "id": f"msg_{turn}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {"input_tokens": count, "output_tokens": OUTPUT_TOKENS},
            },
            headers={"request-id": f"req_fake_{turn}"},
        )

    @staticmethod
    def _reply(body: dict[str, Any], turn: int) -> tuple[list[dict[str, Any]], str]:
        names = client_tools([t.get("name", "tool") for t in body.get("tools") or []])
        if not names:
            return [{"type": "text", "text": "pong"}], "end_turn"
        thinking = f"I should look at file {turn}."
        name = names[0]
        uses = [
            {
                "type": "tool_use",
                "id": f"toolu_{turn}_{suffix}",
                "name": name,
                "input": {"path": f"src/f{turn}.py"},
            }
            for suffix in ("a", "b")
        ]
        signed = {
            "type": "thinking",
            "thinking": thinking,
            "signature": thinking_signature(thinking),
        }
        return [signed, *uses], "tool_use"

    @staticmethod
    def _events(
        model: str, turn: int, count: int, content: list[dict[str, Any]], stop_reason: str
    ) -> Iterator[bytes]:
        start = {
            "id": f"msg_{turn}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": count, "output_tokens": 1},
        }
        yield _sse("message_start", {"type": "message_start", "message": start})
        yield _sse("ping", {"type": "ping"})
        for index, block in enumerate(content):
            kind = block["type"]
            deltas: list[dict[str, Any]]
            if kind == "text":
                opening = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": t} for t in _split(block["text"])]
            elif kind == "thinking":
                opening = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [
                    {"type": "thinking_delta", "thinking": t} for t in _split(block["thinking"])
                ]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            else:
                opening = {**block, "input": {}}
                deltas = [
                    {"type": "input_json_delta", "partial_json": part}
                    for part in _split(orjson.dumps(block["input"]).decode(), 3)
                ]
            yield _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
            for delta in deltas:
                yield _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": OUTPUT_TOKENS},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})

    async def _stream(
        self,
        request: web.Request,
        model: str,
        turn: int,
        count: int,
        content: list[dict[str, Any]],
        stop_reason: str,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "request-id": f"req_fake_{turn}",
            }
        )
        await response.prepare(request)
        for event in self._events(model, turn, count, content, stop_reason):
            await response.write(event)
        await response.write_eof()
        return response
