"""Session files: conversations brim's authors did not write, as the fidelity bench reads them.

A folder of sessions (`python -m bench.fidelity --sessions DIR`) holds one JSON file per session,
`NAME.json` or gzipped `NAME.json.gz`:

    {
      "format": "brim-fidelity-session/1",
      "name": "claude-code-itsdangerous",      # unique in the folder (default: the file name)
      "family": "real-cli",                    # the rows it is reported under
      "api": "anthropic.messages",             # openai.chat | anthropic.messages |
                                               # openai.responses | gemini.generate
      "body": { ... },                         # one request body in that API: the whole
                                               # conversation, as the client last sent it
      "facts": ["58213", "40917"],             # optional: strings planted in it, to be kept
      "source": "how it was made"              # optional, free text
    }

The body is the session: the bench replays it as it grew (the request before each assistant
turn is the body cut there), cuts it whole to budgets 1.3× to 10× smaller, and finds each
assistant turn's evidence (`bench.evidence`) in it. On its own API it is sent as it is, unknown
fields and all; on the other three it goes through the neutral form (`neutral`): system prompt,
function tools and turns, rendered by `bench.sessions` — what does not fit that form (thinking
and reasoning items, images, server tools, cache markers) stays only on the session's own API.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.sessions import Call, Session, Tool, Turn
from brim.policies.wires import WIRES

FORMAT = "brim-fidelity-session/1"
SUFFIXES = (".json", ".json.gz")


class SessionFileError(ValueError):
    """A session file the bench cannot read; the message names the file and the field."""


@dataclass
class SessionFile:
    name: str
    family: str
    api: str
    body: dict[str, Any]
    facts: list[str] = field(default_factory=list)
    source: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "family": self.family,
            "api": self.api,
            "source": self.source,
            "facts": self.facts,
            "body": self.body,
        }


def save(folder: Path, session: SessionFile) -> Path:
    """Write `session` as `folder/NAME.json.gz` (gzip without a timestamp: the same session
    makes the same bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{session.name}.json.gz"
    data = orjson.dumps(session.as_json(), option=orjson.OPT_INDENT_2)
    path.write_bytes(gzip.compress(data, mtime=0))
    return path


def read(path: Path) -> SessionFile:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SessionFileError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SessionFileError(f"{path}: `format` must be {FORMAT!r}")
    name = data.get("name") or path.name.removesuffix(".gz").removesuffix(".json")
    api = data.get("api")
    if api not in WIRES:
        raise SessionFileError(f"{path}: `api` must be one of {', '.join(WIRES)}, not {api!r}")
    body = data.get("body")
    if not isinstance(body, dict) or not WIRES[api].conversation(body):
        raise SessionFileError(f"{path}: `body` must be a {api} request with a conversation")
    facts = data.get("facts") or []
    if not isinstance(facts, list) or not all(isinstance(f, str) and f for f in facts):
        raise SessionFileError(f"{path}: `facts` must be a list of non-empty strings")
    family = data.get("family") or "sessions"
    if not isinstance(family, str) or not isinstance(name, str):
        raise SessionFileError(f"{path}: `name` and `family` must be strings")
    return SessionFile(name, family, api, body, list(facts), str(data.get("source") or ""))


def load(folder: Path) -> list[SessionFile]:
    """Every session file in `folder` (not its subfolders), by file name."""
    if not folder.is_dir():
        raise SessionFileError(f"{folder}: not a folder of session files")
    paths = sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES) and p.is_file())
    files = [read(path) for path in paths]
    names = [f.name for f in files]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SessionFileError(f"{folder}: session names used twice: {', '.join(twice)}")
    return files


# ---------------------------------------------------------------- the neutral form of a body


@dataclass(frozen=True)
class Parsed:
    """A body in the neutral form, and where each neutral turn starts among the body's own
    conversation items (`starts[t]`: the index of the item turn `t` begins in)."""

    session: Session
    starts: tuple[int, ...]


