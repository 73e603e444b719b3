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
import functools
import hashlib
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson
from cachetools import LRUCache

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


# What a tool result is worth: duplicates, superseded reads, task terms and anomalies.
# Shared by `prune_tool_results` (what to keep inside a result), `clear_tool_results` and `evict`
# (what to remove first). All of it is a pure function of the conversation, so the same history
# is judged the same way every turn.

SAME_AS_PREFIX = "[brim: same content as "  # an older copy `prune_tool_results` points onward
_PLACEHOLDER_PREFIXES = ("[brim", "[no result was recorded")  # brim's own and repair's texts
_ARGUMENT_FIELDS = ("arguments", "input", "args", "action")
_ONE_STRING_FIELD = re.compile(r'\s*\{\s*"(?:[^"\\]|\\.)*"\s*:\s*"')
_TERM_SOURCE_CHARS = 4_000  # of each text the task terms are read from
MIN_DUPLICATE_CHARS = 256  # shorter equal results ("ok", "done") are not worth pointing onward

_TOKEN = re.compile(r"[\w][\w.\-/]*")
_PIECES = re.compile(r"[/.\-_]+")
_ANOMALY_WORDS = (  # found in lower-cased text, inside words too: KeyError, FAILED, UserWarning
    "error",
    "exception",
    "traceback",
    "panic",
    "fatal",
    "fail",
    "warn",
    "critical",
    "segmentation fault",
    "denied",
    "refused",
    "abort",
)
_ANOMALY_CODES = re.compile(  # a non-2xx HTTP status, a non-zero exit code
    r"http/\d(?:\.\d)?\"?\s+[13-5]\d\d\b"  # a status line or an access-log entry
    r"|\bstatus(?:_?code)?[\"']?\s*[:=]\s*[\"']?[13-5]\d\d\b"
    r"|\bexit(?:ed)?(?:\s+with)?(?:[\s_-]*(?:code|status))?\s*[:=(]?\s*-?[1-9]\d*\b"
    r"|\b(?:returncode|return code|exit_code|rc)\s*[:=]\s*-?[1-9]\d*\b"
)
_STOP_WORDS = """
    about above after again against also although always another anything around because been
    before being below between both cannot could does doing done down during each either else
    even ever every everything from further have having here hers herself himself however into
    itself just like made make many maybe might more most much must myself need needs never next
    none nothing once only other ought ours over please rather really same seem seems shall should
    since some something still such sure than that thanks thank their theirs them then there these
    they thing things this those though through thus today under until upon very want wants well
    were what whatever when where whether which while whom whose will with within without would
    your yours look find check tell show give help okay using used uses file files line lines code
    true false null self return import class function const static public private void string
    type value name path text content command input output result error errors json http https
    print async await yield lambda args kwargs data item items list dict number default
"""
STOP_WORDS = frozenset(_STOP_WORDS.split())


def plain_text(text: str) -> str:
    """A result's text, unwrapped from a JSON object whose one field is a string (the shape in
    which Gemini's `functionResponse` carries a text result)."""
    if _ONE_STRING_FIELD.match(text) and text.rstrip().endswith('"}'):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
        if isinstance(value, dict) and len(value) == 1:
            (inner,) = value.values()
            if isinstance(inner, str):
                return inner
    return text


def is_placeholder(text: str) -> bool:
    """Whether a result is already a stand-in: cleared, pointed onward, or never recorded."""
    if text.startswith(_PLACEHOLDER_PREFIXES):
        return True
    head = text[:80]
    return any(f'"{prefix}' in head for prefix in _PLACEHOLDER_PREFIXES) and plain_text(
        text
    ).startswith(_PLACEHOLDER_PREFIXES)


def editable(results: Sequence[ToolResult]) -> list[ToolResult]:
    """The results a policy may rewrite one by one: those whose call id is the only one of its
    kind in the message (Gemini pairs calls without ids by name, and a rewrite by a shared key
    would reach every result that has it)."""
    ids = [result.call_id for result in results]
    return [result for result in results if ids.count(result.call_id) == 1]


def keys_of(text: str) -> set[str]:
    """Every lower-case word, identifier, file name and path piece in `text`: what a task term
    is matched against (`parse_config`, `config`, `prune.py`, `prune` from `policies/prune.py`)."""
    keys: set[str] = set()
    for token in _TOKEN.findall(text.lower()):
        token = token.strip(".-/")
        keys.add(token)
        keys.update(_PIECES.split(token))
        if "/" in token:
            keys.update(token.split("/"))
    keys.discard("")
    return keys


def terms_of(text: str) -> frozenset[str]:
    """The task terms in a text (its first few thousand characters): identifiers
    (`parse_config`, `ContextTooLarge`, `E501`), file names (`prune.py` and `prune`, from any
    path) and words of four or more letters that are not stop words. Lower case; numbers alone
    and short words are not terms."""
    return _terms_of(text[:_TERM_SOURCE_CHARS])


@functools.lru_cache(maxsize=8_192)
def _terms_of(text: str) -> frozenset[str]:
    terms: set[str] = set()
    for raw in _TOKEN.findall(text):
        raw = raw.strip(".-/")
        if "/" in raw:
            raw = raw.rsplit("/", 1)[1]
        token = raw.lower()
        if len(token) < 3 or not any(c.isalpha() for c in token):
            continue
        if "." in token:  # a file name or a dotted name: the whole and its stem
            terms.add(token)
            stem = token.split(".", 1)[0]
            if len(stem) >= 3 and stem not in STOP_WORDS and any(c.isalpha() for c in stem):
                terms.add(stem)
        elif "_" in token or any(c.isdigit() for c in token) or raw[1:] != raw[1:].lower():
            terms.add(token)  # an identifier
        elif len(token) >= 4 and token.isalpha() and token not in STOP_WORDS:
            terms.add(token)
    return frozenset(terms)


