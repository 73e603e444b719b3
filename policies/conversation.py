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
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, overload

import orjson

from brim.policies.remembered import Remembered

UnitKind = Literal["system", "user", "assistant", "tools", "orphan"]
T = TypeVar("T")


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
        (`Dialect.with_tool_result`): what the facts of this conversation know of its calls,
        units and requests holds for the new one as well, and goes with it, for `facts` to start
        from if they are asked for."""
        replaced = self.replace(changes)
        if replaced is not self and self.memo.get(_PAIRED):
            replaced.memo[_PAIRED] = True
        known = self.memo.get(_FACTS)
        if replaced is not self and isinstance(known, Facts):
            replaced.memo[_FACTS] = _Earlier(known, frozenset(changes))
        elif replaced is not self and isinstance(known, _Earlier):
            replaced.memo[_FACTS] = _Earlier(known.facts, known.changed | changes.keys())
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
    last-resort steps (evict's protected units, truncate's cuts into text) aim for, going no
    further than it needs. `grid`: the batch snapped cuts move by when none is configured —
    by default the slack between limit and target; a target lowered to leave a growing session
    room keeps the low-water mark's grid, so its batches (and their summaries) stay the same."""

    target: int
    limit: int
    grid: int = 0

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
    Where the items run out before such a point, all are taken — or, with `whole`, a multiple of
    `whole` items (when there are that many): the rest is left to the next policy, since a count
    that grows with the session would change the prefix every turn. `savings` may be a
    generator: it is read no further than the items taken."""
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
    if whole > 0 and taken >= whole:
        return taken - taken % whole
    return taken


# What a tool result is worth: duplicates, superseded reads, task terms and anomalies.
# Shared by `prune_tool_results` (what to keep inside a result), `clear_tool_results` and `evict`
# (what to remove first). All of it is a pure function of the conversation, so the same history
# is judged the same way every turn.

NO_RESULT = "[no result was recorded for this tool call]"  # what repair answers a lost call with
SAME_AS_PREFIX = "[brim: same content as "  # an older copy `prune_tool_results` points onward
_PLACEHOLDER_PREFIXES = ("[brim", NO_RESULT)  # brim's own stand-ins, and repair's
STALE, PLAIN, EVIDENCE = 0, 1, 2  # a result's value: redundant, no task term or anomaly, evidence
_TERM_SOURCE_CHARS = 4_000  # of each text the task terms are read from
MIN_DUPLICATE_CHARS = 256  # shorter equal results ("ok", "done") are not worth pointing onward

_TOKEN = re.compile(r"[\w][\w.\-/]*")
_PIECES = re.compile(r"[/.\-_]+")
_POINTER = re.compile(
    r"for call (?P<call>.*?)(?: in message (?P<at>\d+))?; see there; sha256:[0-9a-f]{16}\]\Z",
    re.DOTALL,
)
_BRIM_MARKER = re.compile(r"\[… [^\]\n]*?by brim[^\]\n]*?…\]")  # of what a cut left out
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

# Remembered by content (results come back every turn), keyed by the string's own cached hash
# and its length: cheap, and collisions are negligible at these sizes (as in tokens.py).
_ARCHIVE_KEYS: Remembered[tuple[int, int], str] = Remembered(maxsize=8_192)
_TEXT_FACTS: Remembered[tuple[int, int], _TextFacts] = Remembered(maxsize=8_192)
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


def is_placeholder(text: str) -> bool:
    """Whether a result is already a stand-in: cleared, pointed onward, or never recorded."""
    return text.startswith(_PLACEHOLDER_PREFIXES)


def pointer(tool: str, call_id: str, key: str, at: int | None = None) -> str:
    """What an older exact copy of a result becomes: a pointer to the next copy — its tool and
    call, and where the call key is not unique in the conversation (Gemini calls without ids
    are keyed by name) the position of its message in the client's list — with the sha256 of
    the copy's own text, under which the archive keeps it."""
    where = f" in message {at}" if at is not None else ""
    return (
        f"{SAME_AS_PREFIX}the later {tool} result for call {call_id}{where}; see there; "
        f"sha256:{key[:16]}]"
    )


def editable(results: Sequence[ToolResult]) -> list[ToolResult]:
    """The results a policy may rewrite one by one: those whose call id is the only one of its
    kind in the message (Gemini pairs calls without ids by name, and a rewrite by a shared key
    would reach every result that has it)."""
    if len(results) < 2:
        return list(results)
    counts = Counter(result.call_id for result in results)
    return [result for result in results if counts[result.call_id] == 1]


