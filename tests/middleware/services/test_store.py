"""The restore store: keys as the model passes them, the memory bound and TTL, Redis shared by
two instances, Redis going away and coming back, the `[restore]` configuration and the app's
one store."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from brim.middleware.services.archive import ContentArchive
from brim.middleware.services.shared import RedisLink
from brim.middleware.services.store import MemoryStore, RedisStore, normalize_key
from brim.policies.conversation import archive_key
from brim.proxy.app import build_link, build_store, create_app
from brim.proxy.config import BrimConfig, ConfigError, load_config
from tests.conftest import RedisServer
from tests.fakes import free_port

OWNER = "cred-" + "0123456789abcdef" * 2  # whose the stored texts are
OTHER = "key-" + "fedcba9876543210" * 2  # another client's


def item(text: str) -> tuple[str, str]:
    return archive_key(text), text


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# --- keys -------------------------------------------------------------------------------------


def test_a_text_is_found_by_its_full_key_its_prefix_and_sha256_forms() -> None:
    key, text = item("the original tool result, all 40 lines of it")
    store = MemoryStore(1_000_000, 3600)
    run(store.put_many(OWNER, [(key, text)]))
    for asked in (
        key,
        key[:16],
        f"sha256:{key[:16]}",
        f"  SHA256:{key[:16].upper()} ",
        f"sha256:{key}",
        key[:40],
    ):
        assert run(store.get(OWNER, asked)) == text, asked


@pytest.mark.parametrize(
    "asked",
    [
        "",
        "sha256:",
        "abc",
        "0123456789abcde",  # 15 digits: shorter than what placeholders show
        "g" * 16,
        "sha256:zzzzzzzzzzzzzzzz",
        "1" * 65,
        "sha512:" + "a" * 16,
        "a" * 10_000,
        None,
        12345678901234567,
        ["a" * 16],
    ],
)
def test_malformed_keys_are_none_never_an_error(asked: Any) -> None:
    key, text = item("stored")
    store = MemoryStore(1_000_000, 3600)
    run(store.put_many(OWNER, [(key, text)]))
    assert run(store.get(OWNER, asked)) is None
    assert normalize_key(asked) is None


def test_a_full_key_that_differs_after_the_prefix_is_not_a_match() -> None:
    key, text = item("stored under its own key")
    store = MemoryStore(1_000_000, 3600)
    run(store.put_many(OWNER, [(key, text)]))
    other = key[:16] + ("0" if key[16] != "0" else "1") + key[17:]
    assert run(store.get(OWNER, other)) is None
    assert run(store.get(OWNER, key[:17])) == text
    assert run(store.get(OWNER, other[:17])) is None


def test_a_text_is_found_only_by_its_owner() -> None:
    key, text = item("what client A's request left")
    store = MemoryStore(1_000_000, 3600)
    run(store.put_many(OWNER, [(key, text)]))
    assert run(store.get(OTHER, key)) is None and run(store.get(OTHER, key[:16])) is None
    run(store.put_many(OTHER, [(key, text)]))  # the same text from B's request: B's own copy
    assert run(store.get(OWNER, key)) == run(store.get(OTHER, key)) == text
    assert len(store) == 2
    for owner in ("", "Cred-Upper", "a:b", "../x", None):  # not an owner: nothing kept
        assert not store.put(owner, key, text)  # type: ignore[arg-type]
        assert run(store.get(owner, key)) is None  # type: ignore[arg-type]


def test_an_absent_key_is_none_and_malformed_puts_are_skipped() -> None:
    store = MemoryStore(1_000_000, 3600)
    run(
        store.put_many(
            OWNER, [("not-a-key", "x"), ("A" * 64, "upper case is not a key"), item("ok")]
        )
    )
    assert len(store) == 1
    assert run(store.get(OWNER, archive_key("missing"))) is None


def test_the_store_and_the_archive_read_a_key_the_same_way(tmp_path: Path) -> None:
    key, text = item("kept by both")
    store = MemoryStore(1_000_000, 3600)
    run(store.put_many(OWNER, [(key, text)]))
    archive = ContentArchive(tmp_path / "archive", ttl_hours=1)
    archive.put(OWNER, key, text)
    for asked in (key, key[:16], f"  SHA256:{key[:16].upper()} ", f"sha256: {key}"):
        assert run(store.get(OWNER, asked)) == text, asked
        assert archive.resolve(asked) == key, asked
    assert archive.resolve(key[:8]) == key  # the archive takes shorter prefixes; the store not
    assert run(store.get(OWNER, key[:8])) is None


# --- memory bound and TTL ---------------------------------------------------------------------


def test_the_byte_bound_evicts_the_oldest_first() -> None:
    store = MemoryStore(3_000, 3600)
    first, second, third = item("a" * 1_000), item("b" * 1_000), item("c" * 1_000)
    run(store.put_many(OWNER, [first, second, third]))
    assert store.size_bytes == 3_000
    fourth = item("d" * 1_000)
    run(store.put_many(OWNER, [fourth]))
    assert run(store.get(OWNER, first[0])) is None  # the oldest went
    assert [run(store.get(OWNER, k)) for k, _ in (second, third, fourth)] == [
        "b" * 1_000,
        "c" * 1_000,
        "d" * 1_000,
    ]
    assert store.size_bytes <= 3_000


def test_the_bound_counts_utf8_bytes_not_characters() -> None:
    store = MemoryStore(1_000, 3600)
    run(store.put_many(OWNER, [item("é" * 400)]))  # 800 bytes
    assert store.size_bytes == 800
    run(store.put_many(OWNER, [item("x" * 300)]))
    assert len(store) == 1 and run(store.get(OWNER, archive_key("é" * 400))) is None


def test_a_text_larger_than_the_whole_store_is_not_kept_and_evicts_nothing() -> None:
    store = MemoryStore(1_000, 3600)
    kept = item("small")
    run(store.put_many(OWNER, [kept, item("z" * 2_000)]))
    assert run(store.get(OWNER, kept[0])) == "small"
    assert run(store.get(OWNER, archive_key("z" * 2_000))) is None


def test_texts_expire_after_the_ttl() -> None:
    clock = Clock()
    store = MemoryStore(1_000_000, 60, timer=clock)
    old, young = item("old"), item("young")
    run(store.put_many(OWNER, [old]))
    clock.now += 30
    run(store.put_many(OWNER, [young]))
    clock.now += 31  # old is 61 s old, young 31 s
    assert run(store.get(OWNER, old[0])) is None
    assert run(store.get(OWNER, young[0])) == "young"
    clock.now += 30
    assert run(store.get(OWNER, young[0])) is None
    assert len(store) == 0 and store.size_bytes == 0


def test_storing_again_renews_the_ttl() -> None:
    clock = Clock()
    store = MemoryStore(1_000_000, 60, timer=clock)
    kept = item("seen every turn")
    run(store.put_many(OWNER, [kept]))
    clock.now += 50
    run(store.put_many(OWNER, [kept]))
    clock.now += 50
    assert run(store.get(OWNER, kept[0])) == "seen every turn"


# --- Redis ------------------------------------------------------------------------------------


def redis_store(url: str, **kwargs: Any) -> RedisStore:
    """A store on a Redis link of its own (close it with `close`)."""
    return RedisStore(RedisLink(url, **kwargs), 3600, MemoryStore(1_000_000, 3600))


async def close(*stores: RedisStore) -> None:
    for store in stores:
        await store.aclose()
        await store.link.aclose()


def test_two_instances_on_one_redis_share_what_either_stored(redis_server: RedisServer) -> None:
    async def scenario() -> tuple[Any, ...]:
        first, second = redis_store(redis_server.url), redis_store(redis_server.url)
        key, text = item("an evicted turn, with its ünïcode and \ud800 lone surrogate")
        await first.put_many(OWNER, [(key, text)])
        by_prefix = await second.get(OWNER, f"sha256:{key[:16]}")
        by_key = await second.get(OWNER, key)
        copied = second.local.lookup(OWNER, key)  # kept locally after the first fetch
        absent = await second.get(OWNER, archive_key("never stored"))
        wrong = await second.get(OWNER, key[:16] + ("0" if key[16] != "0" else "1") + key[17:])
        await close(first, second)
        return text, by_prefix, by_key, copied, absent, wrong

    text, by_prefix, by_key, copied, absent, wrong = run(scenario())
    assert by_prefix == text and by_key == text and copied == text
    assert absent is None and wrong is None


def test_redis_serves_a_text_only_to_its_owner_and_only_if_it_hashes_to_its_key(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    import redis.asyncio as redis

    rejected: list[str] = []

    async def scenario() -> tuple[Any, ...]:
        first = redis_store(redis_server.url)
        second = RedisStore(
            RedisLink(redis_server.url),
            3600,
            MemoryStore(1_000_000, 3600),
            on_rejected=rejected.append,
        )
        key, text = item("kept in Redis for its owner")
        await first.put_many(OWNER, [(key, text)])
        others = await second.get(OTHER, key)
        client: Any = redis.from_url(redis_server.url)
        name = f"brim:store:{OWNER}:{key[:16]}"
        await client.set(name, key.encode() + b"not the text the key names")
        forged = await second.get(OWNER, key)
        await client.set(name, b"\x00" * 10)
        short = await second.get(OWNER, key)
        await client.delete(name)
        await client.rpush(name, b"a list, not a record")
        listed = await second.get(OWNER, key)
        await client.aclose()
        await close(first, second)
        return others, forged, short, listed

    with caplog.at_level(logging.WARNING, logger="brim.store"):
        others, forged, short, listed = run(scenario())
    assert (others, forged, short, listed) == (None, None, None, None)
    assert rejected == ["mismatch", "malformed", "malformed"]
    warned = [r.getMessage() for r in caplog.records if r.name == "brim.store"]
    assert len(warned) == 1 and "mismatch" in warned[0]  # logged once, without content
    assert "not the text" not in caplog.text


def test_redis_keys_carry_the_prefix_and_a_ttl(redis_server: RedisServer) -> None:
    import redis.asyncio as redis

    async def scenario() -> tuple[Any, Any]:
        store = RedisStore(RedisLink(redis_server.url), 120, MemoryStore(1_000_000, 120))
        key, text = item("with an expiry")
        await store.put_many(OWNER, [(key, text)])
        client: Any = redis.from_url(redis_server.url)
        ttl = await client.ttl(f"brim:store:{OWNER}:{key[:16]}")  # the owner's, by the key
        keys = await client.keys("brim:store:*")
        await client.aclose()
        await close(store)
        return ttl, keys

    ttl, keys = run(scenario())
    assert 0 < ttl <= 120
    assert len(keys) == 1


def test_redis_going_down_and_coming_back(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        first = redis_store(redis_server.url, timeout_s=1, retry_s=0)
        second = redis_store(redis_server.url, timeout_s=1, retry_s=0)
        before = item("stored while Redis was up")
        await first.put_many(OWNER, [before])
        seen["shared before"] = await second.get(OWNER, before[0])

        redis_server.stop()
        during = item("stored while Redis was down")
        await first.put_many(OWNER, [during])
        await first.put_many(OWNER, [item("another one while down")])
        seen["local during"] = await first.get(OWNER, during[0])
        seen["local before"] = await first.get(OWNER, before[0])
        seen["missing during"] = await second.get(OWNER, archive_key("nobody stored this"))
        seen["down"] = first.redis_down and second.redis_down

        redis_server.start()
        after = item("stored after Redis came back")
        await first.put_many(OWNER, [after])
        seen["up again"] = not first.redis_down
        seen["shared after"] = await second.get(OWNER, after[0])
        await first.link.settle()  # what was stored meanwhile is written in the background
        seen["replayed"] = await second.get(OWNER, during[0])
        await close(first, second)
        return seen

    with caplog.at_level(logging.INFO, logger="brim.shared"):
        seen = run(scenario())
    assert seen["shared before"] == "stored while Redis was up"
    assert seen["local during"] == "stored while Redis was down"
    assert seen["local before"] == "stored while Redis was up"
    assert seen["missing during"] is None
    assert seen["down"] is True
    assert seen["up again"] is True
    assert seen["shared after"] == "stored after Redis came back"
    assert seen["replayed"] == "stored while Redis was down"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # One warning per instance for the whole outage, however many calls failed.
    assert len(warnings) == 2, [r.getMessage() for r in warnings]
    assert all("unreachable" in r.getMessage() for r in warnings)
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_while_redis_is_down_it_is_tried_again_only_after_retry_s() -> None:
    async def scenario() -> tuple[Any, ...]:
        clock = Clock()
        link = RedisLink(f"redis://127.0.0.1:{free_port()}/0", timeout_s=1, retry_s=30, timer=clock)
        store = RedisStore(link, 3600, MemoryStore(1_000_000, 3600, timer=clock))
        calls = 0
        client_get = link.client.get

        async def counting_get(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return await client_get(*args)

        link.client.get = counting_get
        key = archive_key("nowhere")
        first = await store.get(OWNER, key)
        second = await store.get(OWNER, key)  # within retry_s: Redis is not asked
        clock.now += 31
        third = await store.get(OWNER, key)
        await close(store)
        return first, second, third, calls, store.redis_down

    first, second, third, calls, down = run(scenario())
    assert (first, second, third) == (None, None, None)
    assert calls == 2
    assert down is True


# --- configuration and the app's one store ----------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_restore_defaults() -> None:
    config, warnings = load_config(None)
    assert warnings == []
    restore = config.restore
    assert (restore.enabled, restore.max_rounds, restore.store_mb, restore.ttl_hours) == (
        True,
        3,
        64,
        24,
    )


def test_restore_values_from_the_file(tmp_path: Path) -> None:
    config, warnings = load_config(
        write(tmp_path, "[restore]\nenabled = true\nmax_rounds = 10\nstore_mb = 1.5\n")
    )
    assert warnings == []
    assert (config.restore.enabled, config.restore.max_rounds, config.restore.store_mb) == (
        True,
        10,
        1.5,
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[restore]\nmax_rounds = 0\n", "restore.max_rounds"),
        ("[restore]\nmax_rounds = 11\n", "restore.max_rounds"),
        ("[restore]\nstore_mb = 0\n", "restore.store_mb"),
        ('[restore]\nttl_hours = "long"\n', "restore.ttl_hours"),
    ],
)
def test_bad_restore_values_refuse_and_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert named in str(caught.value)


def test_the_store_follows_restore_and_cache_url() -> None:
    assert build_store(BrimConfig.model_validate({"restore": {"enabled": False}})) is None
    default = build_store(BrimConfig())  # on by default
    assert isinstance(default, MemoryStore)
    assert default.max_bytes == 64 * 1024 * 1024
    config = BrimConfig.model_validate({"cache": {"url": "redis://127.0.0.1:1/0"}})
    shared = build_store(config, build_link(config))
    assert isinstance(shared, RedisStore)
    assert shared.local.max_bytes == 64 * 1024 * 1024
    run(close(shared))


def test_the_app_has_one_store_and_closes_it_on_cleanup() -> None:
    from aiohttp import web

    from brim.proxy.keys import GENERATIONS

    async def scenario() -> tuple[Any, ...]:
        app = create_app(BrimConfig.model_validate({"restore": {"enabled": True, "store_mb": 1}}))
        store = app[GENERATIONS].current.services.store
        assert isinstance(store, MemoryStore)
        runner = web.AppRunner(app)
        await runner.setup()
        kept = item("removed by the guard")
        await store.put_many(OWNER, [kept])
        during = await store.get(OWNER, kept[0])
        await runner.cleanup()
        return store.max_bytes, during, len(store)

    max_bytes, during, after = run(scenario())
    assert max_bytes == 1024 * 1024
    assert during == "removed by the guard"
    assert after == 0  # closed with the app
