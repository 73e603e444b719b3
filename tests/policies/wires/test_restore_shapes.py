"""The shapes brim's own tool (`brim_restore`, answered in hidden rounds) takes in each wire API:
the tool added to a request, the calls read from a reply (streamed or not), the reply's turn
and brim's answers appended to the request, usage rewritten and summed, tool calling turned off.

Every test runs over all four wire APIs. A reply is described once, as a `Turn` (thinking, text
and calls in order, and its usage), and each API's `Shape` writes it the way that API sends it:
unstreamed, and streamed in as many pieces as a test asks for. What brim makes of them is
checked by the providers' own rules, written apart from brim (`tests.fakes`,
`tests.fake_anthropic`), not by brim's dialects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brim.policies.wires import WIRES
from brim.policies.wires.base import (
    SseEvents,
    ToolCall,
    ToolSpec,
    Usage,
    Wire,
    json_event,
    sse_data,
    with_data,
)
from tests.fake_anthropic import FakeAnthropic, anthropic_errors, thinking_signature
from tests.fakes import gemini_errors, pairing_errors, responses_errors

RESTORE = ToolSpec(
    name="brim_restore",
    description="Fetch back content brim removed from this conversation, by its key.",
    parameters={
        "type": "object",
        "properties": {"key": {"type": "string", "description": "The key in the notice."}},
        "required": ["key"],
    },
)
Items = list[dict[str, Any]]


# ---- a reply, described once ----------------------------------------------------------------


@dataclass(frozen=True)
class Think:
    text: str


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def json(self) -> str:
        return orjson.dumps(self.arguments).decode()


Segment = Think | Say | Call


USAGE = Usage(input=1200, output=85, cached_input=1024)


@dataclass(frozen=True)
class Turn:
    segments: tuple[Segment, ...]
    usage: Usage = USAGE

    @property
    def calls(self) -> list[Call]:
        return [s for s in self.segments if isinstance(s, Call)]

    @property
    def first(self) -> str | None:
        """What `TurnReader.started` should say."""
        for segment in self.segments:
            if isinstance(segment, Call):
                return "call"
            if segment.text:
                return "text"
        return None


def pieces(text: str, count: int) -> list[str]:
    """`text` in `count` pieces (fewer if it is shorter), none empty unless `text` is."""
    if not text:
        return [""]
    size = max(1, -(-len(text) // max(1, count)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(*events: dict[str, Any] | bytes, named: bool = False) -> bytes:
    """Events as the provider writes them on the wire (for `sse_data` to read back)."""
    out = b""
    for event in events:
        data = event if isinstance(event, bytes) else orjson.dumps(event)
        kind = (
            b"event: " + str(event["type"]).encode() + b"\n"
            if named and isinstance(event, dict)
            else b""
        )
        out += kind + b"data: " + data + b"\n\n"
    return out


# ---- each API's way of writing a turn ---------------------------------------------------------


@dataclass
class Shape:
    api: str
    body: Callable[[], dict[str, Any]]  # a realistic request with two client tools
    reply: Callable[[Turn], dict[str, Any]]
    stream: Callable[[Turn, int], bytes]  # the turn streamed, texts in N pieces
    errors: Callable[[Items], list[str]]  # the provider's own rules for the conversation
    tool: dict[str, Any]  # RESTORE as the API defines a tool
    choice_none: dict[str, Any]  # the body fields that turn tool calling off
    thinking: Callable[[Items], list[bytes]] = field(default=lambda items: [])

    @property
    def wire(self) -> Wire:
        return WIRES[self.api]


# Chat Completions


def chat_body() -> dict[str, Any]:
    call = {
        "id": "call_prev",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
    }
    return {
        "model": "gpt-4.1",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the bug in a.py"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_prev", "content": "def f(): ..."},
            {"role": "system", "content": "[brim removed 3 messages; key r-1a2b]"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": "Read a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            },
            {
                "type": "function",
                "function": {"name": "shell", "parameters": {"type": "object"}},
            },
        ],
    }


def chat_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input,
        "completion_tokens": usage.output,
        "total_tokens": (usage.input or 0) + (usage.output or 0),
        "prompt_tokens_details": {"cached_tokens": usage.cached_input, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def chat_reply(turn: Turn) -> dict[str, Any]:
    texts = [s.text for s in turn.segments if isinstance(s, Say)]
    thoughts = [s.text for s in turn.segments if isinstance(s, Think)]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
        "annotations": [],
    }
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if turn.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.json}}
            for c in turn.calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-4.1-2025-04-14",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if turn.calls else "stop",
            }
        ],
        "usage": chat_usage(turn.usage),
        "system_fingerprint": "fp_1",
    }


def chat_stream(turn: Turn, count: int) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-4.1-2025-04-14",
            "system_fingerprint": "fp_1",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }

    events: list[dict[str, Any] | bytes] = [
        chunk({"role": "assistant", "content": "", "refusal": None})
    ]
    for segment in turn.segments:
        if isinstance(segment, Think):
            events += [chunk({"reasoning_content": p}) for p in pieces(segment.text, count)]
        elif isinstance(segment, Say):
            events += [chunk({"content": p}) for p in pieces(segment.text, count)]
        else:
            index = turn.calls.index(segment)
            opening = {
                "index": index,
                "id": segment.id,
                "type": "function",
                "function": {"name": segment.name, "arguments": ""},
            }
            events.append(chunk({"tool_calls": [opening]}))
            events += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
                for p in pieces(segment.json, count)
            ]
    events.append(chunk({}, "tool_calls" if turn.calls else "stop"))
    last = chunk({})
    events.append({**last, "choices": [], "usage": chat_usage(turn.usage)})
    events.append(b"[DONE]")
    return sse(*events)


# Anthropic Messages


def messages_body() -> dict[str, Any]:
    thought = "The user wants the bug fixed; read a.py first."
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": "Fix the bug in a.py"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": thought,
                        "signature": thinking_signature(thought),
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_prev",
                        "name": "Read",
                        "input": {"path": "a.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_prev", "content": "def f(): ..."},
                    {"type": "text", "text": "[brim removed 3 messages; key r-1a2b]"},
                ],
            },
        ],
        "tools": [
            {
                "name": "Read",
                "description": "Read a file.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
            {
                "name": "Bash",
                "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"},
            },
        ],
    }


def messages_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": (usage.input or 0) - (usage.cached_input or 0) - 40,
        "cache_creation_input_tokens": 40,
        "cache_read_input_tokens": usage.cached_input,
        "cache_creation": {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 0},
        "output_tokens": usage.output,
        "service_tier": "standard",
    }


def messages_blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for segment in turn.segments:
        if isinstance(segment, Think):
            signature = thinking_signature(segment.text)
            blocks.append({"type": "thinking", "thinking": segment.text, "signature": signature})
        elif isinstance(segment, Say):
            blocks.append({"type": "text", "text": segment.text})
        else:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": segment.id,
                    "name": segment.name,
                    "input": segment.arguments,
                }
            )
    return blocks


def messages_reply(turn: Turn) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": messages_blocks(turn),
        "stop_reason": "tool_use" if turn.calls else "end_turn",
        "stop_sequence": None,
        "usage": messages_usage(turn.usage),
    }


def messages_stream(turn: Turn, count: int) -> bytes:
    start_usage = {**messages_usage(turn.usage), "output_tokens": 1}
    message = {**messages_reply(turn), "content": [], "stop_reason": None, "usage": start_usage}
    events: list[dict[str, Any] | bytes] = [
        {"type": "message_start", "message": message},
        {"type": "ping"},
    ]
    for index, block in enumerate(messages_blocks(turn)):
        kind = block["type"]
        if kind == "thinking":
            opening: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"], count)
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            opening = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"], count)]
        else:
            opening = {**block, "input": {}}
            text = orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [{"type": "input_json_delta", "partial_json": p} for p in pieces(text, count)]
        events.append({"type": "content_block_start", "index": index, "content_block": opening})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": messages_reply(turn)["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": turn.usage.output},
        }
    )
    events.append({"type": "message_stop"})
    return sse(*events, named=True)


def messages_thinking(items: Items) -> list[bytes]:
    return [
        orjson.dumps(block)
        for message in items
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "thinking"
    ]


# OpenAI Responses


def responses_body() -> dict[str, Any]:
    return {
        "model": "gpt-5-codex",
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Fix a.py"}],
            },
            {"type": "reasoning", "id": "rs_prev", "summary": [], "encrypted_content": "gAAAprev"},
            {
                "type": "function_call",
                "id": "fc_prev",
                "call_id": "call_prev",
                "name": "shell",
                "arguments": '{"command": ["cat", "a.py"]}',
            },
            {"type": "function_call_output", "call_id": "call_prev", "output": "def f(): ..."},
            {
                "type": "message",
                "role": "developer",
                "content": "[brim removed 3 messages; key r-1a2b]",
            },
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a command.",
                "strict": False,
                "parameters": {"type": "object", "properties": {"command": {"type": "array"}}},
            },
            {"type": "web_search"},
            {"type": "function", "name": "update_plan", "parameters": {"type": "object"}},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
    }


def responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input,
        "input_tokens_details": {"cached_tokens": usage.cached_input},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 64},
        "total_tokens": (usage.input or 0) + (usage.output or 0),
    }


def responses_items(turn: Turn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for number, segment in enumerate(turn.segments):
        if isinstance(segment, Think):
            items.append(
                {
                    "id": f"rs_{number}",
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": segment.text}],
                    "encrypted_content": f"gAAA{number}",
                }
            )
        elif isinstance(segment, Say):
            items.append(
                {
                    "id": f"msg_{number}",
                    "type": "message",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "annotations": [],
                            "logprobs": [],
                            "text": segment.text,
                        }
                    ],
                    "role": "assistant",
                }
            )
        else:
            items.append(
                {
                    "id": f"fc_{number}",
                    "type": "function_call",
                    "status": "completed",
                    "arguments": segment.json,
                    "call_id": segment.id,
                    "name": segment.name,
                }
            )
    return items


def responses_reply(turn: Turn) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "gpt-5-codex",
        "output": responses_items(turn),
        "parallel_tool_calls": True,
        "store": False,
        "tool_choice": "auto",
        "usage": responses_usage(turn.usage),
    }


def responses_stream(turn: Turn, count: int, *, empty_completed: bool = False) -> bytes:
    reply = responses_reply(turn)
    opened = {**reply, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opened},
        {"type": "response.in_progress", "response": opened},
    ]
    for index, item in enumerate(reply["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "summary": []},
                }
            )
            text = item["summary"][0]["text"]
            part: dict[str, Any] = {"type": "summary_text", "text": ""}
            events.append(
                {
                    "type": "response.reasoning_summary_part.added",
                    **where,
                    "summary_index": 0,
                    "part": part,
                }
            )
            events += [
                {
                    "type": "response.reasoning_summary_text.delta",
                    **where,
                    "summary_index": 0,
                    "delta": p,
                }
                for p in pieces(text, count)
            ]
            events.append(
                {
                    "type": "response.reasoning_summary_text.done",
                    **where,
                    "summary_index": 0,
                    "text": text,
                }
            )
        elif item["type"] == "message":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            events.append(
                {"type": "response.content_part.added", **where, "content_index": 0, "part": part}
            )
            text = item["content"][0]["text"]
            events += [
                {
                    "type": "response.output_text.delta",
                    **where,
                    "content_index": 0,
                    "delta": p,
                    "logprobs": [],
                }
                for p in pieces(text, count)
            ]
            events.append(
                {"type": "response.output_text.done", **where, "content_index": 0, "text": text}
            )
        else:
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            events += [
                {"type": "response.function_call_arguments.delta", **where, "delta": p}
                for p in pieces(item["arguments"], count)
            ]
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    completed = {**reply, "output": []} if empty_completed else reply
    events.append({"type": "response.completed", "response": completed})
    numbered = [{**event, "sequence_number": n} for n, event in enumerate(events)]
    return sse(*numbered, named=True)


# Gemini generateContent


def gemini_body() -> dict[str, Any]:
    return {
        "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Fix the bug in a.py"}]},
            {
                "role": "model",
                "parts": [
                    {
                        "functionCall": {"name": "read_file", "args": {"path": "a.py"}},
                        "thoughtSignature": "c2lnMA==",
                    }
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "read_file",
                            "response": {"output": "def f(): ..."},
                        }
                    }
                ],
            },
            {"role": "user", "parts": [{"text": "[brim removed 3 messages; key r-1a2b]"}]},
        ],
        "tools": [
            {"googleSearch": {}},
            {
                "functionDeclarations": [
                    {
                        "name": "read_file",
                        "description": "Read a file.",
                        "parametersJsonSchema": {
                            "type": "object",
                            "properties": {"path": {"type": "string"}},
                        },
                    },
                    {"name": "run_shell_command", "parameters": {"type": "OBJECT"}},
                ]
            },
        ],
        "generationConfig": {"thinkingConfig": {"includeThoughts": True}},
    }


def gemini_usage(usage: Usage) -> dict[str, Any]:
    return {
        "promptTokenCount": usage.input,
        "candidatesTokenCount": (usage.output or 0) - 30,
        "thoughtsTokenCount": 30,
        "cachedContentTokenCount": usage.cached_input,
        "totalTokenCount": (usage.input or 0) + (usage.output or 0),
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": usage.input}],
    }


SIGNATURE = "Q2lRQmpx" * 8


def gemini_parts(turn: Turn) -> list[dict[str, Any]]:
    """As Gemini 3 sends them: the signature on the first function call, or (no calls) on the
    last part."""
    parts: list[dict[str, Any]] = []
    for segment in turn.segments:
        if isinstance(segment, Think):
            parts.append({"text": segment.text, "thought": True})
        elif isinstance(segment, Say):
            parts.append({"text": segment.text})
        else:
            parts.append({"functionCall": {"name": segment.name, "args": segment.arguments}})
    signed = next((p for p in parts if "functionCall" in p), parts[-1] if parts else None)
    if signed is not None:
        signed["thoughtSignature"] = SIGNATURE
    return parts


def gemini_reply(turn: Turn) -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": gemini_parts(turn)},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": gemini_usage(turn.usage),
        "modelVersion": "gemini-2.5-pro",
        "responseId": "resp-1",
    }


def gemini_stream(turn: Turn, count: int) -> bytes:
    """A chunk per text piece and one per call; every chunk carries the usage so far, as
    Gemini's do; a text turn's signature comes last, on an empty text part."""
    chunks: list[list[dict[str, Any]]] = []
    for part in gemini_parts(turn):
        if "functionCall" in part:
            chunks.append([part])
            continue
        texts = pieces(part["text"], count)
        for text in texts:
            chunks.append([{"text": text, **({"thought": True} if part.get("thought") else {})}])
        if "thoughtSignature" in part:
            chunks.append([{"text": "", "thoughtSignature": part["thoughtSignature"]}])
    final = gemini_usage(turn.usage)
    events = []
    for number, parts in enumerate(chunks, 1):
        last = number == len(chunks)
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if last:
            candidate["finishReason"] = "STOP"
        usage = (
            final
            if last
            else {"promptTokenCount": turn.usage.input, "totalTokenCount": turn.usage.input}
        )
        events.append(
            {
                "candidates": [candidate],
                "usageMetadata": usage,
                "modelVersion": "gemini-2.5-pro",
                "responseId": "resp-1",
            }
        )
    return b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events)


SHAPES = [
    Shape(
        "openai.chat",
        chat_body,
        chat_reply,
        chat_stream,
        pairing_errors,
        tool={
            "type": "function",
            "function": {
                "name": RESTORE.name,
                "description": RESTORE.description,
                "parameters": RESTORE.parameters,
            },
        },
        choice_none={"tool_choice": "none"},
    ),
    Shape(
        "anthropic.messages",
        messages_body,
        messages_reply,
        messages_stream,
        anthropic_errors,
        tool={
            "name": RESTORE.name,
            "description": RESTORE.description,
            "input_schema": RESTORE.parameters,
        },
        choice_none={"tool_choice": {"type": "none"}},
        thinking=messages_thinking,
    ),
    Shape(
        "openai.responses",
        responses_body,
        responses_reply,
        responses_stream,
        responses_errors,
        tool={
            "type": "function",
            "name": RESTORE.name,
            "description": RESTORE.description,
            "parameters": RESTORE.parameters,
            "strict": False,
        },
        choice_none={"tool_choice": "none"},
    ),
    Shape(
        "gemini.generate",
        gemini_body,
        gemini_reply,
        gemini_stream,
        gemini_errors,
        tool={
            "name": RESTORE.name,
            "description": RESTORE.description,
            "parameters": RESTORE.parameters,
        },
        choice_none={"toolConfig": {"functionCallingConfig": {"mode": "NONE"}}},
    ),
]
each_shape = pytest.mark.parametrize("shape", SHAPES, ids=[s.api for s in SHAPES])


def test_every_wire_api_has_a_shape() -> None:
    assert {shape.api for shape in SHAPES} == set(WIRES)


def snapshot(value: Any) -> bytes:
    return orjson.dumps(value)


# ---- the tool in a request ----------------------------------------------------------------------


@each_shape
def test_tool_names_lists_the_client_tools(shape: Shape) -> None:
    names = {
        "openai.chat": {"read_file", "shell"},
        "anthropic.messages": {"Read", "Bash"},
        "openai.responses": {"shell", "update_plan"},  # web_search has no name
        "gemini.generate": {"read_file", "run_shell_command"},
    }[shape.api]
    assert shape.wire.tool_names(shape.body()) == names
    assert shape.wire.tool_names({}) == frozenset()


@each_shape
def test_with_tool_appends_the_tool_at_the_end_without_touching_the_rest(shape: Shape) -> None:
    body = shape.body()
    before = snapshot(body)
    added = shape.wire.with_tool(body, RESTORE)
    assert snapshot(body) == before  # not mutated
    assert shape.wire.tool_names(added) == shape.wire.tool_names(body) | {RESTORE.name}
    assert {k: v for k, v in added.items() if k != "tools"} == {
        k: v for k, v in body.items() if k != "tools"
    }
    if shape.api == "gemini.generate":  # into the last entry of function declarations
        assert added["tools"][0] == body["tools"][0]
        declarations = added["tools"][1]["functionDeclarations"]
        assert declarations[:-1] == body["tools"][1]["functionDeclarations"]
        assert declarations[-1] == shape.tool
        assert len(added["tools"]) == len(body["tools"])
    else:
        assert added["tools"][:-1] == body["tools"]
        assert added["tools"][-1] == shape.tool
    # The same request gives the same bytes: the provider's prompt cache sees one prefix.
    assert snapshot(shape.wire.with_tool(copy.deepcopy(body), RESTORE)) == snapshot(added)
    assert snapshot(shape.wire.with_tool(orjson.loads(before), RESTORE)) == snapshot(added)


@each_shape
def test_with_tool_on_a_request_without_tools(shape: Shape) -> None:
    body = {k: v for k, v in shape.body().items() if k != "tools"}
    added = shape.wire.with_tool(body, RESTORE)
    assert shape.wire.tool_names(added) == {RESTORE.name}
    expected = (
        {"functionDeclarations": [shape.tool]} if shape.api == "gemini.generate" else shape.tool
    )
    assert added["tools"] == [expected]


def test_gemini_with_tool_adds_an_entry_when_no_entry_declares_functions() -> None:
    wire = WIRES["gemini.generate"]
    body: dict[str, Any] = {"contents": [], "tools": [{"googleSearch": {}}, {"codeExecution": {}}]}
    added = wire.with_tool(body, RESTORE)
    assert added["tools"][:2] == body["tools"]
    assert added["tools"][2] == {"functionDeclarations": [SHAPES[3].tool]}


def test_gemini_with_tool_keeps_the_snake_case_spelling_of_an_entry() -> None:
    wire = WIRES["gemini.generate"]
    body = {"contents": [], "tools": [{"function_declarations": [{"name": "ls"}]}]}
    added = wire.with_tool(body, RESTORE)
    assert [d["name"] for d in added["tools"][0]["function_declarations"]] == ["ls", RESTORE.name]
    assert wire.tool_names(added) == {"ls", RESTORE.name}


@each_shape
def test_with_tool_choice_none(shape: Shape) -> None:
    body = shape.wire.with_tool(shape.body(), RESTORE)
    before = snapshot(body)
    off = shape.wire.with_tool_choice_none(body)
    assert snapshot(body) == before
    assert {k: v for k, v in off.items() if k not in shape.choice_none} == {
        k: v for k, v in body.items() if k not in shape.choice_none
    }
    for key, value in shape.choice_none.items():
        assert off[key] == value
    assert off["tools"] == body["tools"]  # still defined: the cached prefix stays


def test_gemini_tool_choice_none_drops_the_allowed_functions_and_keeps_the_rest() -> None:
    wire = WIRES["gemini.generate"]
    body = {
        "contents": [],
        "toolConfig": {
            "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["ls"]},
            "retrievalConfig": {"languageCode": "en"},
        },
    }
    assert wire.with_tool_choice_none(body)["toolConfig"] == {
        "functionCallingConfig": {"mode": "NONE"},
        "retrievalConfig": {"languageCode": "en"},
    }
    snake = {"contents": [], "tool_config": {"function_calling_config": {"mode": "AUTO"}}}
    assert wire.with_tool_choice_none(snake) == {
        "contents": [],
        "tool_config": {"function_calling_config": {"mode": "NONE"}},
    }


def test_chat_tool_choice_none_leaves_a_request_without_tools_alone() -> None:
    """OpenAI refuses `tool_choice` without `tools`."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert WIRES["openai.chat"].with_tool_choice_none(body) == body


