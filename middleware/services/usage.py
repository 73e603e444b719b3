"""Reading what a provider's reply says of itself: the usage it reports and the model that
answered, in a whole reply's body or in a stream's events as they pass (each wire API says
where: `Wire.usage`, `Wire.response_model`). One reading per reply: the stage that reads it
leaves it on the reply (`UpstreamResponse.reported`), where the stages outside find it.
`LearnRatios` learns token ratios from it; `Observe` puts it on spans and in the GenAI
metrics (`gen_ai.client.token.usage`, `gen_ai.response.model`)."""

from __future__ import annotations

import re
from typing import Any

import orjson

from brim.adapters.adapter import Reported, UpstreamResponse
from brim.policies.wires.base import Wire, sse_data

MAX_PENDING = 4 * 1024 * 1024  # a usage-bearing event is small; a longer line is not one
# Where a reply or event can carry usage: a "usage" or "usageMetadata" key with an object (not
# the `"usage":null` an OpenAI stream sends in every chunk once it is asked for usage).
USAGE_MARK = b'"usage'
USAGE_OBJECT = re.compile(rb'"usage(?:Metadata)?"\s*:\s*\{')


class EventData:
    """The `data:` payloads of a stream's complete events, however its bytes were split into
    reads (an event's end may arrive in a later read than its start)."""

    def __init__(self) -> None:
        self.pending = b""  # the unfinished line

    def feed(self, chunk: bytes, marker: bytes = b"") -> list[bytes]:
        """The complete events' payloads so far; with `marker`, none unless it is among the
        bytes read (an unfinished line is kept until its end is read, so a marker split
        across reads is found once its line is complete)."""
        data = self.pending + chunk if self.pending else chunk
        self.pending = data[data.rfind(b"\n") + 1 :][-MAX_PENDING:]
        return sse_data(data) if marker in data else []


def take(wire: Wire, payload: Any, found: Reported) -> None:
    """What one reply body or stream event says, into `found`: its usage (merged over what
    earlier events said, later ones winning field by field) and the model that answered."""
    usage = wire.usage(payload)
    if usage is not None:
        found.usage = usage if found.usage is None else found.usage.merged(usage)
    model = wire.response_model(payload)
    if model is not None:
        found.model = model


def take_event(wire: Wire, data: bytes, found: Reported) -> None:
    """What one event's `data:` payload says, if it carries usage (the events that carry usage
    name the model too)."""
    if USAGE_MARK not in data or USAGE_OBJECT.search(data) is None:
        return
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    take(wire, payload, found)


def body_reported(wire: Wire, body: bytes) -> Reported:
    """What a whole reply's body says: one JSON object, or a stream's events read in one piece.
    Nothing is parsed unless the body's head or tail names usage."""
    found = Reported()
    if body.find(USAGE_MARK, 0, 65536) < 0 and body.find(USAGE_MARK, len(body) - 8192) < 0:
        return found
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        for data in EventData().feed(body + b"\n", USAGE_MARK):
            take_event(wire, data, found)
        return found
    take(wire, payload, found)
    return found


def whole_reported(wire: Wire, reply: UpstreamResponse) -> Reported:
    """What a whole reply says of itself: read once (`reply.reported`, where a stage inside
    read it already), from its payload where the adapter parsed it, else from its body."""
    if reply.reported is not None:
        return reply.reported
    if reply.payload is not None:
        found = Reported()
        take(wire, reply.payload, found)
        return found
    return body_reported(wire, reply.body or b"")


class StreamUsage:
    """What a stream says of itself, gathered into `reported` chunk by chunk as it passes
    (`feed`)."""

    __slots__ = ("_events", "reported", "wire")

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.reported = Reported()
        self._events = EventData()

    def feed(self, chunk: bytes) -> None:
        # Most reads are whole lines without usage: nothing to keep and nothing to parse (the
        # test is the same `EventData.feed` would make, without its copies).
        if USAGE_MARK in chunk or self._events.pending or not chunk.endswith(b"\n"):
            for data in self._events.feed(chunk, USAGE_MARK):
                take_event(self.wire, data, self.reported)
