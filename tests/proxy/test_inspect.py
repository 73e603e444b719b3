"""`brim inspect` and `brim models`, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from brim.middleware.services.shared import RATIOS_KEY
from tests.builders import tool_turn
from tests.fakes import counted
from tests.policies.test_tokens import TOOLS, WEATHER

BRIM = str(Path(sys.executable).with_name("brim"))


def brim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BRIM, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "request.json"
    path.write_bytes(
        orjson.dumps({"model": "gpt-4o", "max_tokens": 1_000, "messages": WEATHER, "tools": TOOLS})
    )
    return path


def test_inspect_prints_limits_budget_and_counts(saved: Path) -> None:
    result = brim("inspect", str(saved), cwd=saved.parent)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "window 128,000 [litellm]" in out
    assert "max output 16,384 [litellm]" in out
    assert "− reserved output            1,000" in out
    assert "− safety margin   5%         6,400" in out
    assert "= effective                120,600" in out
    assert "tool definitions           " in out
    assert "total                     101" in out  # the API's own figure for this request
    assert "fits: yes — 101 of 120,600" in out


def test_inspect_json_with_model_override_and_a_config(saved: Path) -> None:
    (saved.parent / "proxy.toml").write_text(
        '[models."tiny"]\ncontext_window = 150\nmax_output = 40\n'
        "[guard]\nsafety_margin = 0.0\n"
        '[clients.bot]\nuser_agent = "bot/*"\ncli_overhead = 20\n'
    )
    result = brim(
        "inspect",
        str(saved),
        "--model",
        "tiny",
        "--user-agent",
        "bot/1",
        "--json",
        cwd=saved.parent,
    )
    assert result.returncode == 1  # 101 tokens do not fit in 150 − 40 − 20 = 90
    report = json.loads(result.stdout)
    assert report["limits"]["sources"]["context_window"] == "config"
    assert report["client"] == "bot"
    assert report["budget"]["effective"] == 90
    assert report["tokens"]["total"] == 101
    assert [m["role"] for m in report["tokens"]["messages"]] == ["system", "user"]
    assert report["tokens"]["upper_bound"] >= 101
    assert report["fits"] is False
    text = brim("inspect", str(saved), "--model", "tiny", "--user-agent", "bot/1", cwd=saved.parent)
    assert "fits: NO — 101 exceeds 90 by 11" in text.stdout


def test_inspect_refuses_what_is_not_a_request(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    result = brim("inspect", str(tmp_path / "bad.json"), cwd=tmp_path)
    assert result.returncode == 2 and "not valid JSON" in result.stderr
    (tmp_path / "nomodel.json").write_text('{"messages": []}')
    result = brim("inspect", str(tmp_path / "nomodel.json"), cwd=tmp_path)
    assert result.returncode == 2 and "--model" in result.stderr
    assert "Traceback" not in result.stderr


def test_models_lists_sources(tmp_path: Path) -> None:
    (tmp_path / "proxy.toml").write_text('[models."team-llm"]\ncontext_window = 32768\n')
    result = brim("models", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    team = next(line for line in lines if line.startswith("team-llm"))
    assert "32,768" in team and "window: config, max out: default" in team
    sonnet = next(line for line in lines if line.startswith("claude:sonnet"))
    assert "200,000" in sonnet and "64,000" in sonnet and "CLI overhead 60,000" in sonnet
    pattern = json.loads(brim("models", "gpt-4.1*", "--json", cwd=tmp_path).stdout)
    assert {row["model"] for row in pattern} >= {"gpt-4.1", "gpt-4.1-mini"}
    assert all(row["sources"]["context_window"] == "litellm" for row in pattern)


def test_inspect_shows_what_the_guard_would_do(tmp_path: Path) -> None:
    (tmp_path / "proxy.toml").write_text(
        '[models."small"]\ncontext_window = 2000\nmax_output = 100\n'
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
    ]
    stages = ["fetch", "parse", "check", "merge", "index", "store", "sync", "audit", "render"]
    for n in range(12):  # enough that placeholders alone do not fit: clear, then evict
        output = "\n".join(
            f"step {n} line {i}: {stages[(i + n) % 9]} {stages[i % 7]}" for i in range(60)
        )
        messages += tool_turn(f"c{n}", output, name="bash")
    messages.append({"role": "user", "content": "why?"})
    path = tmp_path / "big.json"
    path.write_bytes(orjson.dumps({"model": "small", "messages": messages}))
    result = brim("inspect", str(path), "--json", cwd=tmp_path)
    assert result.returncode == 1  # as sent, it does not fit
    guard = json.loads(result.stdout)["guard"]
    assert guard["action"] == "compress"
    assert guard["tokens_in"] > 2000 >= guard["tokens_out"]
    assert guard["tokens_out"] <= guard["target"]
    assert "clear:" in guard["actions"] and "evict:" in guard["actions"]
    assert {r["policy"] for r in guard["records"]} >= {"clear_tool_results", "evict"}
    text = brim("inspect", str(path), cwd=tmp_path).stdout
    assert "guard     compress" in text and "clear_tool_results   cleared" in text
    assert all(f"{record['policy']:<20} {record['action']}" in text for record in guard["records"])


def test_inspect_reads_anthropic_messages_requests(tmp_path: Path) -> None:
    (tmp_path / "proxy.toml").write_text('[models."claude-small"]\ncontext_window = 3000\n')
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    for n in range(6):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"t{n}",
                        "content": "output line\n" * 150,
                    }
                ],
            }
        )
    path = tmp_path / "claude.json"
    path.write_bytes(
        orjson.dumps(
            {
                "model": "claude-small",
                "max_tokens": 1000,
                "system": "You are Claude Code.",
                "messages": messages,
            }
        )
    )
    report = json.loads(brim("inspect", str(path), "--json", cwd=tmp_path).stdout)
    assert report["api"] == "anthropic.messages"
    assert report["limits"]["tokenizer"] == "claude"
    assert report["budget"]["reserved_output"] == 0  # Anthropic counts max_tokens apart
    assert report["guard"]["action"] == "compress"
    assert report["guard"]["tokens_out"] <= report["budget"]["effective"]


def test_models_and_inspect_show_the_ratios_the_brims_on_redis_learned(
    tmp_path: Path, redis_url: str
) -> None:
    """The shared ratio of what the running brims' clients taught through `[cache] url` (the
    median of the settled clients') is what `brim models` shows for the model, with how many
    clients taught it but not who, and what `brim inspect` counts with; one Redis holds for an
    upstream this config lacks, or out of its bounds, is not."""
    now = time.time()
    entries = {
        orjson.dumps(["cred-a", "gem", "gemini-2.5-flash"]): f"1.48 5 {now!r}",
        orjson.dumps(["cred-b", "gem", "gemini-2.5-flash"]): f"1.4 6 {now!r}",
        orjson.dumps(["cred-hostile", "gem", "gemini-2.5-flash"]): f"2.9 9 {now!r}",
        orjson.dumps(["cred-a", "elsewhere", "gemini-2.5-pro"]): f"1.6 9 {now!r}",
        orjson.dumps(["cred-a", "gem", "gemini-2.0-flash"]): f"7.0 9 {now!r}",
        orjson.dumps(["cred-c", "gem", "gemini-2.0-flash-lite"]): f"1.3 2 {now!r}",
    }
    redis.Redis.from_url(redis_url).hset(RATIOS_KEY, mapping=entries)
    (tmp_path / "proxy.toml").write_text(
        f'[cache]\nurl = "{redis_url}"\n'
        '[upstreams.gem]\napi = "gemini"\nbase_url = "http://127.0.0.1:9"\n'
    )
    result = brim("models", "gemini-2.", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "cred-" not in result.stdout
    lines = result.stdout.splitlines()
    flash = next(line for line in lines if line.startswith("gemini-2.5-flash "))
    assert "×1.48" in flash
    assert "ratio: ×1.48 the median of 3 clients (20 replies) of gem" in flash
    lite = next(line for line in lines if line.startswith("gemini-2.0-flash-lite "))
    assert "×1 " in lite and "ratio: being learned from 1 client (2 replies) of gem" in lite
    for model in ("gemini-2.5-pro ", "gemini-2.0-flash "):
        line = next(line for line in lines if line.startswith(model))
        assert "×1 " in line and "ratio: prior" in line
    rows = json.loads(brim("models", "gemini-2.5-flash", "--json", cwd=tmp_path).stdout)
    assert rows[0]["token_ratio"] == {
        "prior": 1.0,
        "learned": [{"upstream": "gem", "ratio": 1.48, "clients": 3, "settled": 3, "replies": 20}],
    }
    request = tmp_path / "gemini.json"
    contents = [{"role": "user", "parts": [{"text": "word " * 2_000}]}]
    request.write_bytes(orjson.dumps({"contents": contents}))
    report = json.loads(
        brim("inspect", str(request), "--model", "gemini-2.5-flash", "--json", cwd=tmp_path).stdout
    )
    assert report["tokens"]["ratio"] == {
        "value": 1.48,
        "learned_from": {"upstream": "gem", "clients": 3, "settled": 3, "replies": 20},
    }
    shown = brim("inspect", str(request), "--model", "gemini-2.5-flash", cwd=tmp_path).stdout
    assert "× 1.48, the median of 3 clients (20 replies) of upstream gem" in shown
    raw = counted("gemini.generate", {"contents": contents})
    assert abs(report["tokens"]["total"] - 1.48 * raw) <= 3
