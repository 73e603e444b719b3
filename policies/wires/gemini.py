"""Gemini generateContent (Gemini CLI): the conversation is `contents`; `systemInstruction`
and `tools` are fixed cost. The model and streaming are in the URL
(`/v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`), not the body.

Counting: 3 tokens per turn plus its text; function calls and responses as their JSON; an image
or file part at Gemini's flat 258 tokens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

import orjson
from pydantic import Field, ValidationError
from typing_extensions import TypedDict

from brim.policies.conversation import Dialect, ToolResult, Unit
from brim.policies.images import GEMINI_IMAGE_TOKENS
from brim.policies.tokens import PER_MESSAGE, PER_TOOL_CALL, RAW, as_text, token_count
from brim.policies.wires.base import (
    NO_RESULT,
    BodyError,
    ErrorInfo,
    FieldConversation,
    GenAiMessage,
    ModelCall,
    NotServed,
    RequestFacts,
    Splice,
    Target,
    ToolCall,
    ToolSpec,
    TurnReader,
    Usage,
    answered_in_order,
    body_check,
    first_error,
    first_of,
    json_object,
    largest_part_text,
    listed,
    model_name,
    text_part,
    whole_number,
    with_part_text,
)

if TYPE_CHECKING:
    import tiktoken

    from brim.policies.tokens import TokenCounter


def _parts(item: Any) -> list[Any]:
    parts = item.get("parts") if isinstance(item, Mapping) else None
    return list(parts) if isinstance(parts, list) else []


class GeminiDialect:
    """Gemini generateContent `contents`: a `model` turn's `functionCall` parts are answered by
    the `functionResponse` parts of the very next `user` turn (by `id` where present, else by
    name, in order); the two turns are one unit. `thought` parts and `thoughtSignature`s are never
    edited. `systemInstruction` and `tools` are fixed cost."""

    name = "gemini.generate"

    @staticmethod
    def role(item: Any) -> str:
        return str(item.get("role", "user")) if isinstance(item, Mapping) else ""

    @staticmethod
    def _call_key(call: Mapping[str, Any]) -> str:
        return str(call.get("id") or call.get("name") or "")

    def calls(self, item: Any) -> list[str]:
        if self.role(item) != "model":
            return []
        return [
            self._call_key(p["functionCall"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        ]

    def call_arguments(self, item: Any) -> list[tuple[str, Any]]:
        """(call key, `args`) for each `functionCall` `calls` lists, keyed as it keys them."""
        if self.role(item) != "model":
            return []
        return [
            (self._call_key(p["functionCall"]), p["functionCall"].get("args"))
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        ]

    def answers(self, item: Any) -> list[str]:
        if self.role(item) != "user":
            return []
        return [
            self._call_key(p["functionResponse"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionResponse"), Mapping)
        ]

    def units(self, items: Sequence[Any]) -> list[Unit]:
        units: list[Unit] = []
        index = 0
        while index < len(items):
            if self.calls(items[index]):
                end = (
                    index + 2
                    if index + 1 < len(items) and self.answers(items[index + 1])
                    else index + 1
                )
                units.append(Unit("tools", index, end))
                index = end
                continue
            kind = (
                "orphan"
                if self.answers(items[index])
                else ("assistant" if self.role(items[index]) == "model" else "user")
            )
            units.append(Unit(kind, index, index + 1))  # type: ignore[arg-type]
            index += 1
        return units

    def tools_by_call(self, items: Sequence[Any]) -> dict[str, str]:
        return {
            self._call_key(p["functionCall"]): str(p["functionCall"].get("name", "tool"))
            for item in items
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("functionCall"), Mapping)
        }

    def tool_results(self, item: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]:
        results = []
        for part in _parts(item) if self.role(item) == "user" else []:
            response = part.get("functionResponse") if isinstance(part, Mapping) else None
            if isinstance(response, Mapping):
                value = response.get("response")
                if (  # `{"output": text}`, the shape `with_tool_result` writes: the text
                    isinstance(value, Mapping)
                    and len(value) == 1
                    and isinstance(value.get("output"), str)
                ):
                    value = value["output"]
                text = value if isinstance(value, str) else orjson.dumps(value).decode()
                results.append(
                    ToolResult(self._call_key(response), str(response.get("name", "tool")), text)
                )
        return results

    def with_tool_result(self, item: Any, call_id: str, text: str) -> Any:
        parts = [
            {**p, "functionResponse": {**p["functionResponse"], "response": {"output": text}}}
            if isinstance(p, Mapping)
            and isinstance(p.get("functionResponse"), Mapping)
            and self._call_key(p["functionResponse"]) == call_id
            else p
            for p in _parts(item)
        ]
        return {**item, "parts": parts}

    def text(self, item: Any) -> str:
        return "\n".join(
            str(p["text"])
            for p in _parts(item)
            if isinstance(p, Mapping) and isinstance(p.get("text"), str) and not p.get("thought")
        )

    def largest_text(self, item: Any) -> str | None:
        if any(
            isinstance(p, Mapping) and (p.get("thought") or p.get("thoughtSignature"))
            for p in _parts(item)
        ):
            return None
        texts = [largest_part_text(_parts(item)) or ""]
        texts += [result.text for result in self.tool_results(item, {})]  # as results read
        largest = max(texts, key=len)
        return largest or None

    def with_largest_text(self, item: Any, text: str) -> Any:
        """`item` with its largest text — a text part's, or a function response's as
        `tool_results` reads it — rewritten to `text` (a response as `with_tool_result` writes
        it)."""
        largest = self.largest_text(item)
        if largest == largest_part_text(_parts(item)):
            return {**item, "parts": with_part_text(_parts(item), largest, text)}
        for result in self.tool_results(item, {}):
            if result.text == largest:
                return self.with_tool_result(item, result.call_id, text)
        return item

    def notice(self, text: str) -> Any:
        return {"role": "user", "parts": [{"text": text}]}

    def placeholder_result(self, call_id: str, text: str = NO_RESULT) -> Any:
        return {"role": "user", "parts": [_no_response(call_id, text)]}

    def violations(self, items: Sequence[Any]) -> list[str]:
        problems: list[str] = []
        for index, item in enumerate(items):
            if self.role(item) not in ("user", "model"):
                problems.append(f"contents[{index}]: role must be user or model")
            answered = self.answers(item)
            if answered:
                previous = self.calls(items[index - 1]) if index else []
                if sorted(answered) != sorted(previous):
                    problems.append(
                        f"contents[{index}]: function responses {answered} do not answer the calls {previous} of the turn before"
                    )
            calls = self.calls(item)
            if calls:
                following = self.answers(items[index + 1]) if index + 1 < len(items) else []
                if sorted(following) != sorted(calls):
                    problems.append(
                        f"contents[{index}]: function calls {calls} are not answered by the next turn"
                    )
        return problems

    def repaired(self, items: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """Responses that answer nothing dropped; unanswered calls given a placeholder."""
        out: list[Any] = []
        done: list[str] = []
        for item in items:
            open_calls = self.calls(out[-1]) if out else []
            answered = self.answers(item)
            if answered or open_calls:
                kept = [
                    p
                    for p in _parts(item)
                    if not (
                        isinstance(p, Mapping)
                        and isinstance(p.get("functionResponse"), Mapping)
                        and self._call_key(p["functionResponse"]) not in open_calls
                    )
                ]
                have = [
                    self._call_key(p["functionResponse"])
                    for p in kept
                    if isinstance(p, Mapping) and isinstance(p.get("functionResponse"), Mapping)
                ]
                missing = [c for c in open_calls if c not in have]
                if len(kept) != len(_parts(item)):
                    done.append("dropped function responses that answer no call")
                if missing and self.role(item) == "user":
                    kept = [*(_no_response(c) for c in missing), *kept]
                    done.append(f"added responses for unanswered calls {missing}")
                elif missing:  # the next turn is not the user's: answer in a turn of our own
                    out.append({"role": "user", "parts": [_no_response(c) for c in missing]})
                    done.append(f"added responses for unanswered calls {missing}")
                if not kept:
                    continue
                item = {**item, "parts": kept} if kept != _parts(item) else item
            out.append(item)
        if out and self.calls(out[-1]):
            missing = self.calls(out[-1])
            out.append({"role": "user", "parts": [_no_response(c) for c in missing]})
            done.append(f"added responses for unanswered calls {missing}")
        return out, done


def _no_response(call: str, text: str = NO_RESULT) -> dict[str, Any]:
    return {"functionResponse": {"name": call, "response": {"output": text}}}


class _Content(TypedDict):
    role: NotRequired[Literal["user", "model"] | None]
    parts: Annotated[list[dict[str, Any]], Field(min_length=1)]


class _GenerateRequest(TypedDict):
    contents: Annotated[list[_Content], Field(min_length=1)]


_check_generate = body_check(_GenerateRequest)


# Google's error statuses by HTTP status.
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _genai_part(part: Any) -> dict[str, Any] | None:
    if not isinstance(part, Mapping):
        return None
    if isinstance(part.get("text"), str):
        kind = "reasoning" if part.get("thought") else "text"
        return {"type": kind, "content": part["text"]}
    if isinstance(part.get("functionCall"), Mapping):
        call = part["functionCall"]
        return {
            "type": "tool_call",
            "id": call.get("id"),
            "name": call.get("name"),
            "arguments": call.get("args"),
        }
    if isinstance(part.get("functionResponse"), Mapping):
        response = part["functionResponse"]
        return {
            "type": "tool_call_response",
            "id": response.get("id") or response.get("name"),
            "response": response.get("response"),
        }
    if isinstance(part.get("inlineData"), Mapping):
        data = part["inlineData"]
        return {
            "type": "blob",
            "mime_type": data.get("mimeType"),
            "content": f"[{len(str(data.get('data', '')))} bytes]",
        }
    if isinstance(part.get("fileData"), Mapping):
        data = part["fileData"]
        return {"type": "uri", "mime_type": data.get("mimeType"), "uri": data.get("fileUri")}
    return None


# Tools brim answers itself --------------------------------------------------------------------


def _reply_content(reply: Mapping[str, Any]) -> Mapping[str, Any]:
    content = first_of(reply.get("candidates")).get("content")
    return content if isinstance(content, Mapping) else {}


def _reply_calls(parts: Sequence[Any]) -> list[tuple[int, ToolCall]]:
    """(part index, call) for each `functionCall` part. A call without an `id` (Gemini pairs
    those by name and order) gets one made of its place among the calls and its name, so the
    same reply always gives the same ids."""
    found: list[tuple[int, ToolCall]] = []
    for index, part in enumerate(parts):
        call = part.get("functionCall") if isinstance(part, Mapping) else None
        if not isinstance(call, Mapping):
            continue
        name = str(call.get("name", ""))
        call_id = str(call.get("id") or f"{name}#{len(found)}")
        found.append((index, ToolCall(call_id, name, json_object(call.get("args")))))
    return found


def _text_only(part: Any) -> bool:
    """A part that is text and nothing else (no signature): the one kind streamed chunks may be
    joined into."""
    return (
        isinstance(part, Mapping)
        and isinstance(part.get("text"), str)
        and set(part) <= {"text", "thought"}
    )


def _usage_written(existing: Any, usage: Usage) -> dict[str, Any]:
    """`existing` (a `usageMetadata`, or None) with `usage` written into it: output is
    `candidatesTokenCount` + `thoughtsTokenCount` (thoughts kept, cut if the new output is
    smaller); the total follows."""
    out: dict[str, Any] = dict(existing) if isinstance(existing, Mapping) else {}
    if usage.input is not None:
        out["promptTokenCount"] = usage.input
    if usage.cached_input is not None:
        out["cachedContentTokenCount"] = usage.cached_input
    if usage.output is not None:
        thoughts = whole_number(out.get("thoughtsTokenCount")) or 0
        if thoughts > usage.output:
            thoughts = out["thoughtsTokenCount"] = usage.output
        out["candidatesTokenCount"] = usage.output - thoughts
    prompt = whole_number(out.get("promptTokenCount"))
    candidates = whole_number(out.get("candidatesTokenCount"))
    if prompt is not None and candidates is not None:
        out["totalTokenCount"] = (
            prompt
            + candidates
            + (whole_number(out.get("thoughtsTokenCount")) or 0)
            + (whole_number(out.get("toolUsePromptTokenCount")) or 0)
        )
    return out


class GeminiTurnReader(TurnReader):
    """`streamGenerateContent?alt=sse` chunks (each a `GenerateContentResponse` holding the
    parts made since the last one) into one reply: adjacent text-only parts of one kind
    (thought or not) joined, every other part — function calls, parts that carry a
    `thoughtSignature`, even with empty text — kept whole and in order, as Gemini needs them
    back; the last chunk's usage, finish reason and envelope."""

    def __init__(self) -> None:
        super().__init__()
        self._envelope: dict[str, Any] = {}
        self._candidate: dict[str, Any] = {}
        self._role = "model"
        self._parts: list[dict[str, Any]] = []

    def _event(self, chunk: dict[str, Any]) -> None:
        for key, value in chunk.items():
            if key != "candidates":
                self._envelope[key] = value  # usageMetadata, modelVersion, responseId: latest
        candidate = first_of(chunk.get("candidates"))
        for key, value in candidate.items():
            if key != "content":
                self._candidate[key] = value  # finishReason, safetyRatings, …: latest
        content = candidate.get("content")
        if not isinstance(content, Mapping):
            return
        self._role = str(content.get("role") or self._role)
        for part in _parts(content):
            if isinstance(part, Mapping):
                self._add(dict(part))

    def _add(self, part: dict[str, Any]) -> None:
        if "functionCall" in part:
            self._start("call")
        elif part.get("text") or not ("text" in part or "thoughtSignature" in part):
            self._start("text")  # text, or an image, code, …
        last = self._parts[-1] if self._parts else None
        if (
            last is not None
            and _text_only(last)
            and _text_only(part)
            and bool(last.get("thought")) == bool(part.get("thought"))
        ):
            last["text"] += part["text"]
        else:
            self._parts.append(part)

    def reply(self) -> dict[str, Any]:
        candidate = {
            "content": {"role": self._role, "parts": [dict(part) for part in self._parts]},
            **self._candidate,
        }
        candidate.setdefault("index", 0)
        return {"candidates": [candidate], **self._envelope}


