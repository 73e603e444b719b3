"""The content archive as its users reach it: by the short key a placeholder shows, over
`GET /admin/archive/{key}` and `brim archive get`."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from brim.adapters.exchange import ANONYMOUS
from brim.middleware.services.archive import ContentArchive
from brim.policies.clear import placeholder
from brim.policies.conversation import archive_key
from tests.builders import tool_session
from tests.conftest import BrimFactory
from tests.fakes import FakeProvider

ADMIN = "admin-key-archive-0123"
BRIM = str(Path(sys.executable).with_name("brim"))
SHOWN = re.compile(
    r"\[brim cleared this \w+ result \(\d+ tokens\); the whole is (sha256:[0-9a-f]+)\]"
)


def tool_output(n: int) -> str:
    return "\n".join(f"output {n} line {i}: value value value" for i in range(80))


def big_session() -> list[dict[str, Any]]:
    return tool_session([tool_output(n) for n in range(8)])


def two_originals_sharing_8_digits() -> tuple[str, str]:
    """Two texts whose sha256 keys start with the same 8 hex digits (a birthday search)."""
    seen: dict[str, str] = {}
    for n in itertools.count():
        text = f"original {n}"
        prefix = archive_key(text)[:8]
        if prefix in seen:
            return seen[prefix], text
        seen[prefix] = text
    raise AssertionError("unreachable")


def brim_archive_get(key: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BRIM, "archive", "get", key], capture_output=True, text=True, cwd=cwd, timeout=60
    )


@pytest.fixture
def archived(brim: BrimFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_ARCHIVE_ADMIN_KEYS", ADMIN)
    return brim(
        server={"admin_keys_env": "TEST_ARCHIVE_ADMIN_KEYS"},
        models={"small": {"context_window": 4_000, "max_output": 500}},
        guard={"policies": ["clear_tool_results"]},  # what it clears stays in the request
        archive={"enabled": True, "dir": str(tmp_path / "archive")},
    )


def test_the_key_a_placeholder_shows_fetches_the_original_over_http(
    archived: str, provider: FakeProvider
) -> None:
    reply = httpx.post(
        f"{archived}/v1/chat/completions", json={"model": "small", "messages": big_session()}
    )
    assert reply.status_code == 200
    sent = json.loads(provider.last.body)["messages"]
    cleared = {m["tool_call_id"]: SHOWN.search(m["content"]) for m in sent if m["role"] == "tool"}
    shown = {call: found.group(1) for call, found in cleared.items() if found}
    assert shown, "nothing was cleared"
    admin = {"x-brim-admin-key": ADMIN}
    for call_id, key in shown.items():
        assert len(key) == len("sha256:") + 16  # what the placeholder shows: not the whole key
        original = tool_output(int(call_id[1:]))
        fetched = httpx.get(f"{archived}/admin/archive/{key}", headers=admin)
        assert fetched.status_code == 200, fetched.text
        assert fetched.text == original
        bare = httpx.get(f"{archived}/admin/archive/{key.removeprefix('sha256:')}", headers=admin)
        assert bare.status_code == 200 and bare.text == original
        full = httpx.get(f"{archived}/admin/archive/{archive_key(original)}", headers=admin)
        assert full.status_code == 200 and full.text == original

    too_short = httpx.get(f"{archived}/admin/archive/sha256:0123456", headers=admin)
    assert too_short.status_code == 400
    assert "8 to 64 hex digits" in too_short.json()["error"]["message"]
    absent = next(d * 8 for d in "0123456789abcdef" if not any(d * 8 in k for k in shown.values()))
    assert httpx.get(f"{archived}/admin/archive/{absent}", headers=admin).status_code == 404
    assert httpx.get(f"{archived}/admin/archive/{next(iter(shown.values()))}").status_code == 401


def test_an_ambiguous_prefix_is_refused_over_http(archived: str, tmp_path: Path) -> None:
    first, second = two_originals_sharing_8_digits()
    store = ContentArchive(tmp_path / "archive", ttl_hours=1)
    store.put("cred-one", archive_key(first), first)  # two clients': the operator reads both
    store.put("cred-two", archive_key(second), second)
    admin = {"x-brim-admin-key": ADMIN}
    ambiguous = httpx.get(f"{archived}/admin/archive/{archive_key(first)[:8]}", headers=admin)
    assert ambiguous.status_code == 400
    assert "ambiguous" in ambiguous.json()["error"]["message"]
    for text in (first, second):
        found = httpx.get(f"{archived}/admin/archive/{archive_key(text)[:16]}", headers=admin)
        assert found.status_code == 200 and found.text == text


def test_brim_archive_get_takes_the_key_a_placeholder_shows(tmp_path: Path) -> None:
    first, second = two_originals_sharing_8_digits()
    store = ContentArchive(tmp_path / "arch", ttl_hours=1)
    for text in (first, second, "the original"):
        store.put(ANONYMOUS, archive_key(text), text)
    (tmp_path / "proxy.toml").write_text(
        f'[archive]\nenabled = true\ndir = "{tmp_path / "arch"}"\n'
    )

    match = SHOWN.search(placeholder("bash", 120, archive_key("the original")))
    assert match is not None
    shown = match.group(1)
    found = brim_archive_get(shown, tmp_path)
    assert (found.returncode, found.stdout) == (0, "the original"), found.stderr
    bare = brim_archive_get(shown.removeprefix("sha256:"), tmp_path)
    assert (bare.returncode, bare.stdout) == (0, "the original"), bare.stderr

    ambiguous = brim_archive_get(archive_key(first)[:8], tmp_path)
    assert ambiguous.returncode == 2 and ambiguous.stdout == ""
    assert "ambiguous" in ambiguous.stderr and "Traceback" not in ambiguous.stderr
    longer = brim_archive_get(archive_key(second)[:16], tmp_path)
    assert (longer.returncode, longer.stdout) == (0, second), longer.stderr

    short = brim_archive_get("sha256:0123456", tmp_path)
    assert short.returncode == 2 and "8 to 64 hex digits" in short.stderr
    unknown_prefix = next(d * 8 for d in "0123456789abcdef" if not store.resolve(d * 8))
    missing = brim_archive_get(unknown_prefix, tmp_path)
    assert missing.returncode == 1 and "nothing is archived" in missing.stderr.lower()
