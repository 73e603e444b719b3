"""`Remembered`: the bounded least-recently-used map behind the policies' hot caches."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Remembered(Generic[K, V]):
    """A bounded least-recently-used map: two C calls a look-up (cachetools' `LRUCache` takes
    four Python ones, and a compression or a long request's count looks up thousands). Values
    are never None. Not thread-safe by itself: its users hold a lock around it."""

    __slots__ = ("_data", "maxsize")

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        data = self._data
        data[key] = value
        data.move_to_end(key)
        if len(data) > self.maxsize:
            data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
