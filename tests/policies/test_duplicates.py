"""`policies.duplicates.repeated_key`: exact whatever the writer's style, fast path or not."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.duplicates import repeated_key

keys = st.text(min_size=1, max_size=6)
leaves = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)
objects = st.dictionaries(keys, values, min_size=1, max_size=5)
STYLES = [
    orjson.dumps,
    lambda v: json.dumps(v).encode(),
    lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode(),
    lambda v: json.dumps(v, indent=2).encode(),
]


def check(raw: bytes) -> str | None:
    return repeated_key(raw, orjson.loads(raw))


@given(value=objects, style=st.sampled_from(STYLES))
def test_no_repeat_is_found_in_any_writers_style(value: dict[str, Any], style: Any) -> None:
    assert check(style(value)) is None


@given(value=objects, style=st.sampled_from(STYLES), nested=st.booleans())
def test_a_repeat_is_found_at_any_depth(value: dict[str, Any], style: Any, nested: bool) -> None:
    key = next(iter(value))
    inner = style(value)
    # The first key again, written in the same object: at the top, or one level down.
    raw = b'{"' + json.dumps(key)[1:-1].encode() + b'": 0, ' + inner[1:]
    if nested:
        raw = b'{"wrapper": [' + raw + b"]}"
    assert check(raw) == key


def test_escaped_colons_cannot_hide_a_repeat() -> None:
    """Each `\\u003a` adds a colon to the parsed strings that the text does not show as one: as
    many as the repeats would balance the counts, so any such escape takes the exact path."""
    assert check(b'{"a": "\\u003a", "a": 1}') == "a"
    assert check(b'{"a": "\\u003A\\u003a", "b": {"a": 1, "a": 2}}') == "a"
    assert check(b'{"a": "\\u003a", "b": 1}') is None
    assert check(b'{"url": "http://x", "t": "\\\\u003a"}') is None  # an escaped backslash


def test_what_orjson_writes_is_taken_as_it_is() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a: b"}]})
    assert check(raw) is None
    assert check(b'{"model":"m","model":"n"}') == "model"
