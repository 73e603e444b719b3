"""What each compressed conversation became, so its next turn is built on it (`policies.carry`).

Bounded by the bytes of brim's own items it holds (the client's untouched items are kept as
indices into the next request, not stored); least recently used sessions go first. Per process:
a miss costs one deterministic re-compression, nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cachetools import LRUCache

from policies.carry import Carried

Key = tuple[str, str, bytes]  # (wire API, tokenizer, digest of the client's items covered)


class SessionMemory:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self._carried: LRUCache[Key, Carried] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda carried: carried.weight
        )
        self._lock = threading.Lock()

    def latest(self, api: str, tokenizer: str, digests: Sequence[bytes]) -> Carried | None:
        """The carried turn covering the longest prefix of a request's items (`digests`, as
        `prefix_digests` gives them)."""
        with self._lock:
            for digest in reversed(digests):
                found = self._carried.get((api, tokenizer, digest))
                if found is not None:
                    return found
        return None

    def remember(self, api: str, tokenizer: str, digest: bytes, carried: Carried) -> None:
        if carried.weight > self._carried.maxsize:
            return
        with self._lock:
            self._carried[api, tokenizer, digest] = carried

    def __len__(self) -> int:
        return len(self._carried)
