"""What each compressed conversation became, so its next turn is built on it (`policies.carry`).

Bounded by what its entries take in memory (`Carried.weight`: the items brim wrote, object by
object, and allowances for the indices, sizes and records; the client's untouched items are
kept as indices into the next request, not stored). Least recently used entries go first, and
before them the entries a request has grown past: its successor is remembered in a moment, and
they stay only for a request that branches off them (an edited last message, a side request on
the same history) while there is room. Per process: a miss costs one deterministic
re-compression, nothing else. Entries are the owner's of the request that made them
(`Exchange.owner`): another client's request with the same items never builds on them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from brim.policies.carry import Carried

# (owner, wire API, tokenizer, digest of the client's items covered)
Key = tuple[str, str, str, bytes]


class SessionMemory:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.max_bytes = max_bytes
        self._carried: OrderedDict[Key, Carried] = OrderedDict()  # the next to go first
        self._bytes = 0
        self._lock = threading.Lock()

    def latest(
        self, owner: str, api: str, tokenizer: str, digests: Sequence[bytes]
    ) -> Carried | None:
        """`owner`'s carried turn covering the longest prefix of a request's items (`digests`,
        as `prefix_digests` gives them). One covering all of them (the same request again) is
        used afresh; one the request has grown past is the next to go when room is needed."""
        with self._lock:
            for at in range(len(digests) - 1, -1, -1):
                key = (owner, api, tokenizer, digests[at])
                found = self._carried.get(key)
                if found is not None:
                    self._carried.move_to_end(key, last=at == len(digests) - 1)
                    return found
        return None

    def remember(
        self, owner: str, api: str, tokenizer: str, digest: bytes, carried: Carried
    ) -> None:
        if carried.weight > self.max_bytes:
            return
        key = (owner, api, tokenizer, digest)
        with self._lock:
            replaced = self._carried.pop(key, None)
            if replaced is not None:
                self._bytes -= replaced.weight
            self._carried[key] = carried
            self._bytes += carried.weight
            while self._bytes > self.max_bytes:
                _, gone = self._carried.popitem(last=False)
                self._bytes -= gone.weight

    @property
    def weight(self) -> int:
        """What the remembered entries take, by their weights: at most `max_bytes`."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._carried)
