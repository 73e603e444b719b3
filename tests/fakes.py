"""A fake OpenAI-compatible provider on 127.0.0.1, and a thread that runs servers for the tests.

The provider's behaviour is chosen by the request's model name, so one running provider serves
every test: "gated-stream", "endless-stream", "broken-stream", "tools", "error-NNN".
Faults (tests/adapters/test_faults.py), on Chat Completions and Anthropic Messages alike:
"error-NNN", "garbage" (a 200 that is not JSON), "html-page", "empty-stream", "hang" (no answer
for 30 s), and streams that stall ("stalled-stream", also on Responses and Gemini), break off
("broken-stream", a FIN), are reset ("reset-stream", an RST in the middle of an event) or never
end ("endless-stream"). `in_flight` counts the requests whose handler is still running: back to
0 means brim closed (or finished) every upstream request.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from brim.policies.tokens import TokenCounter

T = TypeVar("T")

USAGE = {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}
STREAM_PARTS = ["Hel", "lo", " wor", "ld"]
HTML_PAGE = b"<!doctype html><html><head><title>Welcome</title></head><body>Hi</body></html>"

Wire = Literal["chat", "messages"]


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: bytes


STRICT_WINDOW = 8_192


BRIM_TOOL = "brim_restore"


def client_tools(names: list[Any]) -> list[Any]:
    """The tools a fake model calls: the client's own. brim's `brim_restore` is called only by
    the fakes scripted to (a model calls it when it needs what a placeholder names)."""
    return [name for name in names if name != BRIM_TOOL]


def pairing_errors(messages: list[dict[str, Any]]) -> list[str]:
    """OpenAI's tool pairing rules, written independently of brim's dialect: after an assistant
    message with tool_calls come exactly the tool messages answering those ids; a tool message
    anywhere else is an error."""
    errors: list[str] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.get("role") == "tool":
            errors.append(f"messages[{index}]: tool message without a preceding tool call")
            index += 1
            continue
        wanted = (
            [c["id"] for c in message.get("tool_calls") or []]
            if message.get("role") == "assistant"
            else []
        )
        index += 1
        answered = []
        while index < len(messages) and messages[index].get("role") == "tool":
            answered.append(messages[index].get("tool_call_id"))
            index += 1
        if sorted(answered) != sorted(wanted):
            errors.append(f"tool calls {wanted} answered by {answered}")
    return errors


async def record(request: web.Request) -> Seen:
    """What a fake provider saw of a request: everything, body as raw bytes."""
    return Seen(
        method=request.method,
        path=request.path,
        query=request.query_string,
        headers={k.lower(): v for k, v in request.headers.items()},
        raw_headers=list(request.headers.items()),
        body=await request.read(),
    )


def gemini_errors(contents: list[dict[str, Any]]) -> list[str]:
    """Gemini's rule, apart from brim's dialect: a turn of function responses comes right after
    the model turn with as many function calls, names matching."""
    errors: list[str] = []
    for index, turn in enumerate(contents):
        names = sorted(
            p["functionResponse"]["name"] for p in turn.get("parts", []) if "functionResponse" in p
        )
        calls = (
            sorted(
                p["functionCall"]["name"]
                for p in contents[index - 1].get("parts", [])
                if "functionCall" in p
            )
            if index
            else []
        )
        if names and names != calls:
            errors.append(
                f"Please ensure that function response turn comes immediately after a function call turn (contents[{index}])."
            )
        following = contents[index + 1] if index + 1 < len(contents) else None
        own_calls = sorted(
            p["functionCall"]["name"] for p in turn.get("parts", []) if "functionCall" in p
        )
        if own_calls and (
            following is None
            or sorted(
                p["functionResponse"]["name"]
                for p in following.get("parts", [])
                if "functionResponse" in p
            )
            != own_calls
        ):
            errors.append(
                f"Please ensure that the number of function response parts is equal to the number of function call parts (contents[{index}])."
            )
    return errors


def responses_errors(items: list[dict[str, Any]]) -> list[str]:
    """OpenAI's rule for Responses input, written apart from brim's dialect: every output has an
    earlier call with its call_id, and every call has an output."""
    calls: set[str] = set()
    outputs: set[str] = set()
    errors: list[str] = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        if kind in ("function_call", "custom_tool_call", "local_shell_call"):
            calls.add(item["call_id"])
        elif kind.endswith("_call_output"):
            if item["call_id"] not in calls:
                errors.append(
                    f"input[{index}]: No tool call found for output with call_id {item['call_id']}"
                )
            outputs.add(item["call_id"])
    errors += [f"No tool output found for function call {c}." for c in sorted(calls - outputs)]
    return errors


@dataclass
class FakeProvider:
    requests: list[Seen] = field(default_factory=list)
    count_requests: list[Seen] = field(default_factory=list)  # Gemini :countTokens calls
    strict_counts: list[int] = field(default_factory=list)
    strict_rejections: list[str] = field(default_factory=list)
    tight_seen: list[tuple[str, int]] = field(default_factory=list)
    summarizer_calls: list[str] = field(default_factory=list)
    # (system prompt, text) of each summarizer call: the prompt names the level asked
    summarized: list[tuple[str, str]] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    gate_timeout_s: float = 5.0  # how long "gated-stream" waits for `gate`
    gate_timed_out: bool | None = None
    stream_closed_by_peer: threading.Event = field(default_factory=threading.Event)
    error_bodies: dict[int, bytes] = field(default_factory=dict)
    set_cookie: str | None = None  # sent with every reply, as a provider's CDN does
    failing: int | None = None  # while set, every conversation reply is this status ("error-NNN")
    in_flight: int = 0
    url: str = ""

    def reset(self) -> None:
        self.requests.clear()
        self.count_requests.clear()
        self.gate.clear()
        self.gate_timeout_s = 5.0
        self.gate_timed_out = None
        self.stream_closed_by_peer.clear()
        self.error_bodies.clear()
        self.set_cookie = None
        self.failing = None
        self.strict_counts.clear()
        self.strict_rejections.clear()
        self.tight_seen.clear()
        self.summarizer_calls.clear()
        self.summarized.clear()

    @property
    def last(self) -> Seen:
        return self.requests[-1]

    def app(self) -> web.Application:
        @web.middleware
        async def count_in_flight(request: web.Request, handler: Any) -> web.StreamResponse:
            self.in_flight += 1
            try:
                response: web.StreamResponse = await handler(request)
                return response
            finally:  # also when brim drops the connection: handler_cancellation is on
                self.in_flight -= 1

        async def cookie(request: web.Request, response: web.StreamResponse) -> None:
            if self.set_cookie is not None:
                response.headers["Set-Cookie"] = self.set_cookie

        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[count_in_flight])
        app.on_response_prepare.append(cookie)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1beta/models/{target}", self.gemini)
        app.router.add_get("/v1/models", self.models)
        return app

    async def _record(self, request: web.Request) -> bytes:
        seen = await record(request)
        self.requests.append(seen)
        return seen.body

    async def models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response(
            {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 1}]}
        )

    async def _fault(self, model: str, wire: Wire) -> web.StreamResponse | None:
        """The reply of a fault model that fails before any stream starts; None for others."""
        if self.failing is not None:
            model = f"error-{self.failing}"
        if model == "garbage":
            return web.Response(body=b"{not json at all", content_type="application/json")
        if model == "html-page":
            return web.Response(body=HTML_PAGE, content_type="text/html")
        if model == "empty-stream":  # llama.cpp's server does this on a context overflow
            return web.Response(body=b"", content_type="text/event-stream")
        if model == "hang":
            await asyncio.sleep(30)
        if model.startswith("error-"):
            status = int(model.removeprefix("error-"))
            error: dict[str, Any] = (
                {
                    "error": {
                        "message": f"fake provider says {status}",
                        "type": "fake_error",
                        "param": None,
                        "code": f"fake_{status}",
                    }
                }
                if wire == "chat"
                else {
                    "type": "error",
                    "error": {
                        "type": "overloaded_error" if status == 529 else "api_error",
                        "message": f"fake provider says {status}",
                    },
                }
            )
            return web.Response(
                status=status,
                body=self.error_bodies.get(status) or orjson.dumps(error),
                content_type="application/json",
                headers={"x-fake-error": "yes", "retry-after": "7"},
            )
        return None

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic Messages with the fault models of `chat`, in Anthropic's shapes."""
        body = orjson.loads(await self._record(request))
        model: str = body["model"]
        fault = await self._fault(model, "messages")
        if fault is not None:
            return fault
        if model.startswith("summarizer-"):
            text = body["messages"][0]["content"]
            summary = self._summary(model, body["system"], text, body["max_tokens"])
            if summary is None:
                error = {"type": "api_error", "message": "down"}
                return web.json_response({"type": "error", "error": error}, status=500)
            reply = {
                "id": "msg_summary",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": summary}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 17, "output_tokens": 5},
            }
            return web.json_response(reply)
        if body.get("stream"):
            return await self._stream(request, model, body, "messages")
        return web.json_response(
            {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "pong"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 17, "output_tokens": 5},
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await self._record(request))
        model: str = body["model"]
        fault = await self._fault(model, "chat")
        if fault is not None:
            return fault
        if model.startswith("strict-"):
            return self._strict(body)
        if model.startswith("summarizer-"):
            return await self._summarize(body, model)
        if model.split("-")[0] in ("tight", "vague", "streamtight"):
            refusal = self._tight(body, model)
            if refusal is not None:
                return refusal
        if body.get("stream"):
            return await self._stream(request, model, body)
        message: dict[str, Any] = {"role": "assistant", "content": "pong"}
        finish = "stop"
        if model == "tools":
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_42",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            }
            finish = "tool_calls"
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1700000000,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": USAGE,
            },
            headers={"x-upstream-header": "kept", "openai-processing-ms": "12"},
        )

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI Responses. resp-N has an N-token window; respstream-N refuses inside a 200
        stream (`response.failed`), the way the real API can."""
        body = orjson.loads(await self._record(request))
        model: str = body["model"]
        if model == "stalled-stream":
            return await self._stall(
                request,
                [
                    {"type": "response.created", "response": {"id": "resp_s", "output": []}},
                    {"type": "response.in_progress", "response": {"id": "resp_s", "output": []}},
                    {"type": "response.output_text.delta", "item_id": "m", "delta": "first"},
                ],
            )
        if model.startswith("summarizer-"):
            return self._responses_summary(body, model)
        items = body.get("input") or []
        problems = responses_errors(items if isinstance(items, list) else [])
        if problems:
            self.strict_rejections.append("; ".join(problems))
            return web.json_response(
                {
                    "error": {
                        "message": problems[0],
                        "type": "invalid_request_error",
                        "param": "input",
                        "code": None,
                    }
                },
                status=400,
            )
        tokens = counted("openai.responses", body)
        window = (
            int(model.split("-")[1]) if "-" in model and model.split("-")[1].isdigit() else None
        )
        if window is not None and tokens > window:
            self.tight_seen.append((model, tokens))
            error = {
                "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }
            if model.startswith("respstream-"):
                created = {
                    "type": "response.created",
                    "sequence_number": 0,
                    "response": {
                        "id": "resp_x",
                        "object": "response",
                        "status": "in_progress",
                        "model": model,
                        "output": [],
                    },
                }
                failed = {
                    "type": "response.failed",
                    "sequence_number": 1,
                    "response": {
                        "id": "resp_x",
                        "object": "response",
                        "status": "failed",
                        "model": model,
                        "output": [],
                        "error": error,
                    },
                }
                text = (
                    b"event: response.created\ndata: "
                    + orjson.dumps(created)
                    + b"\n\nevent: response.failed\ndata: "
                    + orjson.dumps(failed)
                    + b"\n\n"
                )
                return web.Response(body=text, content_type="text/event-stream")
            return web.json_response({"error": error}, status=400)
        self.tight_seen.append((model, tokens))
        self.strict_counts.append(tokens)
        turn = len(self.strict_counts)
        if client_tools([t.get("name") for t in body.get("tools") or []]):
            output: list[dict[str, Any]] = [
                {
                    "type": "function_call",
                    "id": f"fc_{turn}",
                    "call_id": f"call_{turn}",
                    "name": client_tools([t["name"] for t in body["tools"]])[0],
                    "arguments": orjson.dumps({"cmd": f"cat f{turn}.py"}).decode(),
                    "status": "completed",
                }
            ]
        else:
            output = [
                {
                    "type": "message",
                    "id": f"msg_{turn}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "pong", "annotations": []}],
                }
            ]
        response = {
            "id": f"resp_{turn}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {"input_tokens": tokens, "output_tokens": 5, "total_tokens": tokens + 5},
        }
        if not body.get("stream"):
            return web.json_response(response)
        events = [
            {
                "type": "response.created",
                "response": {**response, "status": "in_progress", "output": []},
            },
            {"type": "response.output_item.added", "output_index": 0, "item": output[0]},
            *(
                [
                    {
                        "type": "response.output_text.delta",
                        "item_id": output[0]["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "delta": "pong",
                    }
                ]
                if output[0]["type"] == "message"
                else []
            ),
            {"type": "response.output_item.done", "output_index": 0, "item": output[0]},
            {"type": "response.completed", "response": response},
        ]
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for number, event in enumerate(events):
            await stream.write(
                f"event: {event['type']}\ndata: ".encode()
                + orjson.dumps({**event, "sequence_number": number})
                + b"\n\n"
            )
        await stream.write_eof()
        return stream

    def _responses_summary(self, body: dict[str, Any], model: str) -> web.Response:
        """A summary asked on the Responses API (`_summary`)."""
        (item,) = body["input"]
        summary = self._summary(
            model, body["instructions"], item["content"], body["max_output_tokens"]
        )
        if summary is None:
            error = {"message": "down", "type": "server_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=500)
        text = {"type": "output_text", "text": summary, "annotations": []}
        output = {
            "type": "message",
            "id": "msg_s",
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }
        return web.json_response(
            {
                "id": "resp_s",
                "object": "response",
                "status": "completed",
                "model": model,
                "output": [output],
            }
        )

    def _gemini_summary(self, body: dict[str, Any], model: str) -> web.Response:
        """A summary asked on Gemini's generateContent (`_summary`); a thought part first, as a
        thinking model sends one, which is not the answer."""
        system = body["systemInstruction"]["parts"][0]["text"]
        text = body["contents"][0]["parts"][0]["text"]
        summary = self._summary(model, system, text, body["generationConfig"]["maxOutputTokens"])
        if summary is None:
            error = {"code": 500, "message": "down", "status": "INTERNAL"}
            return web.json_response({"error": error}, status=500)
        parts = [{"text": "Let me think about it.", "thought": True}, {"text": summary}]
        candidate = {
            "content": {"role": "model", "parts": parts},
            "finishReason": "STOP",
            "index": 0,
        }
        return web.json_response({"candidates": [candidate]})

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        """Gemini. gem-N has an N-token window and says so in its error, as Gemini does;
        gemstream-N refuses inside a 200 stream. `:countTokens` takes `contents` or a
        `generateContentRequest`, and is recorded in `count_requests` (not `requests`); for
        gemnocount-N it answers 404, for gemslowcount-N only after 3 s; gemscaledPP-N counts
        PP % of brim's own count (a tokenizer that differs from brim's)."""
        model, _, method = request.match_info["target"].rpartition(":")
        if method == "countTokens":
            seen = await record(request)
            self.count_requests.append(seen)
            body = orjson.loads(seen.body)
        else:
            body = orjson.loads(await self._record(request))
        if model == "stalled-stream":
            parts = [{"text": "first"}]
            return await self._stall(
                request, [{"candidates": [{"content": {"role": "model", "parts": parts}}]}]
            )
        if model.startswith("summarizer-") and method == "generateContent":
            return self._gemini_summary(body, model)
        if method == "countTokens" and isinstance(body.get("generateContentRequest"), dict):
            body = body["generateContentRequest"]
        tokens = counted("gemini.generate", body)
        if model.startswith("gemscaled"):
            tokens = tokens * int(model.split("-")[0].removeprefix("gemscaled")) // 100
        if method == "countTokens":
            if model.startswith("gemnocount-"):
                error = {"code": 404, "message": "Not found", "status": "NOT_FOUND"}
                return web.json_response({"error": error}, status=404)
            if model.startswith("gemslowcount-"):
                await asyncio.sleep(3)
            return web.json_response({"totalTokens": tokens})
        problems = gemini_errors(body.get("contents") or [])
        if problems:
            self.strict_rejections.append("; ".join(problems))
            return web.json_response(
                {"error": {"code": 400, "message": problems[0], "status": "INVALID_ARGUMENT"}},
                status=400,
            )
        window = int(model.split("-")[1]) if model.split("-")[-1].isdigit() else None
        self.tight_seen.append((model, tokens))
        if window is not None and tokens > window:
            error = {
                "error": {
                    "code": 400,
                    "message": f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window}).",
                    "status": "INVALID_ARGUMENT",
                }
            }
            if model.startswith("gemstream-"):
                return web.Response(
                    body=b"data: " + orjson.dumps(error) + b"\r\n\r\n",
                    content_type="text/event-stream",
                )
            return web.json_response(error, status=400)
        self.strict_counts.append(tokens)
        turn = len(self.strict_counts)
        declared = [
            d.get("name")
            for t in body.get("tools") or []
            for d in t.get("functionDeclarations", [])
        ]
        if client_tools(declared):
            name = client_tools(declared)[0]
            parts: list[dict[str, Any]] = [
                {"text": "Let me look.", "thought": True, "thoughtSignature": f"sig{turn}"},
                {"functionCall": {"name": name, "args": {"path": f"f{turn}.py"}}},
            ]
        else:
            parts = [{"text": "pong"}]
        reply = {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": tokens,
                "candidatesTokenCount": 3,
                "totalTokenCount": tokens + 3,
            },
            "modelVersion": model,
        }
        if method != "streamGenerateContent":
            return web.json_response(reply)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(b"data: " + orjson.dumps(reply) + b"\r\n\r\n")
        await stream.write_eof()
        return stream

    async def _stall(
        self, request: web.Request, events: list[dict[str, Any]]
    ) -> web.StreamResponse:
        """A stream that sends `events` (Responses-style when they have a type), then stalls."""
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        for number, event in enumerate(events):
            data = orjson.dumps({**event, "sequence_number": number} if "type" in event else event)
            kind = f"event: {event['type']}\n".encode() if "type" in event else b""
            await stream.write(kind + b"data: " + data + b"\n\n")
        await asyncio.sleep(5)
        return stream

    def _summary(self, model: str, system: str, text: str, max_tokens: int) -> str | None:
        """summarizer-good keeps FACT lines and the first words; summarizer-verbose ignores the
        first level asked; summarizer-down always fails (None). On every wire API."""
        self.summarizer_calls.append(model)
        if model == "summarizer-down":
            return None
        self.summarized.append((system, text))
        if model == "summarizer-verbose" and "Condense" in system:
            return text
        facts = [line for line in text.splitlines() if "FACT" in line]
        words = text.split()[: max(8, max_tokens // 4)]
        return "\n".join([*facts, " ".join(words)])

    async def _summarize(self, body: dict[str, Any], model: str) -> web.Response:
        """A summary asked on Chat Completions (`_summary`)."""
        system, text = body["messages"][0]["content"], body["messages"][1]["content"]
        summary = self._summary(model, system, text, body["max_tokens"])
        if summary is None:
            return web.json_response(
                {"error": {"message": "down", "type": "server_error"}}, status=500
            )
        message = {"role": "assistant", "content": summary}
        return web.json_response(
            {
                "id": "s",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )

    def _tight(self, body: dict[str, Any], model: str) -> web.StreamResponse | None:
        """Models whose real window (the number in the name) is smaller than brim believes.
        tight-N states its window in the error; vague-N does not; streamtight-N refuses in the
        first event of a 200 stream. Returns None when the request fits."""
        kind, window = model.split("-")[0], int(model.split("-")[1])
        tokens = counted("openai.chat", body)
        self.tight_seen.append((model, tokens))
        if tokens <= window:
            return None
        if kind == "vague":
            error = {
                "message": "Request too large for this model.",
                "type": "invalid_request_error",
                "param": None,
                "code": "context_length_exceeded",
            }
        else:
            error = {
                "message": f"This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        if kind == "streamtight":
            return web.Response(
                body=b"data: " + orjson.dumps({"error": error}) + b"\n\n",
                content_type="text/event-stream",
            )
        return web.json_response({"error": error}, status=400)

    def _strict(self, body: dict[str, Any]) -> web.Response:
        """A provider with an 8k window that refuses what OpenAI refuses, as OpenAI does."""
        problems = pairing_errors(body["messages"])
        if problems:
            self.strict_rejections.append("; ".join(problems))
            return web.json_response(
                {
                    "error": {
                        "message": "Invalid parameter: " + problems[0],
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": None,
                    }
                },
                status=400,
            )
        tokens = counted("openai.chat", body)
        wanted = body.get("max_tokens") or 0
        if tokens + wanted > STRICT_WINDOW:
            self.strict_rejections.append(f"{tokens} + {wanted} > {STRICT_WINDOW}")
            return web.json_response(
                {
                    "error": {
                        "message": f"This model's maximum context length is {STRICT_WINDOW} tokens. However, you requested {tokens + wanted} tokens ({tokens} in the messages, {wanted} in the completion).",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                },
                status=400,
            )
        self.strict_counts.append(tokens)
        turn = len(self.strict_counts)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f"Reading the next file (step {turn}).",
            "tool_calls": [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": orjson.dumps({"path": f"src/module_{turn}.py"}).decode(),
                    },
                }
            ],
        }
        return web.json_response(
            {
                "id": f"chatcmpl-{turn}",
                "object": "chat.completion",
                "created": 1700000000,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {
                    "prompt_tokens": tokens,
                    "completion_tokens": 20,
                    "total_tokens": tokens + 20,
                },
            }
        )

    @staticmethod
    def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    @staticmethod
    def _event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"

    def _text(self, wire: Wire, model: str, text: str) -> bytes:
        if wire == "chat":
            return self._chunk(model, {"content": text})
        delta = {"type": "text_delta", "text": text}
        return self._event("content_block_delta", {"index": 0, "delta": delta})

    def _opening(self, wire: Wire, model: str) -> bytes:
        if wire == "chat":
            return self._chunk(model, {"role": "assistant", "content": ""})
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 17, "output_tokens": 1},
        }
        block = {"type": "text", "text": ""}
        return self._event("message_start", {"message": message}) + self._event(
            "content_block_start", {"index": 0, "content_block": block}
        )

    def _closing(self, wire: Wire, model: str, body: dict[str, Any]) -> bytes:
        if wire == "messages":
            return (
                self._event("content_block_stop", {"index": 0})
                + self._event(
                    "message_delta",
                    {
                        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                        "usage": {"output_tokens": 5},
                    },
                )
                + self._event("message_stop", {})
            )
        closing = self._chunk(model, {}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage_chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [],
                "usage": USAGE,
            }
            closing += b"data: " + orjson.dumps(usage_chunk) + b"\n\n"
        return closing + b"data: [DONE]\n\n"

    async def _stream(
        self, request: web.Request, model: str, body: dict[str, Any], wire: Wire = "chat"
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(self._opening(wire, model))
            if model == "endless-stream":
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    await response.write(self._text(wire, model, "."))
                    await asyncio.sleep(0.02)
                return response
            if model == "firehose":  # 200 MB as fast as the reader lets it go
                block = self._text(wire, model, "x" * 65_000)
                for _ in range(3_200):
                    await response.write(block)
                return response
            if model == "stalled-stream":
                await response.write(self._text(wire, model, "first"))
                await asyncio.sleep(5)
                return response
            if model in ("broken-stream", "reset-stream"):
                await response.write(self._text(wire, model, "partial"))
                assert request.transport is not None
                if model == "reset-stream":  # cut inside the next event, with an RST
                    await response.write(self._text(wire, model, "never seen")[:20])
                    await asyncio.sleep(0.05)
                    sock = request.transport.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    request.transport.abort()
                else:
                    await asyncio.sleep(0.05)
                    request.transport.close()
                return response
            for index, part in enumerate(STREAM_PARTS):
                await response.write(self._text(wire, model, part))
                if model == "gated-stream" and index == 0:
                    opened = await asyncio.get_running_loop().run_in_executor(
                        None, self.gate.wait, self.gate_timeout_s
                    )
                    self.gate_timed_out = not opened
            await response.write(self._closing(wire, model, body))
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.stream_closed_by_peer.set()
            raise
        return response


@functools.cache
def token_counter() -> TokenCounter:
    """brim's own token counter, built on first use (on the tiktoken files litellm bundles):
    the one every fake provider counts requests with."""
    from brim.policies.tokens import TokenCounter
    from brim.proxy.resources import use_bundled_tiktoken_files

    use_bundled_tiktoken_files()
    return TokenCounter()


def counted(api: str, body: dict[str, Any], tokenizer: str = "o200k_base") -> int:
    """A request's tokens by `token_counter`: `api` is the wire API's name ("openai.chat")."""
    from brim.policies.wires import WIRES

    return token_counter().request(WIRES[api], body, tokenizer).total


class LoopThread:
    """An asyncio loop in a daemon thread: servers live here while sync tests block on clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


async def start_app(app: web.Application, **runner_kwargs: Any) -> tuple[web.AppRunner, str]:
    # Fake providers keep no access log: their lines (with forwarded query keys) are not brim's.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    return runner, f"http://127.0.0.1:{port}"


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def free_port() -> int:
    """A port nothing listens on (now)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