def _keys(text: str) -> frozenset[str]:
    keys: set[str] = set()
    for token in set(_TOKEN.findall(text.lower())):  # a text repeats its words: each once
        token = token.strip(".-/")
        keys.add(token)
        keys.update(_PIECES.split(token))
        if "/" in token:
            keys.update(token.split("/"))
    keys.discard("")
    return frozenset(keys)


class _TextFacts:
    """What is known of one text: whether it reports an anomaly, and its keys once asked for."""

    __slots__ = ("anomaly", "keys")

    def __init__(self, anomaly: bool) -> None:
        self.anomaly = anomaly
        self.keys: frozenset[str] | None = None

    def keys_of(self, text: str) -> frozenset[str]:
        """The keys of `text`, the text these are the facts of: worked out when first asked."""
        if self.keys is None:
            self.keys = _keys(text)  # a race computes the same keys twice
        return self.keys


def _text_facts(text: str) -> _TextFacts:
    key = (len(text), hash(text))
    with _CACHE_LOCK:
        known = _TEXT_FACTS.get(key)
    if known is None:
        known = _TextFacts(is_anomaly(text))
        with _CACHE_LOCK:
            _TEXT_FACTS[key] = known
    return known


def keys_of(text: str) -> frozenset[str]:
    """Every lower-case word, identifier, file name and path piece in `text`: what a task term
    is matched against (`parse_config`, `config`, `prune.py`, `prune` from `policies/prune.py`).
    Remembered by content: meant for whole results, which come back every turn."""
    return _text_facts(text).keys_of(text)


def keys_in(text: str) -> frozenset[str]:
    """`keys_of`, worked out afresh: for pieces of a result, not worth remembering one by one."""
    return _keys(text)


def mentions(text: str, terms: frozenset[str]) -> bool:
    """Whether a line or an item mentions a task term (`keys_in`)."""
    return bool(terms) and not terms.isdisjoint(_keys(text))


def has_evidence(text: str, terms: frozenset[str]) -> bool:
    """Whether a result mentions a task term or an anomaly."""
    known = _text_facts(text)  # looked up once for both
    return known.anomaly or bool(terms and not terms.isdisjoint(known.keys_of(text)))


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
    traceback or panic, a non-2xx HTTP status, a non-zero exit code. brim's own markers in it
    ("… lines without task terms or errors omitted by brim …") report nothing."""
    lowered = text.lower()
    if "by brim" in lowered:
        lowered = _BRIM_MARKER.sub(" ", lowered)
    if any(word in lowered for word in _ANOMALY_WORDS):
        return True
    return any(hint in lowered for hint in ("http/", "status", "exit", "code", "rc")) and bool(
        _ANOMALY_CODES.search(lowered)
    )


def strings_of(value: Any) -> list[str]:
    """Every string inside a JSON value (not its keys), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in strings_of(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings_of(item)]
    return []