def _chunk_parts(chunk: Mapping[str, Any]) -> list[Any]:
    return _parts(_reply_content(chunk))


def _without_calls(candidate: Any) -> Any:
    """A chunk's candidate without its function calls and its finish reason."""
    if not isinstance(candidate, Mapping):
        return candidate
    out = {k: v for k, v in candidate.items() if k != "finishReason"}
    content = candidate.get("content")
    if isinstance(content, Mapping):
        parts = [p for p in _parts(content) if not (isinstance(p, Mapping) and "functionCall" in p)]
        out["content"] = {**content, "parts": parts}
    return out


class GeminiSplice(Splice):
    """Gemini rounds as one `streamGenerateContent` stream: a round that called brim_restore
    loses its function calls (with the signature they carry) and its finish reason, a chunk
    left without parts is dropped; a later round's chunks go on under the first round's
    `responseId`, each usage figure with every earlier round's added (Gemini reports the usage
    so far on every chunk)."""

    def __init__(self, earlier: Usage | None) -> None:
        super().__init__(earlier, GEMINI.usage, GEMINI.with_usage)
        self._id: Any = None  # the first round's responseId

    def _calls(self, event: dict[str, Any]) -> bool:
        return any(
            isinstance(part, Mapping) and "functionCall" in part for part in _chunk_parts(event)
        )

    def _relayed(self, event: dict[str, Any]) -> dict[str, Any] | None:
        if self._id is None:
            self._id = event.get("responseId")
        out = event
        if self.rounds and self._id is not None and event.get("responseId") not in (None, self._id):
            out = {**event, "responseId": self._id}
        return self._plus_before(out)

    def _kept(self, event: dict[str, Any]) -> dict[str, Any] | None:
        candidates = event.get("candidates")
        if not isinstance(candidates, list):
            return None
        kept = [_without_calls(candidate) for candidate in candidates]
        if not _chunk_parts({"candidates": kept}):
            return None
        return self._relayed({**event, "candidates": kept})

    def _next_round(self) -> None:
        """Nothing numbers this API's chunks."""