# ---- calls in a reply, and the request that continues it ----------------------------------------

RESTORE_CALL = Call("call_r1", "brim_restore", {"key": "r-1a2b"})
CLIENT_CALL = Call("call_c1", "read_file", {"path": "b.py", "lines": [1, 40]})
MIXED = Turn(
    (
        Think("The notice says content was removed; fetch it back before editing."),
        Say("Let me look at what was removed."),
        CLIENT_CALL,
        RESTORE_CALL,
    )
)


def expected_calls(shape: Shape, turn: Turn) -> list[ToolCall]:
    """The calls `reply_calls` should give. Gemini's calls carry no id: brim makes one of the
    call's name and its place among the turn's calls."""
    if shape.api == "gemini.generate":
        return [ToolCall(f"{c.name}#{n}", c.name, c.arguments) for n, c in enumerate(turn.calls)]
    return [ToolCall(c.id, c.name, c.arguments) for c in turn.calls]


@each_shape
def test_reply_calls_reads_every_call_in_order(shape: Shape) -> None:
    reply = shape.reply(MIXED)
    assert shape.wire.reply_calls(reply) == expected_calls(shape, MIXED)
    assert shape.wire.reply_calls(shape.reply(Turn((Say("Done."),)))) == []
    assert shape.wire.reply_calls({}) == []


