"""Whether a JSON text repeats a key within one object (`{"model": "a", "model": "b"}`).

Parsers disagree on such a text (orjson, which brim parses with, keeps the last value; others
keep the first or refuse it), so brim could route, count and guard a request on one reading
while the provider acts on another. orjson has no option to refuse them, so this looks after
the parse, at a quarter to a third of its cost for the compact JSON that SDKs and CLIs send
(about its whole cost again for spaced-out JSON; a 560 KB conversation parses in 3.5 ms):

1. orjson writes the parsed value back out: if that is the text itself (compact JSON in
   orjson's style, as JavaScript's `JSON.stringify`, serde_json and httpx write it), no key was
   dropped, so none was repeated.
2. Otherwise count colons. The text's colons are one per key plus those inside strings; the
   written-out value's are one per key kept plus those inside the kept strings, where orjson
   writes every colon as it is. A text may also write a colon in a string as `\\u003a`, so with
   no such escape in it the two counts are equal exactly when no key was dropped.
3. Anything else (a surplus of colons, or escapes) is decided by the standard library's parser,
   which shows every key of every object: exact, slower, and only for such texts.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

ESCAPED_COLON = b"\\u003"  # the prefix of \u003a and \u003A (and of a few other escapes)


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Repeated(key)
        seen.add(key)


def repeated_key(raw: bytes, value: Any) -> str | None:
    """A key that `raw` repeats within one of its objects, at any depth; None if there is none.
    `value` is `raw` as orjson parsed it (module doc)."""
    try:
        written = orjson.dumps(value)
    except orjson.JSONEncodeError:
        written = b""
    if written == raw:
        return None
    if raw.count(b":") == written.count(b":") and ESCAPED_COLON not in raw:
        return None
    try:
        json.loads(raw, object_pairs_hook=_unique)
    except _Repeated as repeated:
        return repeated.key
    except ValueError:  # what orjson read and json does not (neither happens): not a repeat
        return None
    return None
