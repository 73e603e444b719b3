"""What the policies read in a text: task terms, anomalies, brim's own stand-ins.

Pure functions of a text (the ones asked of whole tool results remembered by content, since
results come back every turn): the terms of a user's request (`terms_of`), the keys a term is
matched against (`keys_of`), whether a text reports something going wrong (`is_anomaly`), and
the placeholders and pointers brim writes in place of a result (`is_placeholder`, `pointer`).
"""

from __future__ import annotations

import functools
import operator
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from brim.policies.remembered import Remembered

NAMES_LABEL = "Names in it: "  # the last line of a cleared result's placeholder: what it named
NAMES_SEPARATOR = " "  # between the names a line lists (`names_line`): no name holds a space
NO_RESULT = "[no result was recorded for this tool call]"  # what repair answers a lost call with
SAME_AS_PREFIX = "[brim: same content as "  # an older copy `prune_tool_results` points onward
_PLACEHOLDER_PREFIXES = ("[brim", NO_RESULT)  # brim's own stand-ins, and repair's
_TERM_SOURCE_CHARS = 4_000  # of each text the task terms are read from

# A number that starts with this many digits or more is listed with a result's names: an id, a
# constant, a port, a size, a timestamp — a fact the result states once and no later turn can
# work out again. Shorter numbers are mostly counts and line numbers. (Real Claude Code
# sessions whose next turn wrote the ioctl constants and ids it read earlier: issue 35.)
LONG_NUMBER_DIGITS = 4
LONG_DIGITS = re.compile(rf"\d{{{LONG_NUMBER_DIGITS},}}")
_TOKEN = re.compile(r"[\w][\w.\-/]*")
_PIECES = re.compile(r"[/.\-_]+")
POINTER = re.compile(
    r"for call (?P<call>.*?)(?: in message (?P<at>\d+))?; see there; sha256:[0-9a-f]{16}\]\Z",
    re.DOTALL,
)
_STRIP = operator.methodcaller("strip", ".-/")
_CAMEL = re.compile(r"[a-z][A-Z]")
_DIGIT = re.compile(r"\d")
# Every ASCII character that no token has (`_TOKEN` in ASCII text): a space instead.
_NOT_TOKEN = bytes(
    c if c < 128 and (chr(c).isalnum() or chr(c) in "_.-/") else ord(" ") for c in range(256)
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
# and its length, as in `policies.conversation.archive_key`.
_TEXT_FACTS: Remembered[tuple[int, int], _TextFacts] = Remembered(maxsize=8_192)
_CACHE_LOCK = threading.Lock()


def names_line(named: Sequence[str]) -> str:
    """The line listing the names a stand-in keeps of what it replaced (a cleared result's
    placeholder, a notice's quoted line, truncate's marker): `NAMES_LABEL`, then the names,
    a space between two (`NAMES_SEPARATOR`): a comma would cost a token more per name, a quarter
    of a number's, so a line would list fewer in the same room. Ids under one path are written
    under it once (`grouped`)."""
    return NAMES_LABEL + NAMES_SEPARATOR.join(grouped(named))


def listed_names(listing: str) -> list[str]:
    """The names a names line lists (what follows `NAMES_LABEL`), in its order, those written
    under a shared path (`grouped`) spelled out; a line written with commas between them (brim
    before 2026-12-07) reads the same."""
    found: list[str] = []
    for name in (name.rstrip(",") for name in listing.split()):
        path, brace, own = name.partition("/{")
        if brace and own.endswith("}"):
            found += [f"{path}/{each}" for each in own.removesuffix("}").split(",")]
        else:
            found.append(name)
    return found


def is_id(name: str) -> bool:
    """Whether a name is an id: one with a long number in it (`48213`, `JEP-4213`,
    `2018-10-26`, `issues/2817`)."""
    return bool(LONG_DIGITS.search(name))


def id_under_path(name: str) -> tuple[str, str] | None:
    """(its path, its own part) of a name whose own part — after its last `/` — is an id (a
    pull request's link, a numbered file); None for any other name."""
    path, _, own = name.rpartition("/")
    return (path, own) if path and is_id(own) else None


def grouped(names: Sequence[str]) -> list[str]:
    """`names`, those ids that share a path (`id_under_path`) written under it once, as a shell
    writes them — `github.com/o/r/pull/{2385,2390}` — where the first of them stood; a path's
    one id, and every other name, as it is. Names hold no braces or commas (`identifiers`), so
    `listed_names` reads them back."""
    split = [(name, id_under_path(name)) for name in names]
    under: dict[str, list[str]] = {}
    for _, parts in split:
        if parts:
            under.setdefault(parts[0], []).append(parts[1])
    written: list[str] = []
    for name, parts in split:
        if parts is None:
            written.append(name)
        elif (owns := under.pop(parts[0], None)) is not None:  # where its path's first stood
            written.append(name if len(owns) == 1 else f"{parts[0]}/{{{','.join(owns)}}}")
    return written


def grouped_cost(name: str, under: Mapping[str, int], cost: Callable[[str], int]) -> int:
    """What `name` adds to a names line (`grouped`) that lists `under[path]` ids under each
    path already, `cost` being what a name adds written alone: an id under a path listed
    already adds its own part (and the braces, for the path's second), else itself. The one
    rule `fitting` (in characters) and evict's ids line (in tokens) count by."""
    whole = cost(name)
    parts = id_under_path(name)
    listed = under.get(parts[0], 0) if parts else 0
    if not parts or not listed:
        return whole
    return min(whole, cost(parts[1]) + (2 if listed == 1 else 0))


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


def _runs(text: str) -> list[str]:
    """The runs of `text` that make its tokens (`_TOKEN`), in order, before stripping; an
    ASCII text (most are) is split in C instead of by the expression — the same runs, plus
    perhaps runs of dots, dashes and slashes alone, which strip to ""."""
    if text.isascii():
        return text.encode().translate(_NOT_TOKEN).decode().split()
    return _TOKEN.findall(text)


def _tokens(text: str) -> set[str]:
    """The distinct tokens of `text` (`_TOKEN`: a word character, then word characters, dots,
    dashes and slashes), stripped of dots, dashes and slashes at either end — plus perhaps ""
    (`_runs`), which callers drop."""
    return set(map(_STRIP, set(_runs(text))))


def identifier_counts(text: str) -> dict[str, int]:
    """How often each identifier of `text` (`identifiers`) occurs, in the order each first
    does."""
    counts: dict[str, int] = {}
    for run, n in Counter(_runs(text)).items():  # in order of first appearance
        token = _STRIP(run)
        if _is_identifier(token):
            counts[token] = counts.get(token, 0) + n
    return counts


def _keys(text: str, tokens: set[str] | None = None) -> frozenset[str]:
    """The keys of `text` (`keys_of`); `tokens`: its own (`_tokens`) where it is ASCII (its
    tokens in lower case are then those of its lower case), if known already."""
    lowered = _tokens(text.lower()) if tokens is None else set(map(str.lower, tokens))
    keys: set[str] = set()
    for token in lowered:  # a text repeats its words: each once
        keys.add(token)
        keys.update(_PIECES.split(token))
        if "/" in token:
            keys.update(token.split("/"))
    keys.discard("")
    return frozenset(keys)


class _TextFacts:
    """What is known of one text: whether it reports an anomaly, its identifiers and its keys,
    each worked out when first asked for (a race works one out twice)."""

    __slots__ = ("_anomaly", "ids", "keys")

    def __init__(self) -> None:
        self._anomaly: bool | None = None
        self.keys: frozenset[str] | None = None
        self.ids: frozenset[str] | None = None

    def anomaly(self, text: str) -> bool:
        """Whether `text`, the text these are the facts of, reports an anomaly (`is_anomaly`)."""
        if self._anomaly is None:
            self._anomaly = is_anomaly(text)
        return self._anomaly

    def ids_of(self, text: str) -> frozenset[str]:
        """The identifiers of `text`, the text these are the facts of (`identifiers`)."""
        if self.ids is None:
            self.ids = identifiers(text)
        return self.ids

    def keys_of(self, text: str) -> frozenset[str]:
        """The keys of `text`, the text these are the facts of. An ASCII text's identifiers are
        worked out with them, from the same tokens: the results whose keys are asked for (are
        they evidence?) have their identifiers asked for too (`policies.facts.last_use`)."""
        if self.keys is None:
            if text.isascii() and self.ids is None:
                tokens = _tokens(text)
                self.ids = frozenset(filter(_is_identifier, tokens))
                self.keys = _keys(text, tokens)
            else:
                self.keys = _keys(text)
        return self.keys


def _text_facts(text: str) -> _TextFacts:
    key = (len(text), hash(text))
    with _CACHE_LOCK:
        known = _TEXT_FACTS.get(key)
    if known is None:
        known = _TextFacts()
        with _CACHE_LOCK:
            _TEXT_FACTS[key] = known
    return known


def keys_of(text: str) -> frozenset[str]:
    """Every lower-case word, identifier, file name and path piece in `text`: what a task term
    is matched against (`parse_config`, `config`, `prune.py`, `prune` from `policies/prune.py`).
    Remembered by content: meant for whole results, which come back every turn."""
    return _text_facts(text).keys_of(text)


def identifiers_of(text: str) -> frozenset[str]:
    """`identifiers`, remembered by content: meant for whole results, which come back every
    turn."""
    return _text_facts(text).ids_of(text)


def keys_in(text: str) -> frozenset[str]:
    """`keys_of`, worked out afresh: for pieces of a result, not worth remembering one by one."""
    return _keys(text)


def mentions(text: str, terms: frozenset[str]) -> bool:
    """Whether a line or an item mentions a task term (`keys_in`)."""
    return bool(terms) and not terms.isdisjoint(_keys(text))


def has_evidence(text: str, terms: frozenset[str]) -> bool:
    """Whether a result mentions a task term or an anomaly."""
    known = _text_facts(text)  # looked up once for both
    return known.anomaly(text) or bool(terms and not terms.isdisjoint(known.keys_of(text)))


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


def canonical(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


def identifiers(text: str) -> frozenset[str]:
    """The identifiers and numbers in `text`, as they are written: tokens of three or more
    characters with a digit in them (a number, a hash, a version, an id) or a path separator,
    a dot, an underscore or a change of case inside (`src/app.py`, `parse_config`,
    `ContextTooLarge`). Ordinary words are not: `words` has those."""
    # An identifier is a token (`_TOKEN`) without the dots, dashes and slashes it ends with.
    return frozenset(filter(_is_identifier, _tokens(text)))


def identifiers_among(text: str, known: frozenset[str]) -> frozenset[str]:
    """`identifiers(text)`, where `known` are those of a text `text` is a line of (a token
    lies within a line): the tokens of `text` that are among them."""
    return frozenset(_tokens(text) & known) if known else known


def _is_identifier(token: str) -> bool:
    if len(token) < 3:
        return False
    if token.isalpha():  # letters alone: only a change of case makes a name of it
        return not (token.islower() or token.isupper()) and bool(_CAMEL.search(token))
    return (
        "/" in token
        or "." in token  # never at either end: a token starts and ends with a word character
        or "_" in token[1:-1]
        or _DIGIT.search(token) is not None
        or _CAMEL.search(token) is not None
    )
