"""Compressed request bodies (issue 34, attack 6): decoded once by brim, sent on without
`Content-Encoding`, counted decoded against `max_body_mb` and `max_body_buffer_mb`, and a
decompression bomb stopped at `max_decompression_ratio`, on every wire API."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import BrimFactory, every_api
from tests.fakes import FakeProvider
from tests.proxy.test_admission import metric, provider_holds
from tests.proxy.test_bad_input import PATHS, shaped
from tests.security.test_edge_input import BODIES

HELLO = [{"role": "user", "content": "ping"}]


@pytest.fixture
def base(brim: BrimFactory, provider: FakeProvider) -> str:
    return brim(**every_api(provider))


def post(base: str, wire: str, content: bytes, coding: str) -> httpx.Response:
    headers = {"content-type": "application/json", "content-encoding": coding}
    return httpx.post(f"{base}{PATHS[wire]}", content=content, headers=headers, timeout=30)


def deflate(data: bytes, *, raw: bool = False) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("wire", list(PATHS))
@pytest.mark.parametrize(
    ("coding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", lambda data: gzip.compress(data[:9]) + gzip.compress(data[9:])),  # 2 members
        ("deflate", deflate),
        ("Deflate", lambda data: deflate(data, raw=True)),  # raw deflate, as some clients send
    ],
)
def test_a_compressed_request_reaches_the_provider_decoded(
    base: str, provider: FakeProvider, wire: str, coding: str, pack: Any
) -> None:
    """Every compressed request failed (aiohttp decoded the body, `Content-Encoding: gzip` went
    on with it). The provider now gets the JSON as the client wrote it, and no coding."""
    raw = orjson.dumps(BODIES[wire])
    reply = post(base, wire, pack(raw), coding)
    assert reply.status_code == 200, reply.text
    assert provider.last.body == raw
    assert "content-encoding" not in provider.last.headers


def bomb(wire: str) -> bytes:
    """A body of about 6 KB that decodes to 6 MB: under `max_body_mb` (32) both ways."""
    body = {**BODIES[wire], "user": "x" * 6_000_000}
    packed = gzip.compress(orjson.dumps(body), compresslevel=9)
    assert len(packed) < 10_000
    return packed


@pytest.mark.parametrize("wire", list(PATHS))
def test_a_decompression_bomb_gets_a_413_and_nothing_is_sent(
    base: str, provider: FakeProvider, wire: str
) -> None:
    reply = post(base, wire, bomb(wire), "gzip")
    assert reply.status_code == 413
    assert "max_decompression_ratio" in shaped(wire, reply)
    assert provider.requests == []


def test_the_decoded_size_is_held_to_max_body_mb(brim: BrimFactory, provider: FakeProvider) -> None:
    base = brim(server={"max_body_mb": 1, "max_decompression_ratio": 10_000})
    reply = post(base, "openai", bomb("openai"), "gzip")
    assert reply.status_code == 413 and "server.max_body_mb" in shaped("openai", reply)
    assert provider.requests == []


def test_compressed_bodies_take_their_decoded_size_under_max_body_buffer_mb(
    brim: BrimFactory, provider: FakeProvider
) -> None:
    """Six 9 KB bodies that decoded to 6 MB each were all let in past `max_body_buffer_mb = 2`
    (what was sent was all they held; RSS 206 → 609 MB). Now a body holds what it decodes to:
    while one of 1.5 MB decoded is held (its stream held open by the provider), six more wait
    for room, then get the 503 that names the limit, and never reach the provider; once the
    first is done, the next is served."""
    base = brim(
        server={"max_body_buffer_mb": 2, "body_timeout_s": 1.0, "max_decompression_ratio": 5_000}
    )

    def packed(model: str, stream: bool = False) -> bytes:
        body = {"model": model, "messages": HELLO, "stream": stream, "user": "x" * 1_500_000}
        return gzip.compress(orjson.dumps(body), compresslevel=9)

    async def scenario() -> tuple[httpx.Response, list[httpx.Response], int]:
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        async with httpx.AsyncClient(base_url=base, timeout=20, headers=headers) as client:
            held = asyncio.ensure_future(
                client.post("/v1/chat/completions", content=packed("gated-stream", True))
            )
            await provider_holds(provider, 1)
            small = packed("fake-model")
            assert len(small) < 10_000
            waited = await asyncio.gather(
                *(client.post("/v1/chat/completions", content=small) for _ in range(6))
            )
            provider.gate.set()
            first = await held
            after = await client.post("/v1/chat/completions", content=small)
            return first, list(waited), after.status_code

    first, waited, after = asyncio.run(scenario())
    assert first.status_code == 200 and "[DONE]" in first.text
    for reply in waited:
        assert reply.status_code == 503, reply.text
        assert "max_body_buffer_mb" in reply.json()["error"]["message"]
    assert metric(base, "brim_requests_shed_total", reason="max_body_buffer_mb") == 6
    assert [orjson.loads(seen.body)["model"] for seen in provider.requests] == [
        "gated-stream",
        "fake-model",
    ]
    assert after == 200


@pytest.mark.parametrize("wire", list(PATHS))
@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip"])
def test_a_coding_brim_does_not_decode_gets_a_415(
    base: str, provider: FakeProvider, wire: str, coding: str
) -> None:
    reply = post(base, wire, b"\x1b\x00\x00 not really", coding)
    assert reply.status_code == 415
    assert "gzip or deflate" in shaped(wire, reply)
    assert provider.requests == []


@pytest.mark.parametrize("wire", list(PATHS))
@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "fake-model"}',
        gzip.compress(b'{"model": "x"}')[:-6],
        gzip.compress(b"{}") + b"!",
    ],
    ids=["not gzip", "cut short", "trailing bytes"],
)
def test_data_that_does_not_decode_gets_a_400(
    base: str, provider: FakeProvider, wire: str, content: bytes
) -> None:
    reply = post(base, wire, content, "gzip")
    assert reply.status_code == 400
    assert "not valid gzip data" in shaped(wire, reply)
    assert provider.requests == []
