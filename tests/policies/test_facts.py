"""What the policies work out about a conversation goes with it where it still holds: a policy
that rewrites only the texts of tool results (`Conversation.with_results`) passes on what those
texts do not change, and what it passes on is what would be worked out afresh."""

from __future__ import annotations

import pytest

from brim.policies.conversation import Conversation
from brim.policies.facts import Facts, facts
from brim.policies.wires import WIRES
from tests.policies.test_information import BUILDERS, EDITED, NOISE, SOURCE, Builder, session

# Every part of `Facts`, as the policies ask for them.
PARTS = (
    "names",
    "results",
    "editable",
    "units",
    "requests",
    "last_request",
    "arguments",
    "call_counts",
    "queries",
    "copies",
    "stale",
    "pointers",
    "values",
)
PLACEHOLDER = "[brim cleared this read_file result (900 tokens) to fit the context window]"


def _conversation(wire: Builder) -> Conversation:
    return wire.conversation(
        session(
            wire,
            wire.turn("c1", "read_file", {"path": "src/config.py"}, SOURCE),
            [wire.user("Now look at the parse_config tests.")],
            wire.turn("c2", "read_file", {"path": "src/config.py"}, EDITED),
            wire.turn("c3", "run_command", {"command": "ls -l"}, NOISE),
            wire.turn("c4", "grep", {"pattern": "parse_section"}, SOURCE),
        )
    )


def _rewritten(conversation: Conversation, texts: dict[str, str]) -> dict[int, tuple[object, int]]:
    """Changes that give the results of these calls these texts."""
    dialect = conversation.dialect
    changes: dict[int, tuple[object, int]] = {}
    for index, found in enumerate(facts(conversation).results):
        for result in found:
            if result.call_id in texts:
                message = changes.get(index, (conversation.messages[index], 0))[0]
                changes[index] = (
                    dialect.with_tool_result(message, result.call_id, texts[result.call_id]),
                    1,
                )
    assert len(changes) == len(texts)
    return changes


@pytest.mark.parametrize("api", sorted(WIRES))
def test_facts_carried_past_a_rewrite_of_results_are_the_facts_worked_out_afresh(api: str) -> None:
    wire = BUILDERS[api]
    conversation = _conversation(wire)
    earlier = facts(conversation)
    for part in PARTS:  # all of it worked out, as the policies before a rewrite would have
        getattr(earlier, part)
    # c1 becomes a placeholder, c4 a copy of c2 (so c2 is pointed to no more, c4 is stale…)
    rewritten = conversation.with_results(
        _rewritten(conversation, {"c1": PLACEHOLDER, "c4": EDITED})
    )
    carried, afresh = facts(rewritten), Facts(rewritten)
    for part in PARTS:
        assert getattr(carried, part) == getattr(afresh, part), part
    # …what the rewrite changes is worked out again, what it cannot change is carried
    assert carried.results != earlier.results and carried.stale != earlier.stale
    assert carried.units is earlier.units and carried.requests is earlier.requests
    assert carried.arguments is earlier.arguments and carried.queries is earlier.queries


@pytest.mark.parametrize("api", sorted(WIRES))
def test_facts_are_carried_through_several_rewrites(api: str) -> None:
    wire = BUILDERS[api]
    conversation = _conversation(wire)
    earlier = facts(conversation)
    earlier.units  # noqa: B018 - worked out, to be carried
    once = conversation.with_results(_rewritten(conversation, {"c1": PLACEHOLDER}))
    twice = once.with_results(_rewritten(once, {"c3": PLACEHOLDER}))
    carried = facts(twice)
    assert carried.units is earlier.units
    for part in PARTS:
        assert getattr(carried, part) == getattr(Facts(twice), part), part


@pytest.mark.parametrize("api", sorted(WIRES))
def test_facts_start_afresh_after_a_replace(api: str) -> None:
    """`replace` (truncate's cut, which may reach the text of a user's request) carries
    nothing over."""
    wire = BUILDERS[api]
    conversation = _conversation(wire)
    earlier = facts(conversation)
    earlier.units  # noqa: B018 - worked out, and not to be carried
    replaced = conversation.replace(_rewritten(conversation, {"c1": PLACEHOLDER}))
    assert facts(replaced).units is not earlier.units
    assert facts(replaced).units == earlier.units
