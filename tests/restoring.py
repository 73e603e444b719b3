"""brim with restore on, in front of a provider that uses `brim_restore`: what the restore tests
through a running brim share (tests/test_restore_e2e.py, tests/middleware/stages/test_restore.py).

`brim_config` puts brim in front of the provider on all four wire APIs, each model with a window
of `WINDOW` tokens. The request bodies (`chat_body`, `messages_body`, `responses_body`,
`gemini_body`) hold a long conversation of tool results (`logs`) that brim must cut to fit, so
it offers the tool. The same conversation to a `RETRY_MODELS` model fits the window brim is told
(`BELIEVED`) but not the provider's (`WINDOW`, in the name): the provider refuses it, and brim's
retry is the one that cuts. `Restoring` is the provider: a model that calls brim_restore with a key it
reads in the cut request, either as a `ScriptedProvider` session or turn by scripted turn.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from aiohttp import web

from brim.middleware.stages.restore import RESTORE_TOOL
from brim.proxy.config import BrimConfig
from tests.policies.wires import test_restore_shapes as shapes
from tests.scripted_provider import (
    WIRE_OF,
    Call,
    ScriptedProvider,
    stream_in_pieces,
    tool_uses,
)
from tests.scripted_provider import tool_names as tool_names  # for the restore tests

KEY_SHOWN = re.compile(r"sha256:[0-9a-f]{16}")  # a key as brim shows it in what it cut
WINDOW = 8_000
QUOTE = "I read: "
READ = {"type": "object", "properties": {"path": {"type": "string"}}}  # read_file's parameters
# The model each API is asked for (the scripted provider's name of the API → the model).
MODELS = {
    "chat": "gpt-restore",
    "messages": "claude-restore",
    "responses": "gpt-restore",
    "gemini": "gemini-restore",
}
# The same models, whose real window (the provider's, the number after the name's last dash) is
# smaller than what brim is told (`BELIEVED`): brim's retry cuts what the provider refuses.
RETRY_MODELS = {api: f"{model}-{WINDOW}" for api, model in MODELS.items()}
BELIEVED = 4 * WINDOW
SHAPE_OF = {shape.api: shape for shape in shapes.SHAPES}  # brim's name of an API → its shape
Items = list[dict[str, Any]]


def logs(tag: str = "build", turns: int = 12, lines: int = 55) -> list[str]:
    """`turns` tool results of ~600 tokens each (`lines` of ~11), every line naming its own
    result."""
    return [
        "\n".join(f"{tag} log {turn}.{i}: compiled module without warnings" for i in range(lines))
        for turn in range(turns)
    ]


# ---- the client's request: a task, a read_file call answered by each text, a question --------

TASK = "Find out why the nightly build fails."
QUESTION = "What should we fix first?"


def chat_body(texts: list[str], *, stream: bool = False, model: str = "") -> dict[str, Any]:
    items: Items = [{"role": "user", "content": TASK}]
    for n, text in enumerate(texts):
        arguments = orjson.dumps({"path": f"log{n}.txt"}).decode()
        function = {"name": "read_file", "arguments": arguments}
        call = {"id": f"call_{n}", "type": "function", "function": function}
        items += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": text},
        ]
    items.append({"role": "user", "content": QUESTION})
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": READ}}]
    body = {"model": model or MODELS["chat"], "messages": items, "tools": tools}
    return (body | {"stream": True, "stream_options": {"include_usage": True}}) if stream else body


def messages_body(texts: list[str], *, stream: bool = False, model: str = "") -> dict[str, Any]:
    items: Items = [{"role": "user", "content": TASK}]
    for n, text in enumerate(texts):
        use: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file"}
        use["input"] = {"path": f"log{n}.txt"}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text}
        items += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    items[-1]["content"].append({"type": "text", "text": QUESTION})
    body = {
        "model": model or MODELS["messages"],
        "max_tokens": 1_000,
        "messages": items,
        "tools": [{"name": "read_file", "input_schema": READ}],
    }
    return (body | {"stream": True}) if stream else body


def responses_body(texts: list[str], *, stream: bool = False, model: str = "") -> dict[str, Any]:
    items: Items = [{"role": "user", "content": TASK}]
    for n, text in enumerate(texts):
        arguments = orjson.dumps({"path": f"log{n}.txt"}).decode()
        items += [
            {"type": "function_call", "call_id": f"call_{n}", "name": "read_file"}
            | {"arguments": arguments},
            {"type": "function_call_output", "call_id": f"call_{n}", "output": text},
        ]
    items.append({"role": "user", "content": QUESTION})
    tools = [{"type": "function", "name": "read_file", "parameters": READ}]
    body = {"model": model or MODELS["responses"], "input": items, "tools": tools}
    return (body | {"stream": True}) if stream else body


def gemini_body(texts: list[str]) -> dict[str, Any]:
    """(Gemini names the model, and whether to stream, in the URL.)"""
    contents: Items = [{"role": "user", "parts": [{"text": TASK}]}]
    for n, text in enumerate(texts):
        call = {"functionCall": {"name": "read_file", "args": {"path": f"log{n}.txt"}}}
        answer = {"functionResponse": {"name": "read_file", "response": {"output": text}}}
        contents += [{"role": "model", "parts": [call]}, {"role": "user", "parts": [answer]}]
    contents.append({"role": "user", "parts": [{"text": QUESTION}]})
    declaration = {"name": "read_file", "parameters": READ}
    return {"contents": contents, "tools": [{"functionDeclarations": [declaration]}]}


# ---- brim, and the provider behind it ---------------------------------------------------------


def brim_config(
    url: str,
    *,
    upstream: dict[str, Any] | None = None,
    restore: dict[str, Any] | None = None,
    windows: dict[str, int] | None = None,
    **sections: Any,
) -> BrimConfig:
    """brim in front of the provider at `url` on all four APIs, restore on: `upstream` and
    `restore` add to every upstream's settings and to restore's, `windows` are more models with
    the window brim is told, `sections` are the other sections."""
    more = upstream or {}
    return BrimConfig(
        upstreams={
            "openai": {"api": "openai", "base_url": f"{url}/v1", **more},
            "anthropic": {"api": "anthropic", "base_url": url, **more},
            "gemini": {"api": "gemini", "base_url": url, **more},
        },
        routes={"claude-*": "anthropic", "gemini-*": "gemini", "*": "openai"},
        models={
            **{
                model: {"context_window": WINDOW, "max_output": 1_000}
                for model in dict.fromkeys(MODELS.values())
            },
            **{
                model: {"context_window": BELIEVED, "max_output": 1_000}
                for model in dict.fromkeys(RETRY_MODELS.values())
            },
            **{
                model: {"context_window": window, "max_output": 1_000}
                for model, window in (windows or {}).items()
            },
        },
        restore={"enabled": True, **(restore or {})},
        **sections,
    )


CONVERSATION = {"chat": "messages", "messages": "messages", "responses": "input"}


def conversation(api: str, body: dict[str, Any]) -> Items:
    """A request's conversation (the scripted provider's name of the API)."""
    return list(body[CONVERSATION.get(api, "contents")])


def shown_keys(body: dict[str, Any]) -> list[str]:
    """The keys a request shows (in placeholders, notices and summaries), in order."""
    return KEY_SHOWN.findall(orjson.dumps(body).decode())


def restored(api: str, body: dict[str, Any]) -> list[str]:
    """The results of the brim_restore calls in a request, as text (Gemini's functionResponse
    carries it as `{"output": text}`)."""
    texts = []
    for use in tool_uses(api, body, RESTORE_TOOL.name):
        text = use.result or ""
        if api == "gemini":
            text = orjson.loads(text)["output"]
        texts.append(text)
    return texts


@dataclass
class Restoring(ScriptedProvider):
    """A model that uses brim_restore: each call of it asks for `key` (None: the first key the
    request shows, of those `among` if given). It checks, counts and records every request as a `ScriptedProvider` does.

    Without a `script` it answers whole or streamed, as asked: while fewer than `reads` calls
    were made, a request that offers the tool gets a call of it; every other request gets
    `QUOTE` and the last restore result it carries (or "ok"). With one, it answers request N with
    `script[N]` (the last one again after it): a turn, streamed the way its API streams it (the
    bytes kept in `sent`), or an HTTP status to fail with."""

    tool: str = RESTORE_TOOL.name
    arguments: Callable[[int], dict[str, Any]] = lambda step: {}
    reads: int = 1
    final: str = ""
    key: str | None = None
    among: frozenset[str] = frozenset()
    script: list[shapes.Turn | int] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.arguments = lambda step: self._asked(self.calls[-1].body)  # just admitted

    def _asked(self, body: dict[str, Any]) -> dict[str, Any]:
        shown = shown_keys(body)
        if self.among:
            shown = [key for key in shown if key in self.among]
        return {"key": self.key or (shown[0] if shown else "none shown")}

    def _text_of(self, call: Call) -> str:
        results = restored(call.api, call.body)
        return QUOTE + results[-1] if results else "ok"

    async def _reply_instead(self, request: web.Request, call: Call) -> web.StreamResponse | None:
        if not self.script:
            return None
        step = self.script[min(len(self.calls), len(self.script)) - 1]
        if isinstance(step, int):
            error = {"type": "api_error", "message": "the provider is down", "code": step}
            return web.json_response({"type": "error", "error": error}, status=step)
        segments = tuple(
            replace(s, arguments=self._asked(call.body))
            if isinstance(s, shapes.Call) and s.name == self.tool
            else s
            for s in step.segments
        )
        turn = shapes.Turn(segments, step.usage)
        stream = shapes.round_stream(SHAPE_OF[WIRE_OF[call.api]], turn, len(self.calls))
        self.sent.append(stream)
        return await stream_in_pieces(request, stream)
