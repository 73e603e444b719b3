"""A scripted provider whose turns come from a callback, for capturing real CLI sessions.

`ExploringSession` plays `ScriptedProvider`'s part (windows, pairing checks, side requests,
every API's replies, streaming or not), but each main turn — a request that offers the CLI's
`tool` — is what `next_turn(api, body)` says: (words, tool name, arguments) for a tool call,
or None for the final answer. `bench.capture` drives the real Claude Code and Codex CLIs with it,
the turns chosen by `bench.explore.Explorer` from the tool results the CLI sent back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.restoring_cli import call_reply
from tests.scripted_provider import WIRE_OF, Call, ScriptedProvider

NextTurn = Callable[[str, dict[str, Any]], tuple[str | None, str, dict[str, Any]] | None]


@dataclass
class ExploringSession(ScriptedProvider):
    """Main turns from `next_turn` (None: the final answer, `final`); call ids numbered."""

    next_turn: NextTurn | None = None
    turns: int = 0
    planned: dict[int, tuple[str | None, str, dict[str, Any], int]] | None = None

    def _admit(
        self, api: str, model: str, body: dict[str, Any], offered: bool, problems: list[str]
    ) -> Call:
        call = super()._admit(api, model, body, offered, problems)
        if call.reply != "final" or self.next_turn is None:
            return call
        turn = self.next_turn(WIRE_OF[api], body)
        if turn is not None:
            self.turns += 1
            self.planned = {**(self.planned or {}), len(self.calls) - 1: (*turn, self.turns)}
            call.reply = f"explore {self.turns}"
        return call

    async def _reply_instead(self, request: web.Request, call: Call) -> web.StreamResponse | None:
        if not call.reply.startswith("explore "):
            return None
        index = next(n for n, seen in enumerate(self.calls) if seen is call)
        said, name, arguments, number = (self.planned or {})[index]
        return await call_reply(request, call, index + 1, said, f"x{number:03d}", name, arguments)
