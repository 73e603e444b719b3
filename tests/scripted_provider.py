"""A fake provider that plays one coding-agent session, for driving the real CLIs.

`ScriptedProvider` listens on 127.0.0.1 and speaks the four wire APIs the CLIs use — Anthropic
Messages (Claude Code), OpenAI Responses (Codex), OpenAI Chat Completions (opencode) and Gemini
(Gemini CLI), streaming or not. Each turn that offers the CLI's file-reading tool is answered
with a call of that tool for the next big file, until `reads` files were asked for; then with
the final text. Requests that do not offer the tool (titles, checks) get a short text.

Like a real provider it refuses, in that API's own words, a request over the model's window (the
number after the model name's last dash, counted as the shared fakes count: brim's counter,
o200k_base, Anthropic's with brim's Claude estimate) and a request whose tool calls and results
are not paired (the checkers of tests/fakes.py and tests/fake_anthropic.py, written apart from
brim's dialects). It records everything it saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fake_anthropic import anthropic_errors, token_count, window_of
from tests.fakes import Seen, counted, gemini_errors, pairing_errors, record, responses_errors

OUTPUT_TOKENS = 12
OPENAI_RESPONSES_OVERFLOW = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


@dataclass
class Call:
    """One generation request the provider answered (or refused)."""

    api: str  # "messages", "responses", "chat", "gemini"
    model: str
    tokens: int
    body: dict[str, Any]
    main: bool  # it offered the reading tool: a turn of the scripted session
    reply: str  # "read N", "final", "text", "overflow", "invalid"


@dataclass
class ScriptedProvider:
    """One agent session, scripted: while it has fewer than `reads` reads answered it asks for
    the next file with the CLI's `tool` (arguments from `arguments(step)`), then it says `final`.
    Requests without the tool (titles, checks) get a short text. Every request is counted with
    brim's own counter (o200k_base; Anthropic's with brim's Claude estimate), as the shared
    fakes count."""

    tool: str
    arguments: Callable[[int], dict[str, Any]]
    reads: int
    final: str
    calls: list[Call] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    overflows: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    unknown_paths: list[str] = field(default_factory=list)
    steps: int = 0
    url: str = ""

    @property
    def main_calls(self) -> list[Call]:
        return [c for c in self.calls if c.main and c.reply not in ("overflow", "invalid")]

    def max_tokens_seen(self) -> int:
        return max((c.tokens for c in self.calls), default=0)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1beta/models/{target}", self.gemini)
        app.router.add_route("*", "/{tail:.*}", self.unknown)
        return app

    async def unknown(self, request: web.Request) -> web.Response:
        self.seen.append(await record(request))
        self.unknown_paths.append(f"{request.method} {request.path}")
        return web.json_response({"error": {"message": f"no route {request.path}"}}, status=404)

    def _admit(
        self, api: str, model: str, body: dict[str, Any], offered: bool, problems: list[str]
    ) -> Call:
        """Count and check one generation request and choose its answer: `reply` is "invalid"
        (a pairing problem, in `rejections`), "overflow" (over the window, in `overflows`),
        "read N", "final" or "text"."""
        call = Call(api, model, _count(api, body), body, offered, "")
        self.calls.append(call)
        window = window_of(model)
        if problems:
            call.reply = "invalid"
            self.rejections.append(f"{api}: {'; '.join(problems)}")
        elif window is not None and call.tokens > window:
            call.reply = "overflow"
            self.overflows.append(f"{api} {model}: {call.tokens} > {window}")
        elif not offered:
            call.reply = "text"
        elif self.steps < self.reads:
            self.steps += 1
            call.reply = f"read {self.steps}"
        else:
            call.reply = "final"
        return call

    @staticmethod
    def _step(call: Call) -> int | None:
        return int(call.reply.split()[1]) if call.reply.startswith("read ") else None

    def _text_of(self, call: Call) -> str:
        return self.final if call.reply == "final" else "ok"

    def _problem(self, call: Call) -> str:
        return self.rejections[-1].split(": ", 1)[1] if call.reply == "invalid" else ""

    async def _reply_instead(self, request: web.Request, call: Call) -> web.StreamResponse | None:
        """A subclass's own reply to a request that was admitted (not refused), or None for the
        session's."""
        return None

    # -- Anthropic Messages -------------------------------------------------------------------

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = await self._body(request)  # recorded in `seen`, as Gemini's countTokens is
        return web.json_response({"input_tokens": token_count(body)})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = str(body.get("model"))
        offered = self.tool in tool_names("messages", body)
        problems = anthropic_errors(body.get("messages"))  # role "system" ones too, where placed
        call = self._admit("messages", model, body, offered, problems)
        if call.reply in ("invalid", "overflow"):
            message = (
                f"prompt is too long: {call.tokens} tokens > {window_of(model)} maximum"
                if call.reply == "overflow"
                else self._problem(call)
            )
            error = {"type": "invalid_request_error", "message": message}
            return web.json_response({"type": "error", "error": error}, status=400)
        if (instead := await self._reply_instead(request, call)) is not None:
            return instead
        step = self._step(call)
        content: list[dict[str, Any]] = [
            {"type": "text", "text": f"Reading file {step}." if step else self._text_of(call)}
        ]
        if step:
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_read_{step}",
                    "name": self.tool,
                    "input": self.arguments(step),
                }
            )
        reply: dict[str, Any] = {
            "id": f"msg_{len(self.calls)}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "tool_use" if step else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": call.tokens, "output_tokens": OUTPUT_TOKENS},
        }
        if not body.get("stream"):
            return web.json_response(reply)
        return await _sse_reply(request, _anthropic_events(reply))

    # -- OpenAI Responses ---------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = str(body.get("model"))
        items = body.get("input")
        offered = self.tool in tool_names("responses", body)
        problems = responses_errors(items) if isinstance(items, list) else []
        call = self._admit("responses", model, body, offered, problems)
        if call.reply in ("invalid", "overflow"):
            overflow = call.reply == "overflow"
            error = {
                "message": OPENAI_RESPONSES_OVERFLOW if overflow else self._problem(call),
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded" if overflow else None,
            }
            return web.json_response({"error": error}, status=400)
        if (instead := await self._reply_instead(request, call)) is not None:
            return instead
        number, step = len(self.calls), self._step(call)
        output: dict[str, Any]
        if step:
            output = {
                "type": "function_call",
                "id": f"fc_{number}",
                "call_id": f"call_read_{step}",
                "name": self.tool,
                "arguments": orjson.dumps(self.arguments(step)).decode(),
                "status": "completed",
            }
        else:
            text = {"type": "output_text", "text": self._text_of(call), "annotations": []}
            output = {
                "type": "message",
                "id": f"msg_{number}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        response = {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": model,
            "output": [output],
            "usage": {
                "input_tokens": call.tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": OUTPUT_TOKENS,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": call.tokens + OUTPUT_TOKENS,
            },
        }
        if not body.get("stream"):
            return web.json_response(response)
        return await _sse_reply(request, _responses_events(response))

    # -- OpenAI Chat Completions --------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model = str(body.get("model"))
        offered = self.tool in tool_names("chat", body)
        problems = pairing_errors(body.get("messages") or [])
        call = self._admit("chat", model, body, offered, problems)
        if call.reply in ("invalid", "overflow"):
            overflow = call.reply == "overflow"
            error = {
                "message": f"This model's maximum context length is {window_of(model)} tokens. However, your messages resulted in {call.tokens} tokens. Please reduce the length of the messages."
                if overflow
                else f"Invalid parameter: {self._problem(call)}",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded" if overflow else None,
            }
            return web.json_response({"error": error}, status=400)
        if (instead := await self._reply_instead(request, call)) is not None:
            return instead
        step = self._step(call)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f"Reading file {step}." if step else self._text_of(call),
        }
        if step:
            arguments = orjson.dumps(self.arguments(step)).decode()
            function = {"name": self.tool, "arguments": arguments}
            message["tool_calls"] = [
                {"id": f"call_read_{step}", "type": "function", "function": function}
            ]
        reply = {
            "id": f"chatcmpl-{len(self.calls)}",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if step else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": call.tokens,
                "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": call.tokens + OUTPUT_TOKENS,
            },
        }
        if not body.get("stream"):
            return web.json_response(reply)
        return await _sse_reply(request, _chat_events(reply))

    # -- Gemini -------------------------------------------------------------------------------

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        model, _, method = request.match_info["target"].rpartition(":")
        if method == "countTokens":
            inner = body.get("generateContentRequest") or body
            return web.json_response({"totalTokens": _count("gemini", inner)})
        offered = self.tool in tool_names("gemini", body)
        problems = gemini_errors(body.get("contents") or [])
        call = self._admit("gemini", model, body, offered, problems)
        if call.reply in ("invalid", "overflow"):
            message = (
                f"The input token count ({call.tokens}) exceeds the maximum number of tokens allowed ({window_of(model)})."
                if call.reply == "overflow"
                else self._problem(call)
            )
            error = {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}
            return web.json_response({"error": error}, status=400)
        if (instead := await self._reply_instead(request, call)) is not None:
            return instead
        step = self._step(call)
        parts: list[dict[str, Any]] = [
            {"text": f"Reading file {step}." if step else self._text_of(call)}
        ]
        if step:
            parts.append({"functionCall": {"name": self.tool, "args": self.arguments(step)}})
        candidate = {"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}
        reply = {
            "candidates": [{**candidate, "index": 0}],
            "usageMetadata": {
                "promptTokenCount": call.tokens,
                "candidatesTokenCount": OUTPUT_TOKENS,
                "totalTokenCount": call.tokens + OUTPUT_TOKENS,
            },
            "modelVersion": model,
        }
        if method != "streamGenerateContent":
            return web.json_response(reply)
        return await _sse_reply(request, [b"data: " + orjson.dumps(reply) + b"\r\n\r\n"])

    async def _body(self, request: web.Request) -> dict[str, Any]:
        seen = await record(request)
        self.seen.append(seen)
        body = orjson.loads(seen.body)
        assert isinstance(body, dict), f"{request.path}: the body is not a JSON object"
        return body


def tool_names(api: str, body: dict[str, Any]) -> list[str]:
    """The names of the tools a request offers, in order, repeats kept (`api`: the provider's
    name of its API)."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if api == "chat":
        return [str((t.get("function") or {}).get("name")) for t in tools]
    if api == "gemini":
        return [
            str(declaration.get("name"))
            for tool in tools
            for declaration in tool.get("functionDeclarations") or []
            if isinstance(declaration, dict)
        ]
    return [str(t.get("name")) for t in tools]


@dataclass
class ToolUse:
    """A call of one tool in a request's conversation, and the result that answers it (None
    when nothing answers it), as text."""

    arguments: dict[str, Any]
    result: str | None


def tool_uses(api: str, body: dict[str, Any], tool: str) -> list[ToolUse]:
    """Every call of `tool` in a request, oldest first, each with its answer: matched by id
    (Anthropic's tool_use_id, Responses' and Chat's call ids) or, for Gemini, which has no ids,
    by name in the turn that follows."""
    found: list[ToolUse] = []
    if api == "messages":
        messages = body.get("messages") or []
        for index, message in enumerate(messages):
            if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
                continue
            following = messages[index + 1] if index + 1 < len(messages) else {}
            answers = following.get("content") if isinstance(following, dict) else None
            results = {
                block.get("tool_use_id"): _text(block.get("content"))
                for block in (answers if isinstance(answers, list) else [])
                if isinstance(block, dict) and block.get("type") == "tool_result"
            }
            for block in message["content"]:
                if block.get("type") == "tool_use" and block.get("name") == tool:
                    found.append(ToolUse(block.get("input") or {}, results.get(block.get("id"))))
    elif api == "responses":
        items = [i for i in body.get("input") or [] if isinstance(i, dict)]
        outputs = {
            i.get("call_id"): _text(i.get("output"))
            for i in items
            if i.get("type") == "function_call_output"
        }
        for item in items:
            if item.get("type") == "function_call" and item.get("name") == tool:
                arguments = orjson.loads(item.get("arguments") or "{}")
                found.append(ToolUse(arguments, outputs.get(item.get("call_id"))))
    elif api == "chat":
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        answers = {
            m.get("tool_call_id"): _text(m.get("content"))
            for m in messages
            if m.get("role") == "tool"
        }
        for message in messages:
            for tool_call in message.get("tool_calls") or []:
                function = tool_call.get("function") or {}
                if function.get("name") == tool:
                    arguments = orjson.loads(function.get("arguments") or "{}")
                    found.append(ToolUse(arguments, answers.get(tool_call.get("id"))))
    else:
        contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
        for index, turn in enumerate(contents):
            following = contents[index + 1] if index + 1 < len(contents) else {}
            responses = [
                p["functionResponse"]
                for p in following.get("parts") or []
                if isinstance(p, dict) and "functionResponse" in p
            ]
            for part in turn.get("parts") or []:
                if "functionCall" in part and part["functionCall"].get("name") == tool:
                    answer = next((r for r in responses if r.get("name") == tool), None)
                    if answer is not None:
                        responses.remove(answer)
                    text = None if answer is None else _text(answer.get("response"))
                    found.append(ToolUse(part["functionCall"].get("args") or {}, text))
    return found


def _text(content: Any) -> str:
    """A tool result's content as one string: text as it is, anything else as JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, dict) and isinstance(b.get("text"), str) for b in content
    ):
        return "".join(b["text"] for b in content)
    return orjson.dumps(content).decode()


