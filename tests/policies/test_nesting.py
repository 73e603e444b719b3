"""`nests_deeper_than` against values of known depth."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.nesting import SAFE_DEPTH, nests_deeper_than


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@given(depth=st.integers(0, 400), width=st.integers(0, 5))
def test_depth_is_found_exactly_beside_shallow_siblings(depth: int, width: int) -> None:
    value = {"wide": [{"a": [1, 2]}] * width, "deep": nested(depth)}
    levels = max(1 + depth, 4 if width else 2)  # the top object, then the deeper branch
    assert nests_deeper_than(value, levels - 1)
    assert not nests_deeper_than(value, levels)


def test_scalars_and_empty_containers() -> None:
    assert not nests_deeper_than("text", 0)
    assert not nests_deeper_than(7, 0)
    assert nests_deeper_than([], 0) and not nests_deeper_than([], 1)
    assert nests_deeper_than({"a": {}}, 1) and not nests_deeper_than({"a": {}}, 2)


def test_what_passes_the_safe_depth_can_always_be_written_back() -> None:
    at_limit = nested(SAFE_DEPTH)
    assert not nests_deeper_than(at_limit, SAFE_DEPTH)
    assert orjson.loads(orjson.dumps(at_limit)) == at_limit
    assert nests_deeper_than(nested(SAFE_DEPTH + 1), SAFE_DEPTH)
