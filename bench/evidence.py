"""Next-action evidence: what an assistant turn uses that it first read in an earlier tool result.

An agent's next step is built from what its tools told it: the path a grep hit named, the line
number a traceback gave, the commit hash `git log` printed, the id in an API's JSON. A compressed
request that lost those cannot lead to the same step. So for each assistant turn T of a session,
its *evidence* is every token of T (its text and its calls' arguments) that

- looks like an id, number or path (`evidence_like`: has a digit, a slash, a file suffix, or is
  a dotted, snake_case or CamelCase name; at least 3 characters), and
- first appears in the session inside a tool result, before T (not in the system prompt, the
  tool definitions, a user message or an earlier assistant turn: those the model had anyway).

A token of T that is not found as it is may be found as a path's tail: `/tmp/w/src/app.py` is
evidence if `src/app.py` first appeared in a result (the longest such tail counts).

Tokens match whole, never inside a longer token: `120` is not in `1205` or `0.120`. Texts are
matched as the model reads them: every string of a request (JSON strings inside strings, such as
a call's arguments, read as JSON too), not the escaped JSON of the body.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bench.sessions import Session

TOKEN = re.compile(r"[\w./\-]+")
FILE_NAME = re.compile(r"[\w\-]+\.[A-Za-z][A-Za-z0-9]{0,5}")
DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
CAMEL = re.compile(r"[a-z][A-Z]")
MIN_LENGTH = 3


def evidence_like(token: str) -> bool:
    """Whether a token reads as an id, a number or a path rather than a word."""
    if len(token) < MIN_LENGTH:
        return False
    if any(c.isdigit() for c in token):
        return True
    if "/" in token and any(c.isalpha() for c in token):
        return True
    if FILE_NAME.fullmatch(token) or DOTTED_NAME.fullmatch(token):
        return True
    core = token.strip("_")
    return len(token) >= 6 and ("_" in core or bool(CAMEL.search(token)))


def tokens(text: str) -> list[str]:
    """The evidence-like tokens of `text`, in order, each once."""
    found: dict[str, None] = {}
    for match in TOKEN.finditer(text):
        token = match.group().strip("./-")
        if evidence_like(token):
            found[token] = None
    return list(found)


def tails(token: str) -> list[str]:
    """`token`, then each shorter tail of it after a slash that still reads as evidence."""
    parts = token.split("/")
    return [
        tail
        for n in range(len(parts))
        if evidence_like(tail := "/".join(parts[n:]).strip("./-")) and tail
    ]


@functools.lru_cache(maxsize=65_536)
def _pattern(token: str) -> re.Pattern[str]:
    # Not preceded by a word character (or one and a dot), not followed by one (or a dot and
    # one): a whole token, never the middle of `1205`, `0.120` or `app.pyc`.
    return re.compile(r"(?<!\w)(?<!\w\.)" + re.escape(token) + r"(?!\w)(?!\.\w)")


def found(token: str, text: str) -> bool:
    """Whether `token` is in `text` as a whole token."""
    return token in text and _pattern(token).search(text) is not None


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys aside; a string that is itself a JSON object or array
    (a call's arguments) is read as JSON too."""
    if isinstance(value, str):
        yield value
        if value[:1] in ("{", "[") and value[-1:] in ("}", "]"):
            try:
                inner = orjson.loads(value)
            except orjson.JSONDecodeError:
                return
            yield from strings(inner)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def plain(value: Any) -> str:
    """What a model reads of a request (or of a restored original): its strings, one per line."""
    return "\n".join(strings(value))


def plain_original(text: str) -> str:
    """A restored original as the model reads it: the text, or the strings of its JSON."""
    if text[:1] in ("{", "["):
        try:
            return plain(orjson.loads(text))
        except orjson.JSONDecodeError:
            pass
    return text


# ---------------------------------------------------------------- a session's evidence


@dataclass(frozen=True)
class Segment:
    kind: str  # "context" (system prompt, tools), "user", "assistant", "result"
    turn: int  # the turn it belongs to (-1: context)
    text: str


def segments(session: Session) -> list[Segment]:
    """The session's text in the order a model reads it."""
    context = [session.system] + [
        f"{t.name}\n{t.description}\n{plain(t.parameters)}" for t in session.tools
    ]
    out = [Segment("context", -1, "\n".join(context))]
    for index, turn in enumerate(session.turns):
        if turn.role == "user":
            out.append(Segment("user", index, turn.text or ""))
            continue
        said = [turn.text or ""] + [plain(call.arguments) for call in turn.calls]
        out.append(Segment("assistant", index, "\n".join(said)))
        out += [Segment("result", index, call.result) for call in turn.calls]
    return out


def turn_text(session: Session, index: int) -> str:
    """An assistant turn's own words: its text and its calls' arguments."""
    turn = session.turns[index]
    return "\n".join([turn.text or "", *(plain(call.arguments) for call in turn.calls)])


class Evidence:
    """Each assistant turn's evidence in one session (`of(turn)`), found once."""

    SEPARATOR = "\n\x00\n"

    def __init__(self, session: Session) -> None:
        self.session = session
        self.parts = segments(session)
        self.offsets: list[int] = []
        at = 0
        for part in self.parts:
            self.offsets.append(at)
            at += len(part.text) + len(self.SEPARATOR)
        self.text = self.SEPARATOR.join(part.text for part in self.parts)
        self.cache: dict[int, tuple[str, ...]] = {}

    def first(self, token: str) -> Segment | None:
        """The segment where `token` first appears (as a whole token)."""
        if token not in self.text:
            return None
        match = _pattern(token).search(self.text)
        if match is None:
            return None
        return self.parts[bisect.bisect_right(self.offsets, match.start()) - 1]

    def of(self, turn: int) -> tuple[str, ...]:
        """The evidence of assistant turn `turn`: its tokens (or their path tails) that first
        appeared in a tool result of an earlier turn."""
        if turn in self.cache:
            return self.cache[turn]
        found_here: dict[str, None] = {}
        if self.session.turns[turn].role == "assistant":
            for token in tokens(turn_text(self.session, turn)):
                for tail in tails(token):
                    where = self.first(tail)
                    if where is not None and where.kind == "result" and where.turn < turn:
                        found_here[tail] = None
                        break
        self.cache[turn] = tuple(found_here)
        return self.cache[turn]


@dataclass(frozen=True)
class Kept:
    """Of one turn's evidence: what the request kept, and what one `brim_restore` call could
    fetch back (kept included)."""

    tokens: tuple[str, ...]
    kept: tuple[str, ...]
    recoverable: tuple[str, ...]


def judge(evidence: Sequence[str], request: str, originals: Iterable[str] = ()) -> Kept:
    """Which of `evidence` the request's text (`plain`) holds, and which a restored original
    (as the model would read it, `plain_original`) holds besides."""
    kept = tuple(token for token in evidence if found(token, request))
    texts = [plain_original(text) for text in originals]
    recoverable = tuple(
        token for token in evidence if token in kept or any(found(token, text) for text in texts)
    )
    return Kept(tuple(evidence), kept, recoverable)