def _canonical(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


ResultKey = tuple[int, str]  # (message index, call key)


def copies(
    results: Sequence[Sequence[ToolResult]], texts: Mapping[ResultKey, str] | None = None
) -> dict[ResultKey, tuple[int, ToolResult]]:
    """Older exact copies of a later result: (message index, call key) → the next copy's
    message index and result. `results` are each message's editable results; `texts` stand in
    for a result's own text where given. Compared whole (stripped), by the texts themselves;
    placeholders and results under `MIN_DUPLICATE_CHARS` are no copies. Each copy names the
    next, so what an older one names never changes when yet another copy comes."""
    found: dict[ResultKey, tuple[int, ToolResult]] = {}
    later: dict[str, tuple[int, ToolResult]] = {}  # content → the next copy
    for index in range(len(results) - 1, -1, -1):
        for result in reversed(results[index]):
            text = result.text if texts is None else texts.get((index, result.call_id), result.text)
            text = text.strip()
            if len(text) < MIN_DUPLICATE_CHARS or is_placeholder(text):
                continue
            if text in later:
                found[index, result.call_id] = later[text]
            later[text] = (index, result)
    return found


class _Once(Generic[T]):
    """A value computed on first use and then kept on the instance, as `functools.cached_property`
    does, without its class-wide lock (Python 3.11): a race computes the same value twice."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__

    @overload
    def __get__(self, instance: None, owner: type) -> _Once[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: object, owner: type) -> T | _Once[T]:
        if instance is None:
            return self
        value = self.compute(instance)
        instance.__dict__[self.name] = value
        return value


_FACTS = "facts"  # the memo key of a conversation's `Facts`
_PAIRED = "paired"  # …and of the note that its messages pair validly (`Conversation.checked`)
# The parts of `Facts` that the texts of tool results do not change: they depend on the calls,
# the units and the user's requests alone.
_OF_STRUCTURE = ("units", "_walk", "arguments", "call_counts", "queries")


class Facts:
    """What the policies ask about one conversation, worked out once for it (see `facts`): the
    tool of each call, each message's results, units, the user's requests, call arguments,
    copies, stale results, pointers and what each result is worth. Each part is computed the
    first time it is asked for."""

    def __init__(
        self, conversation: Conversation, earlier: Facts | None = None, changed: Iterable[int] = ()
    ) -> None:
        """The facts of `conversation`; with `earlier`, the facts of a conversation it differs
        from only in the texts of the tool results of the messages at `changed`
        (`Conversation.with_results`): what those texts do not change is taken from them, those
        messages' results are read again, and the rest is worked out afresh when asked for."""
        # The dialect and messages, not the conversation: the conversation keeps its facts.
        self.dialect, self.messages = conversation.dialect, conversation.messages
        self.origin = conversation.origin
        dialect, messages = self.dialect, self.messages
        if earlier is None:
            self.names = dialect.tools_by_call(messages)
            self.results = tuple([dialect.tool_results(m, self.names) for m in messages])
            self.editable = tuple(map(editable, self.results))
            self._call_terms: dict[Unit, frozenset[str]] = {}
            return
        self.names = earlier.names
        results, editables = list(earlier.results), list(earlier.editable)
        for index in changed:
            results[index] = dialect.tool_results(messages[index], self.names)
            editables[index] = editable(results[index])
        self.results, self.editable = tuple(results), tuple(editables)
        self._call_terms = earlier._call_terms
        known = earlier.__dict__
        self.__dict__.update({name: known[name] for name in _OF_STRUCTURE if name in known})

    @_Once
    def units(self) -> list[Unit]:
        return self.dialect.units(self.messages)

    @_Once
    def _walk(self) -> tuple[tuple[frozenset[str], ...], int]:
        """The requests before each message (and the current one), and where the last is: a
        user message that is no notice of brim's and says something, or at least answers no
        tool call (an image alone is a request; a turn of tool results is not)."""
        dialect = self.dialect
        answering = {i for u in self.units if u.kind in ("tools", "orphan") for i in u.indices}
        first: frozenset[str] | None = None
        request: frozenset[str] = frozenset()
        found: list[frozenset[str]] = []
        last = -1
        for index, message in enumerate(self.messages):
            found.append(request)
            if dialect.role(message) != "user":
                continue
            text = dialect.text(message).strip()
            if text.startswith("[brim") or (not text and index in answering):
                continue
            last = index
            if text:
                first = terms_of(text) if first is None else first
                request = first | terms_of(text)
        found.append(request)
        return tuple(found), last

    @property
    def requests(self) -> tuple[frozenset[str], ...]:
        return self._walk[0]

    @property
    def last_request(self) -> int:
        return self._walk[1]

    @_Once
    def arguments(self) -> tuple[list[tuple[str, Any]], ...]:
        dialect = self.dialect
        return tuple(dialect.call_arguments(m) for m in self.messages)

    @_Once
    def call_counts(self) -> Counter[str]:
        """How often each call key occurs in the conversation (more than once: keyed by name)."""
        return Counter(key for found in self.arguments for key, _ in found)

    def call_terms(self, unit: Unit) -> frozenset[str]:
        known = self._call_terms.get(unit)
        if known is None:
            terms: set[str] = set()
            for index in unit.indices:
                for _, arguments in self.arguments[index]:
                    for text in strings_of(arguments):
                        terms |= terms_of(text)
            known = self._call_terms[unit] = frozenset(terms)
        return known

    @_Once
    def copies(self) -> dict[ResultKey, tuple[int, ToolResult]]:
        return copies(self.editable)

    @_Once
    def queries(self) -> dict[str, str]:
        """What each call asked — its tool and arguments — by call key, for the calls whose key
        occurs once in the conversation."""
        asked: dict[str, str] = {}
        for found in self.arguments:
            for call, arguments in found:
                if arguments is not None and self.call_counts[call] == 1:
                    asked[call] = f"{self.names.get(call, 'tool')}:{_canonical(arguments)}"
        return asked

    @_Once
    def stale(self) -> dict[ResultKey, str]:
        asked = self.queries
        duplicates = self.copies
        stale: dict[ResultKey, str] = {}
        seen: set[str] = set()
        for index in range(len(self.editable) - 1, -1, -1):  # newest first: "later" is seen
            for result in reversed(self.editable[index]):
                key = (index, result.call_id)
                query = asked.get(result.call_id)
                placeholder = is_placeholder(result.text)
                if placeholder:
                    stale[key] = "placeholder"
                elif key in duplicates:
                    stale[key] = "duplicate"
                elif query is not None and query in seen:
                    stale[key] = "superseded"
                if query is not None and not placeholder:
                    seen.add(query)
        return stale

    @_Once
    def pointers(self) -> dict[ResultKey, list[ResultKey]]:
        """The results pointers name (their later copy), each with the pointers naming it."""
        held: dict[str, list[int]] = {}  # call key → the messages with an editable result of it
        for index, found in enumerate(self.editable):
            for result in found:
                held.setdefault(result.call_id, []).append(index)
        origin = self.origin
        named: dict[ResultKey, list[ResultKey]] = {}
        for index, found in enumerate(self.editable):
            for result in found:
                if not result.text.startswith(SAME_AS_PREFIX):
                    continue
                match = _POINTER.search(result.text)
                if match is None:
                    continue
                at = None if match["at"] is None else int(match["at"])
                target = next(
                    (
                        later
                        for later in held.get(match["call"], ())
                        if later > index and (at is None or origin[later] == at)
                    ),
                    None,
                )
                if target is not None:
                    named.setdefault((target, match["call"]), []).append((index, result.call_id))
        return named

    @_Once
    def values(self) -> tuple[tuple[int, ...], ...]:
        stale, request = self.stale, self.requests
        values: list[tuple[int, ...]] = []
        for index, found in enumerate(self.results):
            if not found:  # most messages hold no result: no generator for them
                values.append(())
                continue
            terms = request[index]
            values.append(
                tuple(
                    STALE
                    if (index, result.call_id) in stale
                    else EVIDENCE
                    if has_evidence(result.text, terms)
                    else PLAIN
                    for result in found
                )
            )
        return tuple(values)


@dataclass(frozen=True, slots=True)
class _Earlier:
    """The facts of an earlier conversation that differs from the one whose memo holds this
    only in the texts of the tool results of the messages at `changed` (`with_results`)."""

    facts: Facts
    changed: frozenset[int]


def facts(conversation: Conversation) -> Facts:
    """The facts of `conversation`, worked out once: the policies of one compression ask about
    the same messages (a policy that changes nothing passes the very conversation on, one that
    rewrites tool results passes on what the texts of results do not change)."""
    known = conversation.memo.get(_FACTS)
    if isinstance(known, Facts):
        return known
    if isinstance(known, _Earlier):
        made = Facts(conversation, known.facts, known.changed)
    else:
        made = Facts(conversation)
    conversation.memo[_FACTS] = made
    return made


def requests(conversation: Conversation) -> tuple[frozenset[str], ...]:
    """The terms of the user's request before each message, and last, the current one (one
    more entry than messages): those of the first user message (the task, as agents get it)
    and of the last one so far; brim's own notices and turns that only carry tool results
    aside.

    A result is judged by the request it was fetched for, never by later turns: so it is judged
    the same way in every later turn, and what brim makes of it (and the request prefix) stays
    put as the session grows."""
    return facts(conversation).requests


def last_request(conversation: Conversation) -> int:
    """Where the last user message is, as `requests` walks them: never a turn that only
    carries tool results (Anthropic and Gemini send those as user turns) nor a notice of
    brim's; -1 if there is none."""
    return facts(conversation).last_request


def call_terms(conversation: Conversation, unit: Unit) -> frozenset[str]:
    """The terms of the arguments of the tool calls a unit makes."""
    return facts(conversation).call_terms(unit)


def stale_results(conversation: Conversation) -> dict[ResultKey, str]:
    """Tool results a later one makes (nearly) redundant, by (message index, call key), among
    the results a policy may rewrite one by one (`editable`):
    "placeholder" — already a stand-in; "duplicate" — a later result has the same content;
    "superseded" — a later call of the same tool with the same arguments answered differently
    (a file read, edited and read again: the older read is out of date). Only a call whose key
    occurs once in the conversation is known by its arguments: calls keyed by name (Gemini's
    without ids) are never superseded by another call of the same tool."""
    return facts(conversation).stale


def result_values(conversation: Conversation) -> tuple[tuple[int, ...], ...]:
    """What each result is worth, per message and in the order of its results: STALE (see
    `stale_results`), EVIDENCE — it mentions a term of the request it was fetched for or
    reports an anomaly — or PLAIN."""
    return facts(conversation).values


def pointed_at(conversation: Conversation) -> dict[ResultKey, list[ResultKey]]:
    """The results that pointers (older copies pointed onward) name, each with the pointers
    that name it."""
    return facts(conversation).pointers
