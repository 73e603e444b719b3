"""Making a request fit: pair repair, then the configured policies in order, to a low-water mark.

    outcome = compress(dialect, messages, fixed, meter, policies, limit=..., low_water=0.85)

Two passes over the policies, in their order:

1. reversible cuts only, while the request is over `low_water × limit` (the target): lossless
   rewrites (prune's minified JSON and pointers to later copies), placeholders (clear) and
   evictions of unprotected units (evict), made in snapped batches, lowest value and oldest
   first. They go down to the target so the next turns of the session fit without a new cut
   and the prefix stays put. A session known to grow (`room`: tokens to leave free for its next
   turns, `policies.carry`) is cut below the low-water mark, at most to `MIN_TARGET_SHARE` of
   the limit — by these cuts alone: where they cannot make that room, less is left;
2. only where the request is still over `limit`: the last resorts — cuts into text (prune's
   cuts of results to their most informative lines, truncate) and evictions of the protected
   units (the first request, recent turns) — which go only as far as `limit`: they never
   destroy more than the budget needs, and a request cut into text uses (nearly) all of it.

The outcome says whether the result fits the limit, and what each policy did.
"""

from __future__ import annotations

import dataclasses
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
# Room for a session's next turns takes the target no lower than this. Lower keeps a carried
# prefix longer but sends less after each re-cut: at 0.5, a re-cut went out at half the budget
# and lost next-action evidence that oldest-first eviction kept (bench.fidelity, 2026-11-28).
MIN_TARGET_SHARE = 0.7
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
    text_cuts: bool = True,
) -> Outcome:
    """`messages` made to fit `limit` (see the module's docstring); with `text_cuts` off, the
    last resorts evict protected units but cut no text."""
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
        reversible_only=True,
        room=room,
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
        # The last resorts, only as far as the limit: the target is the limit now.
        last = dataclasses.replace(goal, target=limit, reversible_only=False, text_cuts=text_cuts)
        for policy in policies:
            if conversation.total <= limit:
                break
            if policy.name not in tried:
                tried.append(policy.name)
            conversation, done = policy.apply(conversation, last, meter)
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
    text_cuts: bool = True,
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
        text_cuts=text_cuts,
    )
