"""A scripted session that uses `brim_restore`, for driving the real CLIs (tests/test_real_clis.py).

`RestoringSession` plays the session of `ScriptedProvider` — the CLI reads one big file after
another — until a request shows a key: brim cut the request to fit the window, and a placeholder
or notice names what it stands for. Its next turn then calls `brim_restore` with that key,
in the request's own wire format, after a line of text (so brim relays the text at once and
splices the next round onto the same reply). The request that carries brim's answer to that call
(the hidden round, which the CLI never sees) gets the final text. Everything else — the window,
the pairing checks, the records — is `ScriptedProvider`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from brim.middleware.stages.restore import RESTORE_TOOL
from brim.policies.wires.base import Usage
from tests.policies.wires import test_restore_shapes as shapes
from tests.restoring import SHAPE_OF, shown_keys
from tests.scripted_provider import (
    OUTPUT_TOKENS,
    WIRE_OF,
    Call,
    ScriptedProvider,
    stream_in_pieces,
    tool_uses,
)


@dataclass(frozen=True)
class Asked:
    """The turn that called brim_restore: the key it passed, read in the request it answered."""

    key: str
    call: Call


@dataclass
class RestoringSession(ScriptedProvider):
    """`ScriptedProvider`'s session, with one `brim_restore` call as soon as a request shows a
    key; its hidden round answered with `final` (the files not all read by then). Like a model
    that read the key, it calls the tool whether or not the request offers it (the tests check
    that brim did): a brim that did not answer the call lets the client see it."""

    lead: str = "Let me look at what was cut."
    asked: Asked | None = None
    answered: Call | None = None  # the hidden round: the request with brim's answer

    def _admit(
        self, api: str, model: str, body: dict[str, Any], offered: bool, problems: list[str]
    ) -> Call:
        shown = shown_keys(body) if self.asked is None and offered else []
        key = shown[0] if shown else None  # the first key the request shows
        answered = self.asked is not None and bool(tool_uses(api, body, RESTORE_TOOL.name))
        mine = key is not None or answered
        # Refused, or a side request, as the session would; else one of this class's turns.
        call = super()._admit(api, model, body, offered and not mine, problems)
        if call.reply != "text" or not mine:
            return call
        call.main = True
        if key is not None:
            self.asked = Asked(key, call)
            call.reply = "restore"
        else:
            self.answered = call
            call.reply = "final"
        return call

    async def _reply_instead(self, request: web.Request, call: Call) -> web.StreamResponse | None:
        if call.reply != "restore" or self.asked is None:
            return None
        arguments = {"key": self.asked.key}
        return await call_reply(
            request, call, len(self.calls), self.lead, "restore_1", RESTORE_TOOL.name, arguments
        )


async def call_reply(
    request: web.Request,
    call: Call,
    count: int,
    said: str | None,
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
) -> web.StreamResponse:
    """A reply to `call` (the provider's `count`th) in its own wire API that says `said` (if
    anything) and calls `tool` (its id `toolu_<call_id>` for Anthropic, `call_<call_id>`
    elsewhere): streamed, in pieces, if the request asked for a stream."""
    prefix = "toolu" if call.api == "messages" else "call"
    segments: list[shapes.Segment] = [shapes.Say(said)] if said else []
    segments.append(shapes.Call(f"{prefix}_{call_id}", tool, arguments))
    turn = shapes.Turn(tuple(segments), Usage(call.tokens, OUTPUT_TOKENS, 0))
    shape = SHAPE_OF[WIRE_OF[call.api]]
    streamed = (
        request.match_info["target"].endswith(":streamGenerateContent")
        if call.api == "gemini"
        else bool(call.body.get("stream"))
    )
    if not streamed:
        return web.json_response(shape.reply(turn))
    return await stream_in_pieces(request, shapes.round_stream(shape, turn, count))
