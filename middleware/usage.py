"""Reading the usage a provider reports in a reply: in a whole reply's body, or in the events of
a stream as they pass (each wire API says where, `Wire.usage`). What `Observe` puts on spans and
`LearnRatios` learns token ratios from."""

from __future__ import annotations

import re

import orjson

from policies.wires.base import Usage, Wire, sse_data

MAX_PENDING = 4 * 1024 * 1024  # a usage-bearing event is small; a longer line is not one
# Where a reply or event can carry usage: a "usage" or "usageMetadata" key with an object (not
# the `"usage":null` an OpenAI stream sends in every chunk once it is asked for usage).
USAGE_MARK = b'"usage'
USAGE_OBJECT = re.compile(rb'"usage(?:Metadata)?"\s*:\s*\{')


class EventData:
    """The `data:` payloads of a stream's complete events, however its bytes were split into
    reads (an event's end may arrive in a later read than its start)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes, marker: bytes = b"") -> list[bytes]:
        """The complete events' payloads so far; with `marker`, none unless it is among the
        bytes read (an unfinished line is kept until its end is read, so a marker split
        across reads is found once its line is complete)."""
        data = self._pending + chunk if self._pending else chunk
        self._pending = data[data.rfind(b"\n") + 1 :][-MAX_PENDING:]  # the unfinished line
        return sse_data(data) if marker in data else []


def event_usage(wire: Wire, data: bytes) -> Usage | None:
    """The usage one event's `data:` payload reports, if it reports any."""
    if USAGE_MARK not in data or USAGE_OBJECT.search(data) is None:
        return None
    try:
        return wire.usage(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


def body_usage(wire: Wire, body: bytes) -> Usage | None:
    """The usage in a whole reply: one JSON object, or a stream's events read in one piece
    (their reports merged, later ones winning field by field)."""
    if USAGE_MARK not in body[:65536] and USAGE_MARK not in body[-8192:]:
        return None
    try:
        return wire.usage(orjson.loads(body))
    except orjson.JSONDecodeError:
        found = None
        for data in EventData().feed(body + b"\n", USAGE_MARK):
            usage = event_usage(wire, data)
            if usage is not None:
                found = usage if found is None else found.merged(usage)
        return found


class StreamUsage:
    """The usage a stream reports, gathered chunk by chunk as it passes (`feed`)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.usage: Usage | None = None
        self._events = EventData()

    def feed(self, chunk: bytes) -> None:
        for data in self._events.feed(chunk, USAGE_MARK):
            found = event_usage(self.wire, data)
            if found is not None:
                self.usage = found if self.usage is None else self.usage.merged(found)