def test_gemini_reply_calls_keep_the_ids_gemini_gives() -> None:
    reply = gemini_reply(MIXED)
    reply["candidates"][0]["content"]["parts"][2]["functionCall"]["id"] = "fc-7"
    calls = WIRES["gemini.generate"].reply_calls(reply)
    assert [c.id for c in calls] == ["fc-7", "brim_restore#1"]


def test_bad_arguments_read_as_none() -> None:
    reply = chat_reply(Turn((RESTORE_CALL,)))
    reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"key": "r-'
    assert WIRES["openai.chat"].reply_calls(reply) == [ToolCall("call_r1", "brim_restore", {})]


def restore_of(shape: Shape, reply: dict[str, Any]) -> list[ToolCall]:
    return [c for c in shape.wire.reply_calls(reply) if c.name == RESTORE.name]


@each_shape
def test_continued_answers_brims_call_and_drops_the_others(shape: Shape) -> None:
    body = shape.wire.with_tool(shape.body(), RESTORE)
    reply = shape.reply(MIXED)
    body_bytes, reply_bytes = snapshot(body), snapshot(reply)
    calls = restore_of(shape, reply)
    out = shape.wire.continued(body, reply, calls, ["the removed content"])
    assert snapshot(body) == body_bytes and snapshot(reply) == reply_bytes  # not mutated

    items = shape.wire.conversation(out)
    before = shape.wire.conversation(body)
    assert items[: len(before)] == before  # the request so far is the new one's prefix
    assert {k: v for k, v in out.items() if k != shape.wire.conversation_field} == {
        k: v for k, v in body.items() if k != shape.wire.conversation_field
    }
    assert shape.errors(items) == []
    assert shape.wire.dialect.violations(items) == []
    text = snapshot(items[len(before) :])
    assert b"the removed content" in text
    assert CLIENT_CALL.name.encode() not in text  # the client's call is not in the hidden round
    assert b"Let me look at what was removed." in text
    # Thinking goes back byte for byte (the fake's check of its signature checks that too).
    assert shape.thinking(items[len(before) :]) == shape.thinking(
        [{"content": reply.get("content")}]
    )


