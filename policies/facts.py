"""What the policies ask about one conversation, worked out once for it (`facts`).

What a tool result is worth: duplicates, superseded reads, task terms and anomalies. Shared by
`prune_tool_results` (what to keep inside a result), `clear_tool_results` and `evict` (what to
remove first). All of it is a pure function of the conversation, so the same history is judged
the same way every turn. Kept on the conversation's memo, and carried through rewrites of the
texts of tool results (`Conversation.with_results`) as far as it still holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from brim.policies.conversation import Conversation, Lasting, ToolResult, Unit
from brim.policies.text import (
    POINTER,
    SAME_AS_PREFIX,
    canonical,
    has_evidence,
    identifiers_of,
    is_placeholder,
    strings_of,
    terms_of,
)

T = TypeVar("T")
STALE, PLAIN, EVIDENCE = 0, 1, 2  # a result's value: redundant, no task term or anomaly, evidence
MIN_DUPLICATE_CHARS = 256  # shorter equal results ("ok", "done") are not worth pointing onward


def editable(results: Sequence[ToolResult]) -> list[ToolResult]:
    """The results a policy may rewrite one by one: those whose call id is the only one of its
    kind in the message (Gemini pairs calls without ids by name, and a rewrite by a shared key
    would reach every result that has it)."""
    if len(results) < 2:
        return list(results)
    counts = Counter(result.call_id for result in results)
    return [result for result in results if counts[result.call_id] == 1]


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

# The parts of `Facts` that the texts of tool results do not change: they depend on the calls,
# the units and the user's requests alone.
_OF_STRUCTURE = ("units", "_walk", "arguments", "call_counts", "queries")


class Facts(Lasting):
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
        # What each message names and prints, read again only where its results changed.
        for name, read in (("_named", self._names_in), ("_printed", self._printed_in)):
            if name in known:
                parts = list(known[name])
                for index in changed:
                    parts[index] = read(index)
                self.__dict__[name] = tuple(parts)

    def through(self, changed: frozenset[int]) -> Lasting:
        return _Earlier(self, changed)

    @_Once
    def units(self) -> list[Unit]:
        return self.dialect.units(self.messages)

    @_Once
    def unit_of(self) -> dict[int, Unit]:
        """The unit each message is in, by its index."""
        return {index: unit for unit in self.units for index in unit.indices}

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
                    asked[call] = f"{self.names.get(call, 'tool')}:{canonical(arguments)}"
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
                match = POINTER.search(result.text)
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
    def last_use(self) -> tuple[int, ...]:
        """For each message, where what its results said was last used: the last assistant
        message whose text or call arguments name an identifier (`identifiers`: a path, a
        name, a number, a hash) that this message's results were the latest to print before
        it — or the message itself, if none did. A result the agent keeps acting on is as
        recent as its latest use."""
        latest: dict[str, int] = {}  # identifier → the latest message whose results printed it
        used = list(range(len(self.messages)))
        for index, (named, printed) in enumerate(zip(self._named, self._printed, strict=True)):
            for name in named:
                holder = latest.get(name)
                if holder is not None:
                    used[holder] = index
            for found in printed:
                for name in found:
                    latest[name] = index
        return tuple(used)

    def carried(self, index: int) -> frozenset[str]:
        """The identifiers message `index` puts in front of the model: those an assistant
        message names, those its results print."""
        return self._named[index].union(*self._printed[index])

    @_Once
    def _named(self) -> tuple[frozenset[str], ...]:
        """The identifiers each assistant message names in its text and call arguments (none
        for the other messages)."""
        return tuple(map(self._names_in, range(len(self.messages))))

    def _names_in(self, index: int) -> frozenset[str]:
        dialect, message = self.dialect, self.messages[index]
        if dialect.role(message) != "assistant":
            return frozenset()
        said = [dialect.text(message)]
        said += [s for _, arguments in self.arguments[index] for s in strings_of(arguments)]
        return identifiers_of("\n".join(said))  # the same text every turn: remembered

    @_Once
    def _printed(self) -> tuple[tuple[frozenset[str], ...], ...]:
        """The identifiers each of each message's results prints (`identifiers_of`)."""
        return tuple(map(self._printed_in, range(len(self.messages))))

    def _printed_in(self, index: int) -> tuple[frozenset[str], ...]:
        found = self.results[index]
        return tuple([identifiers_of(result.text) for result in found]) if found else ()

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
class _Earlier(Lasting):
    """The facts of an earlier conversation that differs from the one whose memo holds this
    only in the texts of the tool results of the messages at `changed` (`with_results`)."""

    facts: Facts
    changed: frozenset[int]

    def through(self, changed: frozenset[int]) -> Lasting:
        return _Earlier(self.facts, self.changed | changed)


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


def last_use(conversation: Conversation) -> tuple[int, ...]:
    """Where what each message's results said was last used (`Facts.last_use`): the last
    assistant message that acted on an identifier they printed, or the message itself."""
    return facts(conversation).last_use


def pointed_at(conversation: Conversation) -> dict[ResultKey, list[ResultKey]]:
    """The results that pointers (older copies pointed onward) name, each with the pointers
    that name it."""
    return facts(conversation).pointers
