"""The neutral conversation view every compression policy works on.

A `Conversation` holds the original message objects, the token size of each, and the fixed cost
of the rest of the request (tool definitions, response format, reply priming). Policies never
mutate it: they return a new one in which only the messages they touched are new objects; every
other message is the very object the client sent, unknown fields included.

A *unit* is what is kept or removed whole: a system message, a user message, a plain assistant
message, or a tool group — an assistant turn with tool calls plus every result that answers it.
The wire API's `Dialect` decides where units begin and end; nothing else here knows a wire format.

What the policies work out about a conversation is in `policies.facts`; what they read in texts
(task terms, anomalies, placeholders) in `policies.text`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from brim.policies.remembered import Remembered

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
    # `evict`: the batch the unit went in — (value class, grid step within the class) — which
    # the summaries of evicted turns are made per.
    batch: tuple[int, int] | None = None


class Dialect(Protocol):
    """Everything wire-specific a policy may need."""

    name: str

    def role(self, message: Any) -> str: ...

    def units(self, messages: Sequence[Any]) -> list[Unit]: ...

    def tool_results(self, message: Any, tools_by_call: Mapping[str, str]) -> list[ToolResult]: ...

    def tools_by_call(self, messages: Sequence[Any]) -> dict[str, str]: ...

    def calls(self, message: Any) -> list[str]: ...

    def call_arguments(self, message: Any) -> list[tuple[str, Any]]:
        """(call key, arguments) for each call `calls` lists, in its order: the arguments as
        the tool got them, JSON text parsed."""
        ...

    def with_tool_result(self, message: Any, call_id: str, text: str) -> Any:
        """`message` with the text of the result of `call_id` replaced, and nothing else of it
        changed: its role, calls and their arguments, the results it holds, its `text` and the
        units it is part of stay the same (`Conversation.with_results` relies on it)."""
        ...

    def text(self, message: Any) -> str: ...

    def largest_text(self, message: Any) -> str | None: ...

    def with_largest_text(self, message: Any, text: str) -> Any: ...

    def notice(self, text: str) -> Any: ...

    def placeholder_result(self, call_id: str, text: str) -> Any: ...

    def violations(self, messages: Sequence[Any]) -> list[str]: ...

    def repaired(self, messages: Sequence[Any]) -> tuple[list[Any], list[str]]: ...


class Meter(Protocol):
    """Token measurements in the request's own tokenizer. `message` counts what the provider
    counts — the encoding's tokens scaled by `ratio` (`policies.tokens`), the unit of every
    size and budget the policies compare; `tokens` and `text_tokens` are the encoding's own,
    unscaled: a policy that cuts a text to fit a count converts it (`text_tokens_for`)."""

    @property
    def ratio(self) -> float: ...

    def message(self, message: Any) -> int: ...

    def tokens(self, text: str) -> list[int]: ...

    def text_tokens(self, text: str) -> int: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


def text_tokens_for(counted: int, meter: Meter) -> int:
    """How many tokens of text (the encoding's, as `Meter.tokens` lists them) `counted` of the
    provider's tokens (`Meter.message`'s) stand for: a text that fits in `counted` has at most
    this many, and cutting this many from a text saves at least `counted`."""
    return math.ceil(round(counted / meter.ratio, 6))


def text_tokens_taking(
    counted: int, message: int, without_text: int, text: int, meter: Meter
) -> int:
    """How many tokens of text (the encoding's) to cut from a message for it to take about
    `counted` fewer of the provider's tokens, where the message takes `message` of them,
    `without_text` with its text empty, and the text is `text` tokens long. A token of text may
    take more than one of the message's (JSON escapes of tabs, quotes and newlines; the model's
    ratio): measured on the message, a cut goes no further than it needs. Without a text to
    measure by, as `text_tokens_for`."""
    if text > 0 and message > without_text:
        return math.ceil(counted * text / (message - without_text))
    return text_tokens_for(counted, meter)


_PAIRED = "paired"  # the memo key of the note that its messages pair validly (`checked`)


class Lasting:
    """Something a conversation's memo holds that outlasts rewrites of the texts of tool
    results (`Conversation.with_results`): in the new conversation's memo, it is `through`."""

    __slots__ = ()

    def through(self, changed: frozenset[int]) -> Lasting:
        """What stands for this in the memo of a conversation that differs from its own only in
        the texts of the tool results of the messages at `changed`."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Conversation:
    dialect: Dialect
    messages: tuple[Any, ...]
    sizes: tuple[int, ...]
    fixed: int  # tool definitions, response format, reply priming
    origin: tuple[int, ...]  # each message's index in the client's list; -1 for brim's own
    # What the policies work out about these very messages (`facts`): kept on the conversation
    # it describes, so it lives as long as this request's compression and no longer.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls, dialect: Dialect, messages: Sequence[Any], meter: Meter, fixed: int
    ) -> Conversation:
        # A meter that counts many messages at once (`CounterMeter.messages`) is asked so.
        counted = getattr(meter, "messages", None)
        return cls(
            dialect=dialect,
            messages=tuple(messages),
            sizes=tuple(map(meter.message, messages)) if counted is None else counted(messages),
            fixed=fixed,
            origin=tuple(range(len(messages))),
        )

    @property
    def total(self) -> int:
        return self.fixed + sum(self.sizes)

    def units(self) -> list[Unit]:
        return self.dialect.units(self.messages)

    def replace(self, changes: Mapping[int, tuple[Any, int]]) -> Conversation:
        """A conversation with message i replaced by (new message, its size) for each change
        (this very one when there are none: what was learned about it still holds)."""
        if not changes:
            return self
        messages, sizes = list(self.messages), list(self.sizes)
        for index, (message, size) in changes.items():
            messages[index], sizes[index] = message, size
        return dataclasses.replace(self, messages=tuple(messages), sizes=tuple(sizes), memo={})

    def with_results(self, changes: Mapping[int, tuple[Any, int]]) -> Conversation:
        """`replace` for changes that rewrite the texts of tool results and nothing else
        (`Dialect.with_tool_result`): what this conversation's memo knows of its calls, units
        and requests (each `Lasting` in it, `policies.facts.Facts`) holds for the new one as
        well, and goes with it."""
        replaced = self.replace(changes)
        if replaced is self:
            return replaced
        if self.memo.get(_PAIRED):
            replaced.memo[_PAIRED] = True
        changed = frozenset(changes)
        for key, known in self.memo.items():
            if isinstance(known, Lasting):
                replaced.memo[key] = known.through(changed)
        return replaced

    def checked(self) -> Conversation:
        """This conversation, noted as pairing validly (`Dialect.violations` found nothing in
        its messages): the note goes with it through `with_results`, whose rewrites of result
        texts leave every role, call and result where it was."""
        self.memo[_PAIRED] = True
        return self

    @property
    def known_valid(self) -> bool:
        """Whether these messages are known to pair validly (`checked`)."""
        return bool(self.memo.get(_PAIRED))

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
            self, messages=tuple(messages), sizes=tuple(sizes), origin=tuple(origin), memo={}
        )


@dataclass(frozen=True, slots=True)
class Goal:
    """Where a policy should take the request: `target` is the low-water mark that reversible
    cuts made in batches aim for; `limit` is the budget that must not be exceeded — what the
    last resorts (cuts into text: prune's cuts of results, truncate; evict's protected units)
    aim for, going no further than it needs. `grid`: the batch snapped cuts move by when none
    is configured — by default the slack between limit and target; a target lowered to leave a
    growing session room keeps the low-water mark's grid, so its batches (and their summaries)
    stay the same. `reversible_only`: this pass asks for the reversible cuts alone (lossless
    rewrites, placeholders, evictions of unprotected units); the last resorts wait for a pass
    that needs them (`policies.compress`). `text_cuts`: whether the last resorts may cut into
    text (off: only evictions of the protected units, as when making room for a restored
    original that must go out whole). `room`: the tokens a session known to grow asks to be left
    under the limit for its next turns (`policies.carry`; the target is lowered by it); 0 on a
    first cut or a request on its own."""

    target: int
    limit: int
    grid: int = 0
    reversible_only: bool = False
    text_cuts: bool = True
    room: int = 0

    @property
    def cuts_text(self) -> bool:
        """Whether a policy may cut into text in this pass."""
        return self.text_cuts and not self.reversible_only

    def step(self, configured: int | None) -> int:
        """The batch a snapped cut moves by: `configured`, or the grid."""
        if configured is not None:
            return configured
        return self.grid or max(1, self.limit - self.target)


class Policy(Protocol):
    name: str

    def apply(
        self, conversation: Conversation, goal: Goal, meter: Meter
    ) -> tuple[Conversation, list[FidelityRecord]]: ...


def snapped_count(savings: Iterable[int], needed: int, step: int, whole: int = 0) -> int:
    """How many items (in their fixed order) to take so their savings reach `needed`, rounded up
    to the next grid point — where the running sum crosses a multiple of `step` — so that as a
    session grows, the number taken (and so the request prefix) changes only now and then.
    Where the items run out before such a point, all are taken — or, with `whole`, where all
    together save less than `needed`, a multiple of `whole` items (when there are that many):
    the rest is left to the next policy, since a count that grows with the session would change
    the prefix every turn. Where all together reach `needed` they are all taken: rounded down,
    they would leave a few tokens to the next policy, which removes a batch of its own for them
    (clear, then evict: a session's planted facts at ≤ 2.5× lost to one, bench.fidelity,
    2026-12-08). `savings` may be a generator: it is read no further than the items taken."""
    if needed <= 0:
        return 0
    running = taken = 0
    reached = False
    for taken, saving in enumerate(savings, start=1):
        before = running
        running += saving
        reached = reached or running >= needed
        if reached and (step <= 0 or running // step > before // step):
            return taken
    if whole > 0 and taken >= whole and not reached:
        return taken - taken % whole
    return taken


# Remembered by content (results come back every turn), keyed by the string's own cached hash
# and its length: cheap, and collisions are negligible at these sizes (as in tokens.py).
_ARCHIVE_KEYS: Remembered[tuple[int, int], str] = Remembered(maxsize=8_192)
_CACHE_LOCK = threading.Lock()


def archive_key(content: str) -> str:
    """The sha256 of `content`, under which the archive keeps it."""
    key = (len(content), hash(content))
    with _CACHE_LOCK:
        known = _ARCHIVE_KEYS.get(key)
    if known is None:
        known = hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()
        with _CACHE_LOCK:
            _ARCHIVE_KEYS[key] = known
    return known


def parse_key(text: object, min_digits: int = 64) -> str | None:
    """The digits of an `archive_key` that `text` names — all 64, or a prefix of at least
    `min_digits` (as placeholders show it) — lowercased, or None if it names none. Taken as a
    model or a user writes it: optionally after `sha256:`, in any case, with spaces around. A
    full key as `archive_key` gives it is its own parse."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    digits = text.strip().lower().removeprefix("sha256:").strip()
    if not min_digits <= len(digits) <= 64 or re.fullmatch("[0-9a-f]+", digits) is None:
        return None
    return digits