def text_of(content: Any) -> str:
    """Text content as one string: a string as it is, text parts joined, anything else as JSON
    (an image as a short mark)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping) and "image" in str(part.get("type", "")):
                parts.append("[image]")
            elif isinstance(part, str):
                parts.append(part)
            else:
                parts.append(orjson.dumps(part).decode())
        return "\n".join(parts)
    return orjson.dumps(content).decode()


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw or "{}")
        except orjson.JSONDecodeError:
            return {"input": raw}
        return value if isinstance(value, dict) else {"input": value}
    return {}


def _call_id(raw: Any, index: int) -> str:
    text = str(raw or f"call_{index}")
    return "call_" + text.removeprefix("toolu_").removeprefix("call_")


class _Builder:
    """Turns collected in order; an assistant turn's calls get their results as they come.
    Consecutive user items make one user turn; an item the form has no place for (a reasoning
    item) marks where the next assistant turn starts."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.starts: list[int] = []
        self.results: dict[str, str] = {}
        self.mark: int | None = None

    def user(self, text: str, at: int) -> None:
        if not text:
            return
        last = self.turns[-1] if self.turns else None
        if last is not None and last.role == "user":
            self.turns[-1] = Turn("user", f"{last.text}\n\n{text}")
            return
        self.turns.append(Turn("user", text))
        self.starts.append(at)

    def other(self, at: int) -> None:
        if self.mark is None:
            self.mark = at

    def assistant(self, text: str, calls: Sequence[Call], at: int, *, join: bool = False) -> None:
        last = self.turns[-1] if self.turns else None
        answered = last is not None and any(c.id in self.results for c in last.calls)
        if join and last is not None and last.role == "assistant" and not answered:
            merged = "\n".join(t for t in (last.text, text) if t) or None
            self.turns[-1] = Turn("assistant", merged, (*last.calls, *calls))
            return
        self.turns.append(Turn("assistant", text or None, tuple(calls)))
        self.starts.append(at if self.mark is None else self.mark)
        self.mark = None

    def result(self, call_id: str, text: str) -> None:
        self.results[call_id] = text

    def done(self) -> tuple[list[Turn], tuple[int, ...]]:
        turns = [
            Turn(
                turn.role,
                turn.text,
                tuple(
                    Call(c.id, c.name, c.arguments, self.results.get(c.id, "")) for c in turn.calls
                ),
            )
            for turn in self.turns
        ]
        return turns, tuple(self.starts)


def _tools(specs: Iterator[tuple[Any, Any, Any]]) -> list[Tool]:
    return [
        Tool(str(name), str(description or ""), dict(parameters or {"type": "object"}))
        for name, description, parameters in specs
        if name
    ]


def _chat(body: Mapping[str, Any]) -> tuple[str, list[Tool], _Builder]:
    build = _Builder()
    system: list[str] = []
    for index, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        if role in ("system", "developer") and not build.turns:
            system.append(text_of(message.get("content")))
        elif role == "assistant":
            calls = [
                Call(
                    _call_id(c.get("id"), n),
                    str((c.get("function") or {}).get("name")),
                    _arguments((c.get("function") or {}).get("arguments")),
                    "",
                )
                for n, c in enumerate(message.get("tool_calls") or [])
            ]
            build.assistant(text_of(message.get("content")), calls, index)
        elif role == "tool":
            build.result(_call_id(message.get("tool_call_id"), 0), text_of(message.get("content")))
        else:
            build.user(text_of(message.get("content")), index)
    tools = _tools(
        (f.get("name"), f.get("description"), f.get("parameters"))
        for t in body.get("tools") or []
        if isinstance(f := t.get("function"), Mapping)
    )
    return "\n\n".join(system), tools, build


