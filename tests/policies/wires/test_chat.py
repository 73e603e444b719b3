from __future__ import annotations

from typing import Any

from brim.policies.wires.base import NO_RESULT
from brim.policies.wires.chat import ChatDialect

D = ChatDialect()


def call(call_id: str, name: str = "read_file") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def result(call_id: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "s"},
    {"role": "developer", "content": "d"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b", "grep")]},
    result("a"),
    result("b"),
    {"role": "assistant", "content": "done"},
    {"role": "user", "content": [{"type": "text", "text": "more"}]},
]


def test_units_group_a_tool_call_with_all_its_results() -> None:
    assert [(u.kind, u.start, u.end) for u in D.units(MESSAGES)] == [
        ("system", 0, 1),
        ("system", 1, 2),
        ("user", 2, 3),
        ("tools", 3, 6),
        ("assistant", 6, 7),
        ("user", 7, 8),
    ]
    assert D.tools_by_call(MESSAGES) == {"a": "read_file", "b": "grep"}
    assert D.violations(MESSAGES) == []


def test_violations_name_each_broken_pairing() -> None:
    orphan = [{"role": "user", "content": "u"}, result("x")]
    assert D.violations(orphan) == ["messages[1]: tool result 'x' answers no open call"]
    unanswered = [
        {"role": "assistant", "tool_calls": [call("a")]},
        {"role": "user", "content": "u"},
    ]
    assert D.violations(unanswered) == ["messages[1]: tool calls ['a'] have no result"]
    duplicate = [{"role": "assistant", "tool_calls": [call("a")]}, result("a"), result("a")]
    assert D.violations(duplicate) == ["messages[2]: tool result 'a' answered already"]
    dangling = [{"role": "user", "content": "u"}, {"role": "assistant", "tool_calls": [call("a")]}]
    assert D.violations(dangling) == ["end of messages: tool calls ['a'] have no result"]
    late = [
        {"role": "assistant", "tool_calls": [call("a")]},
        {"role": "user", "content": "u"},
        result("a"),
    ]
    assert len(D.violations(late)) == 2
    # A message without calls closes the group: a result after it answers nothing, whether or
    # not its call was answered before (the group's answers are forgotten).
    reopened = [
        {"role": "assistant", "tool_calls": [call("a")]},
        result("a"),
        {"role": "assistant", "content": "done"},
        result("a"),
        {"role": "assistant", "tool_calls": [call("b"), "not a call", {"id": None}]},
        result("b"),
        result("a"),
    ]
    assert D.violations(reopened) == [
        "messages[3]: tool result 'a' answers no open call",
        "messages[6]: tool result 'a' answers no open call",
    ]


def test_repair_is_minimal_and_keeps_untouched_messages_as_they_are() -> None:
    broken = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "tool_calls": [call("a"), call("b")]},
        result("a"),
        result("a", "duplicate"),
        {"role": "user", "content": "next"},
        result("ghost"),
        {"role": "assistant", "tool_calls": [call("c")]},
    ]
    fixed, done = D.repaired(broken)
    assert D.violations(fixed) == []
    assert [m.get("tool_call_id") for m in fixed if m["role"] == "tool"] == ["a", "b", "c"]
    assert fixed[3] == {"role": "tool", "tool_call_id": "b", "content": NO_RESULT}
    assert fixed[0] is broken[0] and fixed[2] is broken[2]
    assert len(done) == 4  # duplicate dropped, b added, ghost dropped, c added
    assert D.repaired(MESSAGES) == (MESSAGES, [])


def test_text_helpers_change_only_the_largest_text() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "short"},
            {"type": "image_url", "image_url": {"url": "u"}},
            {"type": "text", "text": "the longest part"},
        ],
        "x": 1,
    }
    assert D.largest_text(message) == "the longest part"
    changed = D.with_largest_text(message, "cut")
    assert changed["content"][2] == {"type": "text", "text": "cut"}
    assert changed["content"][:2] == message["content"][:2]
    assert (
        changed["x"] == 1 and message["content"][2]["text"] == "the longest part"
    )  # input unchanged


def test_a_call_repeating_an_id_in_its_message_is_dropped() -> None:
    messages = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("a", "grep")]},
        result("a"),
    ]
    assert D.violations(messages) == ["messages[1]: tool call ids ['a'] repeat"]
    repaired, done = D.repaired(messages)
    assert repaired[1]["tool_calls"] == [call("a")] and repaired[2] is messages[2]
    assert done == ["dropped repeated tool calls ['a']"] and D.violations(repaired) == []
    assert len(messages[1]["tool_calls"]) == 2  # the input is not mutated


def test_only_orphan_results_repair_to_nothing() -> None:
    repaired, done = D.repaired([result("x"), result("y")])
    assert repaired == [] and len(done) == 2