@each_shape
def test_continued_can_answer_every_call(shape: Shape) -> None:
    body = shape.body()
    reply = shape.reply(MIXED)
    calls = shape.wire.reply_calls(reply)
    out = shape.wire.continued(body, reply, calls, ["b.py's text", "the removed content"])
    items = shape.wire.conversation(out)
    assert shape.errors(items) == []
    assert shape.wire.dialect.violations(items) == []
    assert CLIENT_CALL.name.encode() in snapshot(items[len(shape.wire.conversation(body)) :])


@each_shape
def test_continued_results_follow_the_replys_order(shape: Shape) -> None:
    body = shape.body()
    reply = shape.reply(MIXED)
    calls = shape.wire.reply_calls(reply)
    out = shape.wire.continued(body, reply, calls[::-1], ["the removed content", "b.py's text"])
    tail = snapshot(shape.wire.conversation(out)[len(shape.wire.conversation(body)) :]).decode()
    assert tail.index("b.py's text") < tail.index("the removed content")


@each_shape
def test_hidden_rounds_chain(shape: Shape) -> None:
    """Round after round: each continued request is valid, and the previous one its prefix."""
    body = shape.wire.with_tool(shape.body(), RESTORE)
    for round_ in range(3):
        turn = Turn(
            (
                Think(f"Round {round_}: still missing a piece."),
                Call(f"call_r{round_}", RESTORE.name, {"key": f"r-{round_}"}),
            )
        )
        reply = shape.reply(turn)
        following = shape.wire.continued(body, reply, restore_of(shape, reply), [f"piece {round_}"])
        before = shape.wire.conversation(body)
        assert shape.wire.conversation(following)[: len(before)] == before
        assert shape.errors(shape.wire.conversation(following)) == []
        body = following


@each_shape
def test_continued_refuses_a_call_the_reply_does_not_make(shape: Shape) -> None:
    reply = shape.reply(MIXED)
    with pytest.raises(ValueError, match="no tool call"):
        shape.wire.continued(shape.body(), reply, [ToolCall("nope", RESTORE.name, {})], ["x"])
    with pytest.raises(ValueError, match="results"):
        shape.wire.continued(shape.body(), reply, restore_of(shape, reply), [])


def test_anthropic_continued_keeps_thinking_blocks_byte_identical() -> None:
    shape = SHAPES[1]
    reply = messages_reply(MIXED)
    out = shape.wire.continued(shape.body(), reply, restore_of(shape, reply), ["x"])
    turn = out["messages"][-2]
    assert turn["role"] == "assistant"
    assert snapshot(turn["content"][0]) == snapshot(reply["content"][0])
    assert [b["type"] for b in turn["content"]] == ["thinking", "text", "tool_use"]
    assert out["messages"][-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_r1", "content": "x"}],
    }


def test_anthropic_continued_drops_an_empty_text_block() -> None:
    """Anthropic refuses an empty text block in a request; a reply can hold one."""
    reply = messages_reply(Turn((Say(""), RESTORE_CALL)))
    out = WIRES["anthropic.messages"].continued(
        messages_body(), reply, restore_of(SHAPES[1], reply), ["x"]
    )
    assert [b["type"] for b in out["messages"][-2]["content"]] == ["tool_use"]


def test_responses_continued_keeps_reasoning_items_and_answers_by_call_id() -> None:
    shape = SHAPES[2]
    reply = responses_reply(MIXED)
    out = shape.wire.continued(shape.body(), reply, restore_of(shape, reply), ["x"])
    tail = out["input"][len(shape.body()["input"]) :]
    assert [item["type"] for item in tail] == [
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert tail[0] is reply["output"][0]  # encrypted reasoning goes back as it came
    assert tail[-1] == {"type": "function_call_output", "call_id": "call_r1", "output": "x"}


def test_responses_continued_drops_unstored_reasoning_it_cannot_send_back() -> None:
    """With `store: false`, a reasoning item is only its encrypted content: without it, its id
    names nothing the API keeps, and the API refuses the request."""
    reply = responses_reply(MIXED)
    del reply["output"][0]["encrypted_content"]
    wire = WIRES["openai.responses"]
    body = responses_body()
    out = wire.continued(body, reply, restore_of(SHAPES[2], reply), ["x"])
    assert "reasoning" not in [item.get("type") for item in out["input"][len(body["input"]) :]]
    stored = wire.continued({**body, "store": True}, reply, restore_of(SHAPES[2], reply), ["x"])
    assert "reasoning" in [item.get("type") for item in stored["input"][len(body["input"]) :]]


def test_responses_continued_on_a_string_input() -> None:
    wire = WIRES["openai.responses"]
    reply = responses_reply(Turn((RESTORE_CALL,)))
    out = wire.continued({"model": "m", "input": "hi"}, reply, restore_of(SHAPES[2], reply), ["x"])
    assert out["input"][0] == {"type": "message", "role": "user", "content": "hi"}
    assert responses_errors(out["input"]) == []


def test_responses_continued_drops_a_call_brim_never_answers() -> None:
    """A local shell call is no call brim reads, so none it answers: it goes like the client's
    other calls, which the model makes again."""
    wire = WIRES["openai.responses"]
    reply = responses_reply(Turn((RESTORE_CALL,)))
    shell = {"type": "local_shell_call", "call_id": "call_sh", "action": {"command": ["ls"]}}
    reply["output"].insert(0, shell)
    body = responses_body()
    out = wire.continued(body, reply, restore_of(SHAPES[2], reply), ["x"])
    assert [item["type"] for item in out["input"][len(body["input"]) :]] == [
        "function_call",
        "function_call_output",
    ]


def test_chat_continued_sends_back_what_a_request_message_takes() -> None:
    reply = chat_reply(MIXED)
    out = WIRES["openai.chat"].continued(chat_body(), reply, restore_of(SHAPES[0], reply), ["x"])
    assistant = out["messages"][-2]
    assert assistant == {
        "role": "assistant",
        "content": "Let me look at what was removed.",
        "reasoning_content": MIXED.segments[0].text,  # type: ignore[union-attr]
        "tool_calls": [reply["choices"][0]["message"]["tool_calls"][1]],
    }
    assert out["messages"][-1] == {"role": "tool", "tool_call_id": "call_r1", "content": "x"}


def test_gemini_continued_pairs_by_name_and_keeps_the_signature() -> None:
    """Gemini 3 puts the turn's thought signature on its first function call only; when that
    call is not answered here, the signature moves to the first call that is."""
    reply = gemini_reply(MIXED)
    shape = SHAPES[3]
    out = shape.wire.continued(gemini_body(), reply, restore_of(shape, reply), ["x"])
    model, answers = out["contents"][-2:]
    assert model["role"] == "model"
    assert model["parts"][:2] == reply["candidates"][0]["content"]["parts"][:2]
    assert model["parts"][2] == {
        "functionCall": {"name": "brim_restore", "args": {"key": "r-1a2b"}},
        "thoughtSignature": SIGNATURE,
    }
    assert answers == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "brim_restore", "response": {"output": "x"}}}],
    }


