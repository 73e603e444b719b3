"""A fast fake OpenAI-compatible provider for the benchmarks: `python -m bench.fake --port P`.

Answers every chat request at once with a fixed reply (or a five-chunk stream), so what the
bench measures is the proxies, not the provider. A fixed reply carries the times the request
arrived and the reply left (`RECEIVED`, `ANSWERED`), for the bench to split a proxy's added
latency into the way in and the way back. A stream whose body asks for `"fake_events": N`
gets N content events instead, `EVENT_GAP_S` apart, so that each reaches the proxy as a read of
its own (the relay scenario: a proxy's cost per event relayed). The one exception is for the
hostile-load bench (`bench.hostile`): a request for the model `"held"` is held open until
`POST /fake/release` (at most `HOLD_S`), then answered as usual; `GET /fake/held` says how many
are being held.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
from aiohttp import web

REPLY = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "pong"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
)
CHUNKS = [
    b"data: "
    + orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "fake-model",
            "choices": [{"index": 0, "delta": {"content": part}, "finish_reason": None}],
        }
    )
    + b"\n\n"
    for part in ("Hel", "lo", " wor", "ld", "!")
] + [b"data: [DONE]\n\n"]
EVENTS_ASKED = b'"fake_events":'
EVENT_GAP_S = 0.001
HELD_MODEL = b'"model":"held"'
HOLD_S = 60.0  # the longest a held request waits for /fake/release
RECEIVED, ANSWERED = "x-fake-received-ms", "x-fake-answered-ms"  # `now_ms` of a plain reply


class Holding:
    """The requests for the model "held" waiting for a release."""

    def __init__(self) -> None:
        self.waiting = 0
        self.release = asyncio.Event()

    async def hold(self) -> None:
        self.waiting += 1
        try:
            async with asyncio.timeout(HOLD_S):
                await self.release.wait()
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1


HOLDING = web.AppKey("holding", Holding)


def now_ms() -> float:
    """CLOCK_MONOTONIC in ms: one clock for every process on the machine, so a time this fake
    stamps and one the load client reads can be subtracted (`load.one`'s legs)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC) * 1000


async def chat(request: web.Request) -> web.StreamResponse:
    received = now_ms()
    body = await request.read()
    if HELD_MODEL in body[:200]:
        await request.app[HOLDING].hold()
    if b'"stream":true' not in body.replace(b" ", b""):
        # when the request reached the provider and when its answer left: the proxies relay
        # these headers as they relay any, and the bench splits a proxy's added latency by them
        stamps = {RECEIVED: repr(received), ANSWERED: repr(now_ms())}
        return web.Response(body=REPLY, content_type="application/json", headers=stamps)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if EVENTS_ASKED in body:
        for index in range(int(orjson.loads(body)["fake_events"])):
            await response.write(CHUNKS[index % (len(CHUNKS) - 1)])
            await asyncio.sleep(EVENT_GAP_S)
        await response.write(CHUNKS[-1])
        return response
    for chunk in CHUNKS:
        await response.write(chunk)
    return response


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


async def held(request: web.Request) -> web.Response:
    return web.json_response({"held": request.app[HOLDING].waiting})


async def release(request: web.Request) -> web.Response:
    """Let every held request go on; the ones that come later are held again."""
    holding = request.app[HOLDING]
    released, holding.release = holding.release, asyncio.Event()
    released.set()
    return web.json_response({"released": holding.waiting})


def new_app() -> web.Application:
    """An app for a bench server: bodies up to 256 MB."""
    return web.Application(client_max_size=256 * 1024 * 1024)


def run_quietly(app: web.Application, port: int) -> None:
    """Serve `app` on 127.0.0.1:`port` on uvloop where installed, with no access log."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=lambda *_: None, backlog=1024
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = new_app()
    app[HOLDING] = Holding()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/fake/held", held)
    app.router.add_post("/fake/release", release)
    run_quietly(app, args.port)


if __name__ == "__main__":
    main()
