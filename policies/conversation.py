"""The neutral conversation view every compression policy works on.

A `Conversation` holds the original message objects, the token size of each, and the fixed cost
of the rest of the request (tool definitions, response format, reply priming). Policies never
mutate it: they return a new one in which only the messages they touched are new objects; every
other message is the very object the client sent, unknown fields included.

A *unit* is what is kept or removed whole: a system message, a user message, a plain assistant
message, or a tool group — an assistant turn with tool calls plus every result that answers it.
The wire API's `Dialect` decides where units begin and end; nothing else here knows a wire format.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

UnitKind = Literal["system", "user", "assistant", "tools", "orphan"]


@dataclass(frozen=True, slots=True)
class Unit:
    kind: UnitKind
    start: int
    end: int  # exclusive

    @property
    def indices(self) -> range:
        return range(self.start, self.end)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool result inside a message, as the dialect found it."""

    call_id: str
    tool: str
    text: str


@dataclass(frozen=True, slots=True)
class FidelityRecord:
    """What a policy did to one message (or, for `evict`, one unit): for traces and audit."""

    policy: str
    action: str  # "pruned", "cleared", "evicted", "truncated", "repaired", "notice"
    index: int  # position in the client's original message list (-1 for brim's own messages)
    tokens_before: int
    tokens_after: int
    archive_key: str | None = None
    detail: str = ""
    original: str | None = field(default=None, repr=False, compare=False)  # what the key names


class Dialect(Protocol):
    """Everything wire-specific a policy may need."""

    name: str

    def role(self, message: Any) -> str: ...

    def units(self, messages: Sequence[Any]) -> list[Unit]: ...

    def tool_results(self, message: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]: ...

    def tools_by_call(self, messages: Sequence[Any]) -> dict[str, str]: ...

    def calls(self, message: Any) -> list[str]: ...

    def with_tool_result(self, message: Any, call_id: str, text: str) -> Any: ...

    def text(self, message: Any) -> str: ...

    def largest_text(self, message: Any) -> str | None: ...

    def with_largest_text(self, message: Any, text: str) -> Any: ...

    def notice(self, text: str) -> Any: ...

    def placeholder_result(self, call_id: str, text: str) -> Any: ...

    def violations(self, messages: Sequence[Any]) -> list[str]: ...

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]: ...


class Meter(Protocol):
    """Token measurements in the request's own tokenizer."""

    def message(self, message: Any) -> int: ...

    def tokens(self, text: str) -> list[int]: ...

    def text_tokens(self, text: str) -> int: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


def archive_key(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()


def message_key(message: Any) -> str:
    return archive_key(orjson.dumps(message).decode())


@dataclass(frozen=True, slots=True)
class Conversation:
    dialect: Dialect
    messages: tuple[Any, ...]
    sizes: tuple[int, ...]
    fixed: int  # tool definitions, response format, reply priming
    origin: tuple[int, ...]  # each message's index in the client's list; -1 for brim's own

    @classmethod
    def of(
        cls, dialect: Dialect, messages: Sequence[Any], meter: Meter, fixed: int
    ) -> Conversation:
        return cls(
            dialect=dialect,
            messages=tuple(messages),
            sizes=tuple(meter.message(m) for m in messages),
            fixed=fixed,
            origin=tuple(range(len(messages))),
        )

    @property
    def total(self) -> int:
        return self.fixed + sum(self.sizes)

    def units(self) -> list[Unit]:
        return self.dialect.units(self.messages)

    def replace(self, changes: Mapping[int, tuple[Any, int]]) -> Conversation:
        """A conversation with message i replaced by (new message, its size) for each change."""
        messages, sizes = list(self.messages), list(self.sizes)
        for index, (message, size) in changes.items():
            messages[index], sizes[index] = message, size
        return dataclasses.replace(self, messages=tuple(messages), sizes=tuple(sizes))

    def keep(
        self, keep: Callable[[int], bool], inserts: Mapping[int, tuple[Any, int]]
    ) -> Conversation:
        """Drop the messages for which `keep(i)` is false; put each insert before position i."""
        messages: list[Any] = []
        sizes: list[int] = []
        origin: list[int] = []
        for index in range(len(self.messages) + 1):
            if index in inserts:
                message, size = inserts[index]
                messages.append(message)
                sizes.append(size)
                origin.append(-1)
            if index < len(self.messages) and keep(index):
                messages.append(self.messages[index])
                sizes.append(self.sizes[index])
                origin.append(self.origin[index])
        return dataclasses.replace(
            self, messages=tuple(messages), sizes=tuple(sizes), origin=tuple(origin)
        )


@dataclass(frozen=True, slots=True)
class Goal:
    """Where a policy should take the request: `target` is the low-water mark to aim for;
    `limit` is the budget that must not be exceeded (only the last-resort steps use it)."""

    target: int
    limit: int


class Policy(Protocol):
    name: str

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]: ...


def snapped_count(savings: Sequence[int], needed: int, step: int) -> int:
    """How many items (in their fixed order) to take so their savings reach `needed`, rounded up
    to the next grid point — where the running sum crosses a multiple of `step` — so that as a
    session grows, the number taken (and so the request prefix) changes only now and then."""
    if needed <= 0:
        return 0
    running = 0
    reached: int | None = None
    for taken, saving in enumerate(savings, start=1):
        before = running
        running += saving
        if reached is None and running >= needed:
            reached = taken
        if reached is not None and (step <= 0 or running // step > before // step):
            return taken
    return len(savings)
