"""A fake provider of all four wire APIs whose tokenizer is not brim's: it answers every request
with "pong" and reports the request's input tokens as `ratio` × brim's own count of what it
received in o200k_base (`tests.fakes.counted`) — or, with `absurd` set, that figure instead;
`by_key` gives some credentials (the key a client sent) a ratio of their own.
Streamed and whole replies alike (Chat's usage chunk, Messages' `message_start` with part of the
input as cache reads and writes, Responses' `response.completed`, Gemini's last chunk). It keeps
each request's reported count in `reported`, in order.

`send` asks one question on any of the four APIs through its clients' own SDK."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import orjson
from aiohttp import web

from tests.fakes import counted


def send(
    api: str,
    base: str,
    model: str,
    content: str,
    *,
    stream: bool = False,
    headers: dict[str, str] | None = None,
    key: str | None = None,
) -> httpx.Headers:
    """One user message to brim at `base` through the API's own client, with the client's
    provider key `key` (else a test key of the API's form), a stream read to its end (its
    usage comes last); the reply's headers."""
    extra = headers or {}
    raw: Any
    if api == "openai.chat":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key or "sk-test", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            stream=stream,
            extra_headers=extra,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
    elif api == "openai.responses":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key or "sk-test", max_retries=0)
        raw = client.responses.with_raw_response.create(
            model=model, input=content, stream=stream, extra_headers=extra
        )
    elif api == "anthropic.messages":
        claude = anthropic.Anthropic(
            base_url=base, api_key=key or "sk-ant-test", max_retries=0, timeout=120
        )
        raw = claude.messages.with_raw_response.create(
            model=model,
            max_tokens=1_000,
            messages=[{"role": "user", "content": content}],
            stream=stream,
            extra_headers=extra,
        )
    else:  # Gemini's SDK is not among the test tools: plain HTTP, as any client sends it
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        reply = httpx.post(
            f"{base}/v1beta/models/{model}:{method}",
            json={"contents": [{"role": "user", "parts": [{"text": content}]}]},
            headers={"x-goog-api-key": key or "test-key", **extra},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        return reply.headers
    parsed = raw.parse()
    if stream:
        for _ in parsed:
            pass
    return raw.headers  # type: ignore[no-any-return]


@dataclass
class UsageProvider:
    ratio: float = 1.5
    absurd: int | None = None  # reported whatever was sent
    by_key: dict[str, float] = field(default_factory=dict)  # a credential's own ratio
    reported: list[int] = field(default_factory=list)
    url: str = ""

    def reset(self, ratio: float = 1.5) -> None:
        """Report `ratio` × brim's count for every client again, and forget what it reported."""
        self.ratio, self.absurd = ratio, None
        self.by_key.clear()
        self.reported.clear()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1beta/models/{target}", self.gemini)
        return app

    def _input(self, api: str, body: dict[str, Any], request: web.Request) -> int:
        headers = request.headers
        bearer = headers.get("Authorization", "").removeprefix("Bearer ")
        key = headers.get("x-api-key") or headers.get("x-goog-api-key") or bearer
        ratio = self.by_key.get(key, self.ratio)
        tokens = self.absurd if self.absurd is not None else round(ratio * counted(api, body))
        self.reported.append(tokens)
        return tokens

    @staticmethod
    async def _sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for event in events:
            await stream.write(event)
        await stream.write_eof()
        return stream

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        tokens = self._input("openai.chat", body, request)
        usage = {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
        head = {"id": "c", "object": "chat.completion", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "pong"}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({**head, "choices": [choice], "usage": usage})
        chunk = {**head, "object": "chat.completion.chunk"}
        delta = {"index": 0, "delta": {"role": "assistant", "content": "pong"}}
        events = [
            {**chunk, "choices": [{**delta, "finish_reason": None}], "usage": None},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**chunk, "choices": [], "usage": usage},
        ]
        return await self._sse(
            request, [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
        )

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        tokens = self._input("anthropic.messages", body, request)
        # Anthropic splits the input three ways; their sum is the request's.
        read, written = tokens // 3, tokens // 4
        usage = {
            "input_tokens": tokens - read - written,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
            "output_tokens": 1,
        }
        message = {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "stop_sequence": None,
        }
        if not body.get("stream"):
            text = [{"type": "text", "text": "pong"}]
            reply = {**message, "content": text, "stop_reason": "end_turn", "usage": usage}
            return web.json_response(reply)
        opened = {**message, "content": [], "stop_reason": None, "usage": usage}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"message": opened}),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "pong"}}),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
            ),
            ("message_stop", {}),
        ]
        return await self._sse(
            request,
            [
                f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"
                for kind, data in events
            ],
        )

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        tokens = self._input("openai.responses", body, request)
        text = {"type": "output_text", "text": "pong", "annotations": []}
        item = {"type": "message", "id": "m", "role": "assistant", "content": [text]}
        response = {
            "id": "r",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body["model"],
            "output": [{**item, "status": "completed"}],
            "usage": {"input_tokens": tokens, "output_tokens": 1, "total_tokens": tokens + 1},
        }
        if not body.get("stream"):
            return web.json_response(response)
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [
            {"type": "response.created", "response": started},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": response},
        ]
        return await self._sse(
            request,
            [
                f"event: {e['type']}\ndata: ".encode()
                + orjson.dumps({**e, "sequence_number": n})
                + b"\n\n"
                for n, e in enumerate(events)
            ],
        )

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        _, _, method = request.match_info["target"].rpartition(":")
        body = orjson.loads(await request.read())
        tokens = self._input("gemini.generate", body, request)
        candidate = {"content": {"role": "model", "parts": [{"text": "pong"}]}, "index": 0}
        usage = {"promptTokenCount": tokens, "candidatesTokenCount": 1}
        reply = {"candidates": [{**candidate, "finishReason": "STOP"}], "usageMetadata": usage}
        if method != "streamGenerateContent":
            return web.json_response(reply)
        first = {"candidates": [candidate]}
        return await self._sse(
            request, [b"data: " + orjson.dumps(chunk) + b"\r\n\r\n" for chunk in (first, reply)]
        )