METHODS = ("generateContent", "streamGenerateContent", "countTokens")
# A model id as it may stand in the URL (brim's own ids too: `[cli]gemini:flash`): the path
# brim sends upstream is built from it, so it holds nothing a path is made of (`/`, which an
# escaped slash decodes to, `%`, `?`, `#`, or a leading `.`).
MODEL_ID = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9._:@\[\]-]{0,127}")


class GeminiWire(FieldConversation):
    name = "gemini.generate"
    conversation_field = "contents"
    operation = "generate_content"
    dialect: Dialect = GeminiDialect()
    serving: Mapping[str, frozenset[str]] = MappingProxyType(
        {
            "gemini.generate": frozenset({"gemini"}),
            "gemini.count_tokens": frozenset({"gemini"}),
        }
    )

    def owns_path(self, path: str) -> bool:
        return path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path)

    # `{target}`: `MODEL:METHOD`, one of `METHODS`; the key travels in `x-goog-api-key` or
    # `?key=`, both forwarded (or replaced by the upstream's configured key).
    routes: tuple[str, ...] = ("/v1beta/models/{target}", "/v1/models/{target}")

    def target(self, route: str, url_part: str | None) -> Target:
        model, _, method = (url_part or "").rpartition(":")
        if method not in METHODS or not model:
            raise NotServed(f"Unknown method {method[:40]!r}; brim serves {', '.join(METHODS)}.")
        if MODEL_ID.fullmatch(model) is None:
            raise BodyError(
                f"The model {model[:100]!r} in the URL is not a model id (letters, digits and "
                "'.', '_', '-', ':', '@', '[', ']', at most 128).",
                "model",
            )
        api = "gemini.count_tokens" if method == "countTokens" else self.name
        endpoint = f"/v1beta/models/{model}:{method}"
        return Target(api, endpoint, model=model, stream=method == "streamGenerateContent")

    def check(self, body: dict[str, Any]) -> RequestFacts:
        try:
            _check_generate(body)
        except ValidationError as exc:
            location, _, message = first_error(exc)
            param = ".".join(str(part) for part in location)
            raise BodyError(f"Invalid JSON payload: {param}: {message}", param) from None
        return RequestFacts(model=None, stream=False)

    def message_tokens(self, message: Mapping[str, Any], enc: tiktoken.Encoding, model: str) -> int:
        count = token_count(enc)
        tokens = PER_MESSAGE + count(message.get("role"))
        for part in message.get("parts") or ():
            if not isinstance(part, Mapping):
                continue
            if "text" in part:
                tokens += count(part.get("text"))
            elif "functionCall" in part or "functionResponse" in part:
                tokens += PER_TOOL_CALL + count(
                    part.get("functionCall") or part.get("functionResponse")
                )
            elif "inlineData" in part or "fileData" in part:
                tokens += GEMINI_IMAGE_TOKENS
            else:
                tokens += count(part)
        return tokens

    def fixed_tokens(
        self, counter: TokenCounter, body: Mapping[str, Any], tokenizer: str, model: str
    ) -> int:
        system = body.get("systemInstruction") or body.get("system_instruction") or {}
        fixed = counter.text(as_text(system), tokenizer, RAW) if system else 0
        if body.get("tools"):
            fixed += counter.text(as_text(body["tools"]), tokenizer, RAW)
        return fixed

    def response_schema(self, body: Mapping[str, Any]) -> Any:
        return None

    def bound_overhead(self, body: Mapping[str, Any]) -> int:
        tokens = 0
        for item in self.conversation(body):
            for part in _parts(item):
                if not isinstance(part, Mapping):
                    continue
                if "functionCall" in part or "functionResponse" in part:
                    tokens += PER_TOOL_CALL
                elif "inlineData" in part or "fileData" in part:
                    tokens += GEMINI_IMAGE_TOKENS
        return tokens

    def error_body(self, error: ErrorInfo) -> bytes:
        message = error.message
        if error.refusal is not None:
            refusal = error.refusal
            message = (
                f"The input token count ({refusal.tokens_in}) exceeds the maximum number of "
                f"tokens allowed ({refusal.limit}). brim could not make it fit: {refusal.how}"
            )
        status = STATUSES.get(error.status, "INTERNAL")
        return orjson.dumps({"error": {"code": error.status, "message": message, "status": status}})

    def stream_error(self, error: ErrorInfo, last_event: bytes) -> bytes:
        return b"data: " + self.error_body(error) + b"\r\n\r\n"

    def usage(self, payload: Any) -> Usage | None:
        metadata = payload.get("usageMetadata") if isinstance(payload, Mapping) else None
        if not isinstance(metadata, Mapping):
            return None
        output = whole_number(metadata.get("candidatesTokenCount"))
        thoughts = whole_number(metadata.get("thoughtsTokenCount"))
        if thoughts is not None:
            output = (output or 0) + thoughts
        return Usage(
            input=whole_number(metadata.get("promptTokenCount")),
            output=output,
            cached_input=whole_number(metadata.get("cachedContentTokenCount")),
        )

    def response_model(self, payload: Any) -> str | None:
        return model_name(payload, "modelVersion")

    def genai_messages(self, items: Sequence[Any]) -> list[GenAiMessage]:
        out: list[GenAiMessage] = []
        for item in items:
            if not isinstance(item, Mapping):
                continue
            parts = [p for part in _parts(item) if (p := _genai_part(part))]
            role = "assistant" if item.get("role") == "model" else str(item.get("role") or "user")
            out.append({"role": role, "parts": parts})
        return out

    def system_instructions(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        system = body.get("systemInstruction") or body.get("system_instruction")
        if isinstance(system, str):
            return [text_part(system)]
        parts = system.get("parts") if isinstance(system, Mapping) else None
        return [
            text_part(str(p["text"]))
            for p in parts or ()
            if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        ]

    def tool_names(self, body: Mapping[str, Any]) -> frozenset[str]:
        return frozenset(
            declaration["name"]
            for tool in listed(body.get("tools"))
            for declaration in _declarations(tool)[1]
            if isinstance(declaration, Mapping) and isinstance(declaration.get("name"), str)
        )

    def with_tool(self, body: Mapping[str, Any], spec: ToolSpec) -> dict[str, Any]:
        declaration = {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        }
        tools = list(listed(body.get("tools")))
        for position in range(len(tools) - 1, -1, -1):
            key, declarations = _declarations(tools[position])
            if key is not None:
                tools[position] = {**tools[position], key: [*declarations, declaration]}
                return {**body, "tools": tools}
        return {**body, "tools": [*tools, {"functionDeclarations": [declaration]}]}

    def reply_calls(self, reply: Mapping[str, Any]) -> list[ToolCall]:
        return [call for _, call in _reply_calls(_parts(_reply_content(reply)))]

    def continued(
        self,
        body: Mapping[str, Any],
        reply: Mapping[str, Any],
        calls: Sequence[ToolCall],
        results: Sequence[str],
    ) -> dict[str, Any]:
        content = _reply_content(reply)
        parts = _parts(content)
        made = _reply_calls(parts)
        answered, dropped = answered_in_order(calls, results, made)
        kept: list[Any] = []
        signature: Any = None  # of a dropped call: Gemini 3 wants it on a step's first call
        for index, part in enumerate(parts):
            if index in dropped:
                if signature is None and isinstance(part, Mapping):
                    signature = part.get("thoughtSignature")
                continue
            if signature is not None and isinstance(part, Mapping) and "functionCall" in part:
                if "thoughtSignature" not in part:
                    part = {**part, "thoughtSignature": signature}
                signature = None
            kept.append(part)
        model_turn = {**content, "role": "model", "parts": kept}
        ids = {call.id: parts[index]["functionCall"].get("id") for index, call in made}
        responses = []
        for call, result in answered:
            response: dict[str, Any] = {"name": call.name, "response": {"output": result}}
            if ids[call.id]:  # the call's own id; one brim made up stays brim's
                response = {"id": ids[call.id], **response}
            responses.append({"functionResponse": response})
        answers = {"role": "user", "parts": responses}
        return self.with_conversation(body, [*self.conversation(body), model_turn, answers])

    def with_usage(self, reply: Mapping[str, Any], usage: Usage) -> dict[str, Any]:
        return {**reply, "usageMetadata": _usage_written(reply.get("usageMetadata"), usage)}

    def with_tool_choice_none(self, body: Mapping[str, Any]) -> dict[str, Any]:
        snake = "tool_config" in body and "toolConfig" not in body
        field, inner = (
            ("tool_config", "function_calling_config")
            if snake
            else ("toolConfig", "functionCallingConfig")
        )
        config = body.get(field)
        config = config if isinstance(config, Mapping) else {}
        calling = config.get(inner)
        calling = {
            key: value
            for key, value in (calling.items() if isinstance(calling, Mapping) else ())
            # Gemini takes a list of allowed functions only with mode ANY (or VALIDATED).
            if key not in ("allowedFunctionNames", "allowed_function_names")
        }
        return {**body, field: {**config, inner: {**calling, "mode": "NONE"}}}

    def turn_reader(self) -> TurnReader:
        return GeminiTurnReader()

    def splice(self, earlier: Usage | None) -> Splice:
        return GeminiSplice(earlier)

    def with_model(
        self, body: Mapping[str, Any], endpoint: str, model: str
    ) -> tuple[dict[str, Any], str]:
        # The model is in the path (/v1beta/models/{model}:{method}); the body stays as it is.
        same = body if isinstance(body, dict) else dict(body)
        root, found, target = endpoint.rpartition("/models/")
        if not found:
            return same, endpoint
        return same, f"{root}/models/{model}:{target.rpartition(':')[2]}"

    def model_call(self, model: str, system: str, text: str, max_tokens: int) -> ModelCall:
        body = {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": [{"role": "user", "parts": [{"text": text}]}],
            "generationConfig": {"maxOutputTokens": max_tokens, "temperature": 0},
        }
        return ModelCall(f"/v1beta/models/{model}:generateContent", body, {})

    def reply_text(self, reply: Mapping[str, Any]) -> str:
        return "".join(
            str(part["text"])
            for part in _parts(_reply_content(reply))
            if isinstance(part, Mapping)
            and isinstance(part.get("text"), str)
            and not part.get("thought")
        )


def _declarations(tool: Any) -> tuple[str | None, list[Any]]:
    """A `tools` entry's function declarations and the key they are under (Gemini reads the
    snake_case spelling too); (None, []) for an entry without any (search, code execution)."""
    for key in ("functionDeclarations", "function_declarations"):
        found = tool.get(key) if isinstance(tool, Mapping) else None
        if isinstance(found, list):
            return key, found
    return None, []


GEMINI = GeminiWire()
