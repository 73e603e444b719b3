"""Making a request fit: pair repair, then the configured policies in order, to a low-water mark.

    outcome = compress(dialect, messages, fixed, meter, policies, limit=..., low_water=0.85)

The policies run in order while the request is over `low_water × limit` (the target): cuts that
are reversible and made in snapped batches (placeholders, evictions) go down to it, so the next
turns of the session fit without a new cut and the prefix stays put. Each policy gets the whole
`Goal`, and a cut into text (`truncate`, the last resorts inside `evict`) goes only as far as
`limit`: it never destroys more than the budget needs. A session known to grow (`room`: tokens
to leave free for its next turns, `policies.carry`) is cut below the low-water mark, at most to
`MIN_TARGET_SHARE` of the limit; the batches stay on the grid the low-water mark sets.
The outcome says whether the result fits the limit, and what each policy did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from brim.policies.clear import ClearSettings, ClearToolResults
from brim.policies.conversation import Conversation, Dialect, FidelityRecord, Goal, Meter, Policy
from brim.policies.evict import Evict, EvictSettings
from brim.policies.prune import PruneSettings, PruneToolResults
from brim.policies.tokens import CounterMeter
from brim.policies.truncate import Truncate, TruncateSettings

# proxy.toml name → (policy class, its settings model, short name in x-brim-actions)
REGISTRY: dict[str, tuple[Callable[[Any], Policy], type[BaseModel], str]] = {
    "prune_tool_results": (PruneToolResults, PruneSettings, "prune"),
    "clear_tool_results": (ClearToolResults, ClearSettings, "clear"),
    "evict": (Evict, EvictSettings, "evict"),
    "truncate": (Truncate, TruncateSettings, "truncate"),
}
DEFAULT_ORDER = tuple(REGISTRY)
MIN_TARGET_SHARE = 0.5  # room for a session's next turns takes the target no lower than this
SHORT = {name: short for name, (_, _, short) in REGISTRY.items()} | {"summarize": "summarize"}


def build_policies(order: Sequence[str], settings: Mapping[str, BaseModel]) -> list[Policy]:
    unknown = [name for name in order if name not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(REGISTRY)}")
    return [REGISTRY[name][0](settings.get(name)) for name in order]


@dataclass(frozen=True, slots=True)
class Outcome:
    messages: tuple[Any, ...]
    changed: bool
    tokens_in: int
    tokens_out: int
    limit: int
    target: int
    records: tuple[FidelityRecord, ...]
    repairs: tuple[str, ...]
    tried: tuple[str, ...]
    sizes: tuple[int, ...]  # each message's tokens, as `messages`
    carried: bool = False  # the previous turn's compressed request plus the new items
    ratio: float = 1.0  # the meter's (`Meter.ratio`): what the sizes were scaled by

    @property
    def fits(self) -> bool:
        return self.tokens_out <= self.limit

    @property
    def actions(self) -> str:
        """`prune:3,clear:12,evict:4` — what was done, in policy order; `none` if nothing."""
        counts: Counter[str] = Counter(
            SHORT.get(record.policy, record.policy)
            for record in self.records
            if record.action != "notice"
        )
        if self.repairs:
            counts["repair"] = len(self.repairs)
        return ",".join(f"{name}:{n}" for name, n in counts.items()) or "none"


def compress(
    dialect: Dialect,
    messages: Sequence[Any],
    fixed: int,
    meter: Meter,
    policies: Sequence[Policy],
    *,
    limit: int,
    low_water: float,
    room: int = 0,
    repair: bool = True,
) -> Outcome:
    repairs: list[str] = []
    clean = False  # known to pair validly
    if repair:
        if dialect.violations(messages):
            messages, repairs = dialect.repaired(messages)
        else:
            clean = True
    conversation = Conversation.of(dialect, messages, meter, fixed)
    if clean:
        conversation.checked()
    tokens_in = conversation.total
    goal = Goal(
        target=room_target(limit, low_water, room),
        limit=limit,
        grid=max(1, limit - int(limit * low_water)),
    )
    records: list[FidelityRecord] = []
    tried: list[str] = []
    if conversation.total > limit:
        for policy in policies:
            if conversation.total <= goal.target:
                break
            tried.append(policy.name)
            conversation, done = policy.apply(conversation, goal, meter)
            records += done
        # e.g. Anthropic's "start with a user"; not asked again where the policies only
        # rewrote the texts of tool results of messages checked already
        if not conversation.known_valid and dialect.violations(conversation.messages):
            fixed_messages, notes = dialect.repaired(conversation.messages)
            repairs += notes
            conversation = Conversation.of(dialect, fixed_messages, meter, fixed)
    return Outcome(
        messages=conversation.messages,
        sizes=conversation.sizes,
        changed=bool(repairs or records),
        tokens_in=tokens_in,
        tokens_out=conversation.total,
        limit=limit,
        target=goal.target,
        records=tuple(records),
        repairs=tuple(repairs),
        tried=tuple(tried),
        ratio=meter.ratio,
    )


def room_target(limit: int, low_water: float, room: int) -> int:
    """The low-water mark, or lower where `room` asks it (never below `MIN_TARGET_SHARE`)."""
    mark = int(limit * low_water)
    if room <= 0:
        return mark
    return min(mark, max(limit - room, int(limit * MIN_TARGET_SHARE)))


def compress_request(
    body: Mapping[str, Any],
    meter: CounterMeter,
    policies: Sequence[Policy],
    *,
    limit: int,
    low_water: float,
    room: int = 0,
    repair: bool = True,
) -> Outcome:
    """`compress` for a request body of the meter's wire API."""
    wire = meter.wire
    return compress(
        wire.dialect,
        wire.conversation(body),
        meter.fixed(body),
        meter,
        policies,
        limit=limit,
        low_water=low_water,
        room=room,
        repair=repair,
    )