def test_gemini_continued_answers_with_the_calls_own_id() -> None:
    reply = gemini_reply(Turn((RESTORE_CALL,)))
    reply["candidates"][0]["content"]["parts"][0]["functionCall"]["id"] = "fc-9"
    wire = WIRES["gemini.generate"]
    calls = wire.reply_calls(reply)
    out = wire.continued(gemini_body(), reply, calls, ["x"])
    assert out["contents"][-1]["parts"][0]["functionResponse"]["id"] == "fc-9"
    assert wire.dialect.violations(out["contents"]) == []


# ---- usage ------------------------------------------------------------------------------------------


def consistent_usage() -> st.SearchStrategy[Usage]:
    return st.integers(0, 2_000_000).flatmap(
        lambda total: st.builds(
            Usage,
            input=st.just(total),
            output=st.integers(0, 200_000),
            cached_input=st.integers(0, total),
        )
    )


@each_shape
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(usage=consistent_usage())
def test_with_usage_round_trips_through_usage(shape: Shape, usage: Usage) -> None:
    reply = shape.reply(MIXED)
    before = snapshot(reply)
    out = shape.wire.with_usage(reply, usage)
    assert snapshot(reply) == before
    assert shape.wire.usage(out) == usage
    assert {k: v for k, v in out.items() if k not in ("usage", "usageMetadata")} == {
        k: v for k, v in reply.items() if k not in ("usage", "usageMetadata")
    }


@each_shape
def test_with_usage_leaves_what_usage_does_not_say(shape: Shape) -> None:
    reply = shape.reply(MIXED)
    original = shape.wire.usage(reply)
    assert original == MIXED.usage
    only_output = Usage(output=999)
    assert shape.wire.usage(shape.wire.with_usage(reply, only_output)) == original.merged(
        only_output
    )
    bare = {k: v for k, v in reply.items() if k not in ("usage", "usageMetadata")}
    assert shape.wire.usage(shape.wire.with_usage(bare, MIXED.usage)) == MIXED.usage


def test_with_usage_writes_the_totals_providers_send() -> None:
    usage = Usage(input=5000, output=300, cached_input=4000)
    chat = WIRES["openai.chat"].with_usage(chat_reply(MIXED), usage)["usage"]
    assert (chat["prompt_tokens"], chat["completion_tokens"], chat["total_tokens"]) == (
        5000,
        300,
        5300,
    )
    assert chat["prompt_tokens_details"] == {"cached_tokens": 4000, "audio_tokens": 0}
    responses = WIRES["openai.responses"].with_usage(responses_reply(MIXED), usage)["usage"]
    assert (responses["input_tokens"], responses["total_tokens"]) == (5000, 5300)
    messages = WIRES["anthropic.messages"].with_usage(messages_reply(MIXED), usage)["usage"]
    assert (
        messages["input_tokens"]
        + messages["cache_read_input_tokens"]
        + messages["cache_creation_input_tokens"]
        == 5000
    )
    assert messages["cache_read_input_tokens"] == 4000
    gemini = WIRES["gemini.generate"].with_usage(gemini_reply(MIXED), usage)["usageMetadata"]
    assert gemini["candidatesTokenCount"] + gemini["thoughtsTokenCount"] == 300
    assert gemini["totalTokenCount"] == 5300


def test_usage_sums() -> None:
    a, b = Usage(100, 10, None), Usage(200, None, 50)
    assert a.added(b) == Usage(300, 10, 50)
    assert Usage().added(Usage()) == Usage()
    assert Usage(None, 12, None).plus(b) == Usage(None, 12, None)  # only what the event says
    assert Usage(100, 1, None).plus(b) == Usage(300, 1, 50)  # input given: cached counts too


# ---- streamed replies ----------------------------------------------------------------------------


def read(shape: Shape, stream: bytes) -> Any:
    reader = shape.wire.turn_reader()
    for data in sse_data(stream):
        reader.take(json_event(data))
    return reader


TURNS = {
    "text-only": Turn(
        (Think("Nothing is missing."), Say("The bug is on line 3: `x` is never set."))
    ),
    "call-first": Turn((RESTORE_CALL,)),
    "text-first": Turn((Say("I need the removed part."), RESTORE_CALL)),
    "thinking-first": Turn((Think("A notice: content was cut. Fetch it."), RESTORE_CALL)),
    "mixed": MIXED,
    "parallel": Turn(
        (
            Call("call_a", RESTORE.name, {"key": "r-1"}),
            Call("call_b", "read_file", {"path": "c.py"}),
            Call("call_c", RESTORE.name, {"key": "r-2", "note": 'ünïcode ✓ and "quotes"'}),
        )
    ),
}


def check_stream(shape: Shape, turn: Turn, stream: bytes) -> None:
    reader = read(shape, stream)
    assert reader.started == turn.first
    streamed, whole = reader.reply(), shape.reply(turn)
    assert (
        shape.wire.reply_calls(streamed)
        == shape.wire.reply_calls(whole)
        == expected_calls(shape, turn)
    )
    assert shape.wire.usage(streamed) == shape.wire.usage(whole) == turn.usage
    restore = restore_of(shape, streamed)
    if restore:  # the streamed reply continues a request as the unstreamed one does
        body = shape.wire.with_tool(shape.body(), RESTORE)
        out = shape.wire.continued(body, streamed, restore, ["r"] * len(restore))
        assert shape.errors(shape.wire.conversation(out)) == []
        same = shape.wire.continued(body, whole, restore_of(shape, whole), ["r"] * len(restore))
        assert shape.thinking(shape.wire.conversation(out)) == shape.thinking(
            shape.wire.conversation(same)
        )
        if shape.api != "gemini.generate":  # Gemini's streamed parts may split differently
            assert snapshot(out) == snapshot(same)


@each_shape
@pytest.mark.parametrize("count", [1, 3, 1000], ids=["whole", "3-pieces", "char-by-char"])
@pytest.mark.parametrize("name", list(TURNS))
def test_turn_reader_reads_a_streamed_reply_as_the_unstreamed_one(
    shape: Shape, name: str, count: int
) -> None:
    turn = TURNS[name]
    check_stream(shape, turn, shape.stream(turn, count))


@each_shape
def test_turn_reader_has_not_started_before_content(shape: Shape) -> None:
    """Openers (a role-only chunk, an empty block, an item without text yet) are not content."""
    stream = shape.stream(TURNS["text-first"], 1)
    events = sse_data(stream)
    opening = {
        "openai.chat": 1,  # the role chunk
        "anthropic.messages": 3,  # message_start, ping, an empty text block
        "openai.responses": 4,  # created, in_progress, message added, content part added
        "gemini.generate": 0,
    }[shape.api]
    reader = shape.wire.turn_reader()
    assert reader.started is None
    for data in events[:opening]:
        reader.take(json_event(data))
    assert reader.started is None
    reader.take(json_event(events[opening]))
    assert reader.started == "text"


def test_responses_reader_builds_the_output_when_the_final_event_has_none() -> None:
    shape = SHAPES[2]
    for turn in TURNS.values():
        check_stream(shape, turn, responses_stream(turn, 4, empty_completed=True))


def test_responses_reader_reads_items_that_come_whole() -> None:
    """As tests/fakes.py streams a call: `output_item.added` with the whole item, no deltas."""
    shape = SHAPES[2]
    turn = Turn((Call("call_1", "shell", {"cmd": "cat f1.py"}),))
    reply = responses_reply(turn)
    item = reply["output"][0]
    stream = sse(
        {
            "type": "response.created",
            "response": {**reply, "status": "in_progress", "output": []},
            "sequence_number": 0,
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": item,
            "sequence_number": 1,
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": item,
            "sequence_number": 2,
        },
        {"type": "response.completed", "response": reply, "sequence_number": 3},
        named=True,
    )
    check_stream(shape, turn, stream)


def test_responses_reader_reads_reasoning_text_and_summary_deltas() -> None:
    """Open-weight models stream their reasoning as `reasoning_text`, OpenAI's as a summary:
    both are the turn's text start, and both are read into their parts."""
    reader = SHAPES[2].wire.turn_reader()
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "content": []}
    reader.take({"type": "response.output_item.added", "output_index": 0, "item": item})
    assert reader.started is None
    for kind, index, delta in (
        ("response.reasoning_text.delta", "content_index", "Think "),
        ("response.reasoning_text.delta", "content_index", "hard."),
        ("response.reasoning_summary_text.delta", "summary_index", "Thought."),
    ):
        reader.take({"type": kind, "item_id": "rs_1", "output_index": 0, index: 0, "delta": delta})
        assert reader.started == "text"
    (out,) = reader.reply()["output"]
    assert out["content"] == [{"type": "reasoning_text", "text": "Think hard."}]
    assert out["summary"] == [{"type": "summary_text", "text": "Thought."}]


