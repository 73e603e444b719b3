"""Owners as the edge names them: one per credential (or brim key), a keyed hash that never shows
the credential, `anonymous` for a request with none, and the secret from `owner_secret_env`."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from brim.adapters.exchange import ANONYMOUS, OWNER_PATTERN
from brim.proxy.config import BrimConfig, describe_config
from brim.proxy.owners import Owners

OWNERS = Owners(b"a secret of this test")


def owner_of(path: str = "/v1/chat/completions", **headers: str) -> str:
    request = make_mocked_request("POST", path, headers=CIMultiDict(headers))
    return OWNERS.of_credentials(request)


def test_each_credential_is_an_owner_of_its_own_and_none_is_anonymous() -> None:
    a = owner_of(Authorization="Bearer sk-client-a")
    assert a == owner_of(Authorization="Bearer sk-client-a")  # the same client, every request
    others = {
        owner_of(Authorization="Bearer sk-client-b"),
        owner_of(**{"x-api-key": "sk-client-a"}),  # the same text, another header
        owner_of(**{"x-goog-api-key": "sk-client-a"}),
        owner_of(**{"api-key": "sk-client-a"}),
        owner_of("/v1beta/models/g:generateContent?key=sk-client-a"),
        owner_of(Authorization="Bearer sk-client-a", **{"x-api-key": "sk-other"}),  # all count
    }
    assert len(others) == 6 and a not in others
    assert owner_of() == owner_of(**{"User-Agent": "cli/1.0"}) == ANONYMOUS
    assert owner_of(Authorization="") == ANONYMOUS  # an empty header is no credential


def test_an_owner_is_a_short_name_that_never_shows_the_credential() -> None:
    credential = "sk-proj-0123456789abcdef0123456789abcdef"
    owner = owner_of(Authorization=f"Bearer {credential}")
    brim_key = OWNERS.of_brim_key(credential)
    for name in (owner, brim_key, ANONYMOUS):
        assert OWNER_PATTERN.fullmatch(name), name
    assert owner.startswith("cred-") and brim_key.startswith("key-")
    for name in (owner, brim_key):
        hexdigits = name.split("-", 1)[1]
        assert len(hexdigits) == 32 and credential not in name
        assert hexdigits not in credential  # not a slice of it either


def test_the_hash_is_keyed_with_the_owner_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_OWNER_SECRET", "Zq8-operators-own-4417")
    configured = BrimConfig.model_validate({"server": {"owner_secret_env": "TEST_OWNER_SECRET"}})
    one, again = Owners.for_server(configured.server), Owners.for_server(configured.server)
    assert one.of_brim_key("k") == again.of_brim_key("k")  # every instance with the secret agrees
    assert one.of_brim_key("k") != OWNERS.of_brim_key("k")  # another secret: another owner
    per_run = Owners.for_server(BrimConfig().server)  # no secret set: one made for this run
    assert per_run.of_brim_key("k") == Owners.for_server(BrimConfig().server).of_brim_key("k")
    assert per_run.of_brim_key("k") != one.of_brim_key("k")
    shown = describe_config(configured)
    assert shown["server"]["owner_secret"] == "(set)"
    assert not any(part in str(shown) for part in ("Zq8", "4417", "operators-own"))
    assert describe_config(BrimConfig())["server"]["owner_secret"] == "(one per run)"
