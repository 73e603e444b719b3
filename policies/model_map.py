"""litellm's model map (`model_prices_and_context_window_backup.json`), parsed into the few facts
brim needs. Parsing only: the caller reads the file once at start-up (see `proxy.resources`)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

_TEXT_MODES = frozenset({"chat", "responses", "completion"})
_PRICE_TIER = re.compile(r"^input_cost_per_token_above_(\d+)k_tokens$")


@dataclass(frozen=True, slots=True)
class MapEntry:
    context_window: int | None  # litellm's max_input_tokens
    max_output: int | None
    provider: str | None
    # The smallest input size above which the map prices input higher, where that is below the
    # window (`input_cost_per_token_above_200k_tokens`: 200 000): a long-context tier.
    price_tier: int | None = None


def price_tier(value: Mapping[str, Any], window: int) -> int | None:
    """The smallest `input_cost_per_token_above_<N>k_tokens` threshold below `window`."""
    tiers = [
        int(found.group(1)) * 1_000
        for key in value
        if (found := _PRICE_TIER.match(key)) is not None
    ]
    below = [tier for tier in tiers if tier < window]
    return min(below) if below else None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class ModelMap:
    def __init__(self, entries: Mapping[str, MapEntry]) -> None:
        self._entries = dict(entries)

    @classmethod
    def empty(cls) -> ModelMap:
        return cls({})

    @classmethod
    def from_json(cls, data: bytes) -> ModelMap:
        """Keep the text models that state a window; keys are lower-cased."""
        raw = orjson.loads(data)
        entries: dict[str, MapEntry] = {}
        for key, value in raw.items():
            if not isinstance(value, dict) or value.get("mode", "chat") not in _TEXT_MODES:
                continue
            window = _positive_int(value.get("max_input_tokens"))
            if window is None:
                continue
            output = _positive_int(value.get("max_output_tokens")) or _positive_int(
                value.get("max_tokens")
            )
            provider = value.get("litellm_provider")
            entries[key.lower()] = MapEntry(
                window,
                output,
                provider if isinstance(provider, str) else None,
                price_tier(value, window),
            )
        return cls(entries)

    def get(self, model: str) -> MapEntry | None:
        return self._entries.get(model)

    def ids(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