def test_anthropic_reader_reads_the_fake_providers_stream() -> None:
    """The stream tests/fake_anthropic.py sends for a request with tools."""
    content, stop = FakeAnthropic._reply({"tools": [{"name": "Read"}]}, 3)
    stream = b"".join(FakeAnthropic._events("claude-x", 3, 4321, content, stop))
    reader = read(SHAPES[1], stream)
    assert reader.started == "text"  # thinking first
    reply = reader.reply()
    assert reply["content"] == content
    assert WIRES["anthropic.messages"].usage(reply) == Usage(4321, 12, None)
    calls = WIRES["anthropic.messages"].reply_calls(reply)
    assert [c.id for c in calls] == ["toolu_3_a", "toolu_3_b"]
    out = WIRES["anthropic.messages"].continued(messages_body(), reply, calls[1:], ["x"])
    assert anthropic_errors(out["messages"]) == []


def test_anthropic_reader_takes_the_cumulative_usage_of_message_delta() -> None:
    """Newer streams repeat input figures in `message_delta`; the later ones win."""
    turn = TURNS["call-first"]
    stream = messages_stream(turn, 2).replace(
        b'"usage":{"output_tokens":85}',
        b'"usage":{"input_tokens":136,"cache_creation_input_tokens":40,"cache_read_input_tokens":1024,"output_tokens":85}',
    )
    reader = read(SHAPES[1], stream)
    assert WIRES["anthropic.messages"].usage(reader.reply()) == turn.usage


def test_chat_reader_separates_calls_that_reuse_an_index() -> None:
    """Some OpenAI-compatible servers send every call at index 0, each with its own id."""

    def chunk(delta: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }

    calls = [
        {
            "index": 0,
            "id": "a",
            "type": "function",
            "function": {"name": "brim_restore", "arguments": '{"key":"1"}'},
        },
        {
            "index": 0,
            "id": "b",
            "type": "function",
            "function": {"name": "brim_restore", "arguments": '{"key":"2"}'},
        },
    ]
    reader = read(
        SHAPES[0], sse(chunk({"tool_calls": [calls[0]]}), chunk({"tool_calls": [calls[1]]}))
    )
    found = WIRES["openai.chat"].reply_calls(reader.reply())
    assert [(c.id, c.arguments) for c in found] == [("a", {"key": "1"}), ("b", {"key": "2"})]


def test_gemini_reader_keeps_signed_parts_whole() -> None:
    """Text chunks are joined; a part with a signature (even empty text) is kept as it came."""
    turn = TURNS["text-only"]
    reader = read(SHAPES[3], gemini_stream(turn, 5))
    parts = reader.reply()["candidates"][0]["content"]["parts"]
    assert parts == [
        {"text": turn.segments[0].text, "thought": True},  # type: ignore[union-attr]
        {"text": turn.segments[1].text},  # type: ignore[union-attr]
        {"text": "", "thoughtSignature": SIGNATURE},
    ]
    call_turn = TURNS["thinking-first"]
    reply = read(SHAPES[3], gemini_stream(call_turn, 5)).reply()
    assert (
        reply["candidates"][0]["content"]["parts"]
        == gemini_reply(call_turn)["candidates"][0]["content"]["parts"]
    )
    assert reply["candidates"][0]["finishReason"] == "STOP"


segment = st.one_of(
    st.builds(Think, st.text(min_size=1, max_size=40)),
    st.builds(Say, st.text(min_size=1, max_size=40)),
    st.builds(
        Call,
        st.uuids().map(lambda u: f"call_{u.hex[:12]}"),
        st.sampled_from([RESTORE.name, "read_file", "shell"]),
        st.dictionaries(
            st.text(min_size=1, max_size=8),
            st.one_of(st.text(max_size=30), st.integers(-(2**53), 2**53), st.booleans(), st.none()),
            max_size=4,
        ),
    ),
)


@each_shape
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    segments=st.lists(segment, min_size=1, max_size=6),
    count=st.integers(1, 50),
    usage=consistent_usage(),
)
def test_turn_reader_on_any_turn(
    shape: Shape, segments: list[Segment], count: int, usage: Usage
) -> None:
    if shape.api == "openai.chat":  # Chat Completions has one text and one reasoning per turn
        texts = [s for s in segments if isinstance(s, Say)]
        thoughts = [s for s in segments if isinstance(s, Think)]
        segments = [*thoughts, *texts, *(s for s in segments if isinstance(s, Call))]
    if shape.api == "gemini.generate":  # Gemini's usage splits output into candidates + thoughts
        usage = Usage(usage.input, max(usage.output or 0, 30), usage.cached_input)
    check_stream(
        shape, Turn(tuple(segments), usage), shape.stream(Turn(tuple(segments), usage), count)
    )


# ---- usage summed over hidden rounds, in the final round's stream ------------------------------


def stream_total(wire: Wire, datas: list[bytes]) -> Usage:
    """What brim's observer reads from a stream: each event's usage, later figures winning."""
    total = Usage()
    for data in datas:
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        found = wire.usage(payload)
        if found is not None:
            total = total.merged(found)
    return total


@each_shape
@pytest.mark.parametrize("name", ["text-only", "mixed"])
def test_a_stream_after_hidden_rounds_adds_their_usage(shape: Shape, name: str) -> None:
    """A round reached through hidden rounds goes to the client with their usage added to
    each usage figure it reports, and nothing else changed."""
    turn = TURNS[name]
    earlier = Usage(input=3000, output=120, cached_input=2048)
    stream = shape.stream(turn, 3)
    datas = sse_data(stream)
    splice = shape.wire.splice(earlier)
    events = SseEvents()
    rewritten = sse_data(splice.feed(events.feed(stream) + events.end()) + splice.release())
    assert stream_total(shape.wire, datas) == turn.usage
    assert stream_total(shape.wire, rewritten) == Usage(
        turn.usage.input + 3000,  # type: ignore[operator]
        turn.usage.output + 120,  # type: ignore[operator]
        turn.usage.cached_input + 2048,  # type: ignore[operator]
    )
    for before, after in zip(datas, rewritten, strict=True):
        try:
            reports = shape.wire.usage(orjson.loads(before))
        except orjson.JSONDecodeError:
            reports = None
        if reports is None or reports.empty:
            assert after is before or after == before  # byte for byte
        else:
            assert after != before
            # Only the usage changed.
            strip = {
                "openai.chat": "usage",
                "anthropic.messages": "usage",
                "openai.responses": "response",
                "gemini.generate": "usageMetadata",
            }[shape.api]
            old, new = orjson.loads(before), orjson.loads(after)
            if shape.api == "anthropic.messages" and "message" in old:
                old, new = old["message"], new["message"]
            if shape.api == "openai.responses":
                old, new = old["response"], new["response"]
                strip = "usage"
            assert {k: v for k, v in old.items() if k != strip} == {
                k: v for k, v in new.items() if k != strip
            }
    # The reader of the rewritten stream reports the sum too.
    assert shape.wire.usage(
        read(shape, b"".join(b"data: " + d + b"\n\n" for d in rewritten)).reply()
    ) == Usage(
        turn.usage.input + 3000,  # type: ignore[operator]
        turn.usage.output + 120,  # type: ignore[operator]
        turn.usage.cached_input + 2048,  # type: ignore[operator]
    )


@each_shape
def test_earlier_usage_leaves_other_events_alone(shape: Shape) -> None:
    for data in (
        b"[DONE]",
        b"",
        b"{not json",
        b'{"type":"ping"}',
        b'{"usage": null}',
        b'{"usage":{}}',
    ):
        splice = shape.wire.splice(Usage(1, 2, 3))
        event = b"data: " + data + b"\n\n"
        assert splice.feed(SseEvents().feed(event)) + splice.release() == event