WIRE_OF = {
    "messages": "anthropic.messages",
    "responses": "openai.responses",
    "chat": "openai.chat",
    "gemini": "gemini.generate",
}  # the provider's name of each API → brim's


def _count(api: str, body: dict[str, Any]) -> int:
    """A request's tokens as the shared fakes count them: brim's own counter, o200k_base
    (Anthropic's: brim's Claude estimate, `tests.fake_anthropic.token_count`)."""
    if api == "messages":
        return token_count(body)
    return counted(WIRE_OF[api], body)


async def stream_in_pieces(request: web.Request, stream: bytes) -> web.StreamResponse:
    """A whole event stream sent 97 bytes at a time: events split across reads."""
    return await _sse_reply(request, [stream[at : at + 97] for at in range(0, len(stream), 97)])


async def _sse_reply(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def _anthropic_events(message: dict[str, Any]) -> list[bytes]:
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events = [_event("message_start", {"message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(block["input"]).decode(),
            }
        events += [
            _event("content_block_start", {"index": index, "content_block": opening}),
            _event("content_block_delta", {"index": index, "delta": delta}),
            _event("content_block_stop", {"index": index}),
        ]
    return [
        *events,
        _event(
            "message_delta",
            {
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        ),
        _event("message_stop", {}),
    ]


def _responses_events(response: dict[str, Any]) -> list[bytes]:
    item = response["output"][0]
    opening = {**item, "status": "in_progress"}
    middle: list[tuple[str, dict[str, Any]]] = []
    if item["type"] == "message":
        text = item["content"][0]["text"]
        opening["content"] = []
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        middle = [
            ("response.content_part.added", {**where, "part": part}),
            ("response.output_text.delta", {**where, "delta": text}),
            ("response.output_text.done", {**where, "text": text}),
            ("response.content_part.done", {**where, "part": item["content"][0]}),
        ]
    else:
        opening["arguments"] = ""
        where = {"item_id": item["id"], "output_index": 0}
        middle = [
            ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
            ("response.function_call_arguments.done", {**where, "arguments": item["arguments"]}),
        ]
    progress = {**response, "status": "in_progress", "output": []}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": progress}),
        ("response.in_progress", {"response": progress}),
        ("response.output_item.added", {"output_index": 0, "item": opening}),
        *middle,
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": response}),
    ]
    return [
        _event(kind, {**data, "sequence_number": number})
        for number, (kind, data) in enumerate(events)
    ]


def _chat_events(reply: dict[str, Any]) -> list[bytes]:
    message = reply["choices"][0]["message"]
    head = {k: reply[k] for k in ("id", "object", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(data) + b"\n\n"

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **tool_call}]}))
    chunks.append(chunk({}, reply["choices"][0]["finish_reason"]))
    usage = {**head, "choices": [], "usage": reply["usage"]}
    return [*chunks, b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]