def _messages(body: Mapping[str, Any]) -> tuple[str, list[Tool], _Builder]:
    build = _Builder()
    for index, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        if message.get("role") == "assistant":
            text = "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            calls = [
                Call(_call_id(b.get("id"), n), str(b.get("name")), _arguments(b.get("input")), "")
                for n, b in enumerate(blocks)
                if b.get("type") == "tool_use"
            ]
            build.assistant(text, calls, index)
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                build.result(_call_id(block.get("tool_use_id"), 0), text_of(block.get("content")))
        build.user("\n".join(text_of([b]) for b in blocks if b.get("type") != "tool_result"), index)
    tools = _tools(
        (t.get("name"), t.get("description"), t.get("input_schema"))
        for t in body.get("tools") or []
        if "input_schema" in t
    )
    return text_of(body.get("system")), tools, build


def _responses(body: Mapping[str, Any]) -> tuple[str, list[Tool], _Builder]:
    build = _Builder()
    system = [text_of(body.get("instructions"))] if body.get("instructions") else []
    for index, item in enumerate(body.get("input") or []):
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role in ("system", "developer") and not build.turns:
            system.append(text_of(item.get("content")))
        elif kind == "message" and role == "assistant":
            build.assistant(text_of(item.get("content")), [], index, join=True)
        elif kind == "message":
            build.user(text_of(item.get("content")), index)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            raw = item.get("arguments", item.get("input", item.get("action")))
            call = Call(
                _call_id(item.get("call_id"), index), str(item.get("name")), _arguments(raw), ""
            )
            build.assistant("", [call], index, join=True)
        elif kind.endswith("_call_output"):
            build.result(_call_id(item.get("call_id"), 0), text_of(item.get("output")))
        else:  # reasoning and other items: the form has no place for them
            build.other(index)
    tools: list[Tool] = []
    for tool in body.get("tools") or []:
        inner = tool.get("tools") if tool.get("type") == "namespace" else [tool]
        tools += _tools(
            (t.get("name"), t.get("description"), t.get("parameters"))
            for t in inner or []
            if t.get("type") == "function"
        )
    return "\n\n".join(system), tools, build


def _gemini(body: Mapping[str, Any]) -> tuple[str, list[Tool], _Builder]:
    build = _Builder()
    open_calls: list[Call] = []
    for index, content in enumerate(body.get("contents") or []):
        parts = content.get("parts") or []
        if content.get("role") == "model":
            calls = [
                Call(
                    _call_id(p["functionCall"].get("id") or f"{index}_{n}", n),
                    str(p["functionCall"].get("name")),
                    _arguments(p["functionCall"].get("args")),
                    "",
                )
                for n, p in enumerate(parts)
                if "functionCall" in p
            ]
            text = "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))
            build.assistant(text, calls, index)
            open_calls = list(calls)
            continue
        for part in parts:
            response = part.get("functionResponse")
            if not isinstance(response, Mapping):
                continue
            named = [c for c in open_calls if c.name == response.get("name")]
            call_id = (
                _call_id(response["id"], 0) if response.get("id") else (named or open_calls)[0].id
            )
            open_calls = [c for c in open_calls if c.id != call_id]
            result = response.get("response")
            if isinstance(result, Mapping) and set(result) <= {"output", "content", "result"}:
                result = next(iter(result.values()), "")
            build.result(call_id, text_of(result))
        build.user("\n".join(p["text"] for p in parts if isinstance(p.get("text"), str)), index)
    instruction = body.get("systemInstruction") or body.get("system_instruction") or {}
    system = "\n".join(p.get("text", "") for p in instruction.get("parts") or [])
    declarations = [
        d
        for tool in body.get("tools") or []
        for d in tool.get("functionDeclarations") or tool.get("function_declarations") or []
    ]
    tools = _tools(
        (d.get("name"), d.get("description"), d.get("parameters") or d.get("parametersJsonSchema"))
        for d in declarations
    )
    return system, tools, build


PARSERS = {
    "openai.chat": _chat,
    "anthropic.messages": _messages,
    "openai.responses": _responses,
    "gemini.generate": _gemini,
}


def neutral(api: str, body: Mapping[str, Any], seed: int = 0) -> Parsed:
    """`body` (of `api`) in the neutral form, and where its turns start among its items."""
    system, tools, build = PARSERS[api](body)
    turns, starts = build.done()
    return Parsed(Session(seed, system, tools, turns), starts)