def is_anomaly(text: str) -> bool:
    """Whether `text` reports something going wrong: an error, warning, failure, exception,
    traceback or panic, a non-2xx HTTP status, a non-zero exit code."""
    lowered = text.lower()
    if any(word in lowered for word in _ANOMALY_WORDS):
        return True
    return any(hint in lowered for hint in ("http/", "status", "exit", "code", "rc")) and bool(
        _ANOMALY_CODES.search(lowered)
    )


_EVIDENCE: LRUCache[tuple[int, int, frozenset[str]], bool] = LRUCache(maxsize=8_192)
_EVIDENCE_LOCK = threading.Lock()


def has_evidence(text: str, terms: frozenset[str]) -> bool:
    """Whether a result mentions a task term or an anomaly (remembered by content: results come
    back every turn)."""
    key = (len(text), hash(text), terms)  # the string's own cached hash: cheap, as in tokens.py
    with _EVIDENCE_LOCK:
        known = _EVIDENCE.get(key)
    if known is None:
        known = is_anomaly(text) or bool(terms and not terms.isdisjoint(keys_of(text)))
        with _EVIDENCE_LOCK:
            _EVIDENCE[key] = known
    return known


def _parsed(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def call_arguments(message: Any, call_id: str) -> Any:
    """The arguments of tool call `call_id` made in `message`, JSON text parsed — whatever the
    wire calls them (`function.arguments`, `input`, `args`, `action`); None if not found."""
    stack = [message]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ident = node.get("call_id", node.get("id"))
            if (ident is not None and str(ident) == call_id) or (
                ident is None and node.get("name") == call_id
            ):
                for holder in (node, node.get("function"), node.get("functionCall")):
                    if isinstance(holder, dict):
                        for name in _ARGUMENT_FIELDS:
                            if name in holder:
                                return _parsed(holder[name])
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        stack.extend(child for child in children if isinstance(child, dict | list))
    return None


def strings_of(value: Any) -> list[str]:
    """Every string inside a JSON value (not its keys), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in strings_of(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings_of(item)]
    return []


def requests(conversation: Conversation) -> list[frozenset[str]]:
    """The terms of the user's request before each message, and last, the current one (one
    more entry than messages): those of the first user message (the task, as agents get it)
    and of the last one so far; brim's own notices aside.

    A result is judged by the request it was fetched for, never by later turns: so it is judged
    the same way in every later turn, and what brim makes of it (and the request prefix) stays
    put as the session grows."""
    dialect = conversation.dialect
    first: frozenset[str] | None = None
    request: frozenset[str] = frozenset()
    found: list[frozenset[str]] = []
    for message in conversation.messages:
        found.append(request)
        if dialect.role(message) == "user":
            text = dialect.text(message).strip()
            if text and not text.startswith("[brim"):
                first = terms_of(text) if first is None else first
                request = first | terms_of(text)
    found.append(request)
    return found


def call_terms(conversation: Conversation, unit: Unit) -> frozenset[str]:
    """The terms of the arguments of the tool calls a unit makes."""
    dialect, messages = conversation.dialect, conversation.messages
    terms: set[str] = set()
    for index in unit.indices:
        for call in dialect.calls(messages[index]):
            for text in strings_of(call_arguments(messages[index], call)):
                terms |= terms_of(text)
    return frozenset(terms)


def task_terms(conversation: Conversation) -> frozenset[str]:
    """The terms of the current task: those of the first and the last user message (brim's own
    notices aside) and of the arguments of the latest tool calls."""
    latest = next((u for u in reversed(conversation.units()) if u.kind == "tools"), None)
    calls = call_terms(conversation, latest) if latest else frozenset()
    return requests(conversation)[-1] | calls


def _canonical(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


def stale_results(conversation: Conversation) -> dict[tuple[int, str], str]:
    """Tool results a later one makes (nearly) redundant, by (message index, call id):
    "placeholder" — already a stand-in; "duplicate" — a later result has the same content;
    "superseded" — a later call of the same tool with the same arguments answered differently
    (a file read, edited and read again: the older read is out of date)."""
    dialect, messages = conversation.dialect, conversation.messages
    names = dialect.tools_by_call(messages)
    asked: dict[str, str] = {}
    for message in messages:
        for call in dialect.calls(message):
            arguments = call_arguments(message, call)
            if arguments is not None:
                asked[call] = f"{names.get(call, 'tool')}:{_canonical(arguments)}"
    stale: dict[tuple[int, str], str] = {}
    seen_content: set[str] = set()
    seen_query: set[str] = set()
    for index in range(len(messages) - 1, -1, -1):  # newest first: "later" is already seen
        for result in reversed(dialect.tool_results(messages[index], names)):
            key = (index, result.call_id)
            content = result.text.strip()  # compared whole: a set of texts, no digest needed
            query = asked.get(result.call_id)
            placeholder = is_placeholder(result.text)
            if placeholder:
                stale[key] = "placeholder"
            elif content in seen_content and len(content) >= MIN_DUPLICATE_CHARS:
                stale[key] = "duplicate"
            elif query is not None and query in seen_query:
                stale[key] = "superseded"
            if not placeholder:
                seen_content.add(content)
                if query is not None:
                    seen_query.add(query)
    return stale
