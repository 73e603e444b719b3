"""How deeply a parsed JSON value nests.

orjson reads JSON up to 1 024 levels deep but refuses to write more than 254, and anything that
walks a value recursively in Python stops near 1 000. brim re-encodes what it compresses, so it
accepts only values it can always write back: `SAFE_DEPTH` levels, well inside both limits.
"""

from __future__ import annotations

from typing import Any

SAFE_DEPTH = 128


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` has more than `limit` levels of objects and arrays (a scalar has none).
    Iterative, and it stops at the first branch past the limit."""
    if type(value) is not dict and type(value) is not list:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is dict or kind is list:
                push((item, depth + 1))
    return False