def test_responses_reader_encrypted_reasoning_alone_is_no_content() -> None:
    """A reasoning item with no summary shows the client nothing: the call after it starts
    the turn."""
    turn = Turn((Think("x"), RESTORE_CALL))
    stream = (
        responses_stream(turn, 2)
        .replace(b'"text":"x"', b'"text":""')
        .replace(b'"delta":"x"', b'"delta":""')
    )
    reader = read(SHAPES[2], stream)
    assert reader.started == "call"
    assert WIRES["openai.responses"].reply_calls(reader.reply())[0].id == RESTORE_CALL.id


def test_anthropic_reader_redacted_thinking_is_content() -> None:
    start = {
        "type": "message_start",
        "message": {**messages_reply(Turn(())), "usage": {"input_tokens": 5, "output_tokens": 1}},
    }
    block = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    reader = read(
        SHAPES[1], sse(start, {"type": "content_block_start", "index": 0, "content_block": block})
    )
    assert reader.started == "text"
    assert reader.reply()["content"] == [block]


# ---- a restore after text: the rounds spliced into one reply -----------------------------------
#
# What the client gets is checked by each API's own stream rules (written here, apart from brim)
# and read back by the official SDKs' own stream accumulators (Gemini has none in this venv:
# its chunks are read the way the Gemini CLI reads them, parts appended).


@dataclass(frozen=True)
class Heard:
    """A stream as the client's SDK reads it."""

    text: str  # the reply's text (thinking and reasoning apart)
    calls: list[str]  # names of the tool calls
    usage: Usage
    # Every id the stream gave the reply, in order (one reply: one id; a Responses stream's
    # completed response, the SDK's final one, is the last round's: the one stored with the
    # answer, which a client's next `previous_response_id` names).
    ids: list[str]


def chat_heard(stream: bytes) -> tuple[Heard, list[str]]:
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    datas = sse_data(stream)
    errors = [] if datas[-1:] == [b"[DONE]"] and datas.count(b"[DONE]") == 1 else ["[DONE]"]
    chunks = [orjson.loads(d) for d in datas if d != b"[DONE]"]
    roles = [n for n, c in enumerate(chunks) for ch in c["choices"] if "role" in ch["delta"]]
    if roles not in ([], [0]):
        errors.append(f"a role in chunks {roles}")
    finishes = [c for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    if len(finishes) != 1:
        errors.append(f"{len(finishes)} finish reasons")
    usages = [c for c in chunks if isinstance(c.get("usage"), dict)]
    if len(usages) > 1:
        errors.append(f"{len(usages)} usage chunks")
    envelopes = {(c["id"], c["created"], c["model"]) for c in chunks}
    if len(envelopes) != 1:
        errors.append(f"envelopes {envelopes}")
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    completion = state.get_final_completion()
    message = completion.choices[0].message
    if message.role != "assistant":
        errors.append(f"role {message.role!r}")
    usage = completion.usage
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    heard = Heard(
        message.content or "",
        [c.function.name for c in message.tool_calls or [] if c.type == "function"],
        Usage(usage.prompt_tokens, usage.completion_tokens, cached),
        sorted({c["id"] for c in chunks}),
    )
    return heard, errors


def messages_heard(stream: bytes) -> tuple[Heard, list[str]]:
    from anthropic.lib.streaming._messages import accumulate_event

    # The SDK's transport drops pings before the accumulator sees them.
    events = [e for e in map(orjson.loads, sse_data(stream)) if e["type"] != "ping"]
    kinds = [e["type"] for e in events]
    errors = []
    if kinds[:1] != ["message_start"] or kinds.count("message_start") != 1:
        errors.append("one message_start first")
    if kinds[-2:] != ["message_delta", "message_stop"] or kinds.count("message_delta") != 1:
        errors.append(f"one message_delta, then message_stop, at the end: {kinds[-3:]}")
    open_blocks: set[int] = set()
    opened = 0
    for event in events:
        index = event.get("index")
        if event["type"] == "content_block_start":
            if index != opened:
                errors.append(f"block {index} opened as block {opened}")
            open_blocks.add(index)
            opened += 1
        elif event["type"] in ("content_block_delta", "content_block_stop"):
            if index not in open_blocks:
                errors.append(f"{event['type']} of block {index}, which is not open")
            if event["type"] == "content_block_stop":
                open_blocks.discard(index)
        elif event["type"] == "message_delta" and open_blocks:
            errors.append(f"blocks {open_blocks} still open at message_delta")
    snapshot: Any = None
    buffers: dict[int, bytes] = {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    u = snapshot.usage
    read, written = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
    heard = Heard(
        "".join(b.text for b in snapshot.content if b.type == "text"),
        [b.name for b in snapshot.content if b.type == "tool_use"],
        Usage(u.input_tokens + read + written, u.output_tokens, u.cache_read_input_tokens),
        [snapshot.id],
    )
    return heard, errors


def responses_heard(stream: bytes) -> tuple[Heard, list[str]]:
    from openai import omit
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    events = [orjson.loads(d) for d in sse_data(stream)]
    errors = []
    numbers = [e["sequence_number"] for e in events]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        errors.append(f"sequence numbers {numbers}")
    kinds = [e["type"] for e in events]
    if kinds[:1] != ["response.created"] or kinds.count("response.created") != 1:
        errors.append("one response.created first")
    if kinds[-1:] != ["response.completed"] or kinds.count("response.completed") != 1:
        errors.append("one response.completed last")
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    if len(set(added)) != len(added):
        errors.append(f"item ids repeat: {added}")
    for event in events:
        index = event.get("output_index")
        if event["type"] == "response.output_item.added" and index != added.index(
            event["item"]["id"]
        ):
            errors.append(f"item {event['item']['id']} added at {index}")
        elif index is not None and not 0 <= index < len(added):
            errors.append(f"{event['type']} of item {index}, not added")
    final = events[-1]["response"]
    if [item["id"] for item in final["output"]] != added:
        errors.append(f"the final output {final['output']} is not the items added {added}")
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    completed: Any = None
    for event in events:
        parsed = cast(ResponseStreamEvent, construct_type(type_=ResponseStreamEvent, value=event))
        for out in state.handle_event(parsed):
            if out.type == "response.completed":
                completed = out.response
    usage = completed.usage
    heard = Heard(
        completed.output_text,
        [item.name for item in completed.output if item.type == "function_call"],
        Usage(usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens),
        list(
            dict.fromkeys([e["response"]["id"] for e in events if "response" in e] + [completed.id])
        ),
    )
    return heard, errors


def gemini_heard(stream: bytes) -> tuple[Heard, list[str]]:
    chunks = [orjson.loads(d) for d in sse_data(stream)]
    errors = []
    finished = [n for n, c in enumerate(chunks) if "finishReason" in c["candidates"][0]]
    if finished != [len(chunks) - 1]:
        errors.append(f"finish reasons in chunks {finished} of {len(chunks)}")
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    metadata = chunks[-1]["usageMetadata"]
    heard = Heard(
        "".join(p.get("text", "") for p in parts if not p.get("thought")),
        [p["functionCall"]["name"] for p in parts if "functionCall" in p],
        Usage(
            metadata["promptTokenCount"],
            metadata["candidatesTokenCount"] + metadata.get("thoughtsTokenCount", 0),
            metadata.get("cachedContentTokenCount"),
        ),
        sorted({c["responseId"] for c in chunks}),
    )
    return heard, errors


HEARD = {
    "openai.chat": chat_heard,
    "anthropic.messages": messages_heard,
    "openai.responses": responses_heard,
    "gemini.generate": gemini_heard,
}


def round_stream(shape: Shape, turn: Turn, number: int, count: int = 3) -> bytes:
    """`turn` streamed as the provider's round `number` of one request: its own reply id and
    item ids, as providers give each reply."""
    stream = shape.stream(turn, count)
    if number == 1:
        return stream
    for old in (b'"chatcmpl-1"', b'"msg_1"', b'"resp_1"', b'"resp-1"'):
        stream = stream.replace(old, old[:-2] + str(number).encode() + b'"')
    for prefix in (b'"msg_', b'"rs_', b'"fc_'):  # Responses items
        stream = stream.replace(prefix, prefix + b"r" + str(number).encode() + b"_")
    return stream


def cut(stream: bytes, sizes: list[int]) -> list[bytes]:
    """`stream` in reads of the given sizes (the last one repeated to the end)."""
    reads, at = [], 0
    for n in range(len(stream)):
        size = sizes[min(n, len(sizes) - 1)]
        if at >= len(stream):
            break
        reads.append(stream[at : at + size])
        at += size
    return reads


def spliced(
    shape: Shape, rounds: list[bytes], sizes: list[int], earlier: Usage | None = None
) -> bytes:
    """What the client gets of `rounds`, streamed one after the other, as brim relays them: a
    round that calls brim_restore is answered and the next one continues it."""
    splice = shape.wire.splice(earlier)
    out = b""
    for stream in rounds:
        reader = shape.wire.turn_reader()
        events = SseEvents()
        for piece in [*cut(stream, sizes), None]:
            got = events.end() if piece is None else events.feed(piece)
            for event in got:
                reader.take(event.json)
            out += splice.feed(got)
        reply = reader.reply()
        if not restore_of(shape, reply):
            return out + splice.release()
        out += splice.answer(shape.wire.usage(reply) or Usage())
    raise AssertionError("the last round calls brim_restore")


U1 = Usage(input=3000, output=40, cached_input=2048)
U2 = Usage(input=5200, output=60, cached_input=3000)
U3 = Usage(input=6100, output=35, cached_input=5000)
SPLICED = {
    "text, restore; text": (
        [Turn((Say("Let me fetch what was cut. "), RESTORE_CALL), U1)],
        Turn((Say("It says the key rotates on tuesdays."),), U2),
    ),
    "thinking, text, restore and a client call; text": (
        [
            Turn(
                (Think("The log was cut."), Say("Fetching the log. "), CLIENT_CALL, RESTORE_CALL),
                U1,
            )
        ],
        Turn((Say("The log shows a timeout."),), U2),
    ),
    "text, restore; text, restore; text": (
        [
            Turn((Say("First piece. "), RESTORE_CALL), U1),
            Turn((Say("Second piece. "), Call("call_r2", RESTORE.name, {"key": "r-2"})), U2),
        ],
        Turn((Say("Both read."),), U3),
    ),
    "text, restore; restore first; text": (
        [
            Turn((Say("Let me fetch what was cut. "), RESTORE_CALL), U1),
            Turn((Call("call_r2", RESTORE.name, {"key": "r-2"}),), U2),
        ],
        Turn((Say("Both read."),), U3),
    ),
    "text, restore; text and a client call": (
        [Turn((Say("Let me fetch what was cut. "), RESTORE_CALL), U1)],
        Turn((Say("Now b.py."), CLIENT_CALL), U2),
    ),
}


@each_shape
@pytest.mark.parametrize("name", list(SPLICED))
@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 120), min_size=1, max_size=30))
def test_a_restore_after_text_streams_on_as_one_reply(
    shape: Shape, name: str, sizes: list[int]
) -> None:
    answered, last = SPLICED[name]
    turns = [*answered, last]
    merged = spliced(shape, [round_stream(shape, t, n) for n, t in enumerate(turns, 1)], sizes)

    heard, errors = HEARD[shape.api](merged)
    assert errors == []
    texts = [s.text for t in turns for s in t.segments if isinstance(s, Say)]
    assert heard.text == "".join(texts)
    assert heard.calls == [c.name for c in last.calls]  # the last round's own calls only
    assert RESTORE.name.encode() not in merged and RESTORE_CALL.id.encode() not in merged
    total = Usage()
    for turn in turns:
        total = total.added(turn.usage)
    assert heard.usage == total
    first_id = {
        "openai.chat": "chatcmpl-1",
        "anthropic.messages": "msg_1",
        "openai.responses": "resp_1",
        "gemini.generate": "resp-1",
    }[shape.api]
    if shape.api == "openai.responses":  # its completed response: the last round's
        assert heard.ids == [first_id, f"resp_{len(turns)}"]
    else:
        assert heard.ids == [first_id]  # one reply, under the first round's id


@each_shape
def test_a_spliced_stream_adds_hidden_rounds_before_it(shape: Shape) -> None:
    """A final round that brim reached through hidden rounds (nothing relayed yet) and that
    restores after its text in turn: every round's usage, the hidden ones' too."""
    answered, last = SPLICED["text, restore; text"]
    earlier = Usage(input=900, output=10, cached_input=0)
    merged = spliced(
        shape,
        [round_stream(shape, t, n) for n, t in enumerate([*answered, last], 1)],
        [50],
        earlier,
    )
    heard, errors = HEARD[shape.api](merged)
    assert errors == []
    assert heard.usage == earlier.added(U1).added(U2)


NOT_RESTORED = {
    "text": Turn((Think("Nothing is missing."), Say("The bug is on line 3."))),
    "text, then a client call": Turn((Say("Reading b.py."), CLIENT_CALL)),
    "a client call first": Turn((CLIENT_CALL,)),
    "text, then two client calls": Turn(
        (Say("Reading two files."), CLIENT_CALL, Call("call_c2", "shell", {"cmd": "ls"}))
    ),
}


@each_shape
@pytest.mark.parametrize("name", list(NOT_RESTORED))
@settings(max_examples=10, deadline=None)
@given(sizes=st.lists(st.integers(1, 120), min_size=1, max_size=30))
def test_a_turn_that_does_not_restore_goes_on_byte_for_byte(
    shape: Shape, name: str, sizes: list[int]
) -> None:
    stream = shape.stream(NOT_RESTORED[name], 3)
    assert spliced(shape, [stream], sizes) == stream


@each_shape
def test_text_goes_on_as_it_comes_and_the_calls_are_held(shape: Shape) -> None:
    """Everything before the turn's first tool call goes to the client as soon as it is read;
    nothing from the call on, until the turn's end says whether it was brim's."""
    stream = shape.stream(Turn((Say("Let me fetch what was cut."), CLIENT_CALL)), 3)
    first_call = {
        "openai.chat": b'"tool_calls"',
        "anthropic.messages": b'"tool_use"',
        "openai.responses": b'"function_call"',
        "gemini.generate": b'"functionCall"',
    }[shape.api]
    # The event that opens the call starts after the blank line before its first mention.
    at = stream.index(first_call)
    start = max(stream.rfind(b"\n\n", 0, at), stream.rfind(b"\r\n\r\n", 0, at))
    start += 4 if stream[start : start + 4] == b"\r\n\r\n" else 2
    splice = shape.wire.splice(None)
    events = SseEvents()
    assert splice.feed(events.feed(stream[:at])) == stream[:start]
    assert splice.feed(events.feed(stream[at:])) == b""  # held to the end
    assert splice.feed(events.end()) + splice.release() == stream[start:]


def test_responses_final_output_has_every_item_when_the_provider_sends_none() -> None:
    shape = SHAPES[2]
    answered, last = SPLICED["text, restore; text"]
    rounds = [
        round_stream(shape, answered[0], 1),
        responses_stream(last, 3, empty_completed=True)
        .replace(b'"resp_1"', b'"resp_2"')
        .replace(b'"msg_', b'"msg_r2_'),
    ]
    heard, errors = responses_heard(spliced(shape, rounds, [4096]))
    assert errors == []
    assert heard.text == "Let me fetch what was cut. It says the key rotates on tuesdays."


def test_sse_events_keep_the_bytes_and_find_the_data() -> None:
    stream = b'event: a\ndata: {"x":1}\n\n: comment\n\ndata: [DONE]\r\n\r\ndata: {"y"'
    for size in (1, 2, 5, len(stream)):
        events = SseEvents()
        got = [e for n in range(0, len(stream), size) for e in events.feed(stream[n : n + size])]
        got += events.end()
        assert b"".join(event.raw for event in got) == stream
        assert [event.data for event in got] == [b'{"x":1}', b"", b"[DONE]", b'{"y"']
        assert [event.json for event in got] == [{"x": 1}, None, None, None]
    assert with_data(b"event: a\ndata: {}\r\n\r\n", b"[1]") == b"event: a\ndata: [1]\r\n\r\n"
