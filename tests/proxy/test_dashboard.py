"""The /ui dashboard, the figures behind it (/admin/status: series, tokens removed, learned
limits and token ratios, the loop guard) and `brim status`, which prints them."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from brim.middleware.services.shared import LocalLoops
from brim.middleware.services.status_board import (
    OTHER_MODELS,
    SERIES_FIELDS,
    Series,
    StatusBoard,
    client_product,
    merge_series,
)
from brim.policies.ratios import MIN_REPLIES
from brim.proxy.commands import main
from brim.proxy.config import load_config
from brim.proxy.routes.dashboard import FILES
from tests.builders import tool_session
from tests.conftest import BrimFactory, fake_upstream
from tests.fakes import FakeProvider, wait_for

ADMIN = "admin-key-for-the-dashboard-0123"
LINES = ["fetch", "parse", "check", "merge", "index", "store", "sync", "audit", "render", "ship"]
# Tool outputs that do not fit "small" together: the guard prunes and clears them.
OUTPUTS = [
    "\n".join(f"line {i}: {LINES[(i + n) % 10]} {LINES[i * 3 % 10]} {i * n}" for i in range(80))
    for n in range(16)
]
FAILING = {"model": "error-400", "messages": [{"role": "user", "content": "compact this"}]}
AT = {name: i for i, name in enumerate(SERIES_FIELDS)}


class Clock:
    def __init__(self, now: float = 1_000_020.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- the series ----------------------------------------------------------------------------------


def test_a_series_keeps_one_point_per_bucket_and_counts_what_happened() -> None:
    clock = Clock()
    series = Series(bucket_s=60, points=5, timer=clock)
    series.add("m", "cli", usage=0.5, demand=1.5, overflows=["prevented"])
    series.add("m", "cli", usage=0.7, demand=0.7)
    series.add("m", "other-cli", usage=0.2, demand=0.2, overflows=["refused"])
    clock.now += 60
    series.add("m", "cli", usage=0.1, demand=0.1, overflows=["survived", "blocked"])
    by_key = {(s["model"], s["client"]): s["points"] for s in series.snapshot()["series"]}
    first, second = by_key[("m", "cli")]
    assert first[AT["t"]] == 1_000_020 // 60 * 60 and second[AT["t"]] == first[AT["t"]] + 60
    assert first[AT["requests"]] == 2 and first[AT["usage_sum"]] == pytest.approx(1.2)
    assert (first[AT["usage_max"]], first[AT["demand_max"]]) == (0.7, 1.5)
    assert [first[AT[k]] for k in ("prevented", "survived", "refused", "blocked")] == [1, 0, 0, 0]
    assert [second[AT[k]] for k in ("prevented", "survived", "refused", "blocked")] == [0, 1, 0, 1]
    assert by_key[("m", "other-cli")][0][AT["refused"]] == 1


def test_a_series_is_bounded_in_points_and_in_series() -> None:
    clock = Clock()
    series = Series(bucket_s=10, points=4, most=3, timer=clock)
    for _ in range(50):
        series.add("m", "c", usage=0.1, demand=0.1)
        clock.now += 10
    for n in range(10):
        series.add(f"model-{n}", "c", usage=None, demand=None)
    snapshot = series.snapshot()["series"]
    assert len(series) == len(snapshot) == 3
    (kept,) = [s["points"] for s in snapshot if s["model"] == "m"]
    assert len(kept) == 4 and kept[-1][AT["t"]] == (clock.now - 10) // 10 * 10  # the newest
    (folded,) = [s["points"] for s in snapshot if s["model"] == OTHER_MODELS]
    assert folded[0][AT["requests"]] == 9  # the pairs beyond the cap, under ("other", "other")


def test_instances_series_merge_point_by_point() -> None:
    a, b = (Series(bucket_s=60, timer=Clock()) for _ in range(2))
    a.add("m", "c", usage=0.5, demand=0.9, overflows=["prevented"])
    b.add("m", "c", usage=0.3, demand=1.4, overflows=["prevented"])
    b.add("n", "c", usage=0.2, demand=0.2)
    other_size = Series(bucket_s=10, timer=Clock())
    other_size.add("m", "c", usage=0.9, demand=0.9)
    merged = merge_series([a.snapshot(), b.snapshot(), other_size.snapshot()], points=10)
    by_key = {(s["model"], s["client"]): s["points"] for s in merged["series"]}
    ((point,),) = [by_key[("m", "c")]]
    assert point[AT["requests"]] == 2 and point[AT["prevented"]] == 2
    assert point[AT["usage_sum"]] == pytest.approx(0.8)
    assert (point[AT["usage_max"]], point[AT["demand_max"]]) == (0.5, 1.4)
    assert by_key[("n", "c")][0][AT["requests"]] == 1


def test_the_board_counts_overflows_removed_tokens_and_clients() -> None:
    board = StatusBoard()
    board.record(
        "m",
        "compressed",
        5000,
        1800,
        client="claude",
        window=4000,
        overflows=["prevented"],
        removed={"prune_tool_results": 700, "clear_tool_results": 2500},
    )
    agent = client_product("python-httpx/0.28")
    board.record("m", "blocked", 0, 0, client=agent, overflows=["blocked"])
    snapshot = board.snapshot()
    assert snapshot["totals"]["prevented"] == 1 and snapshot["totals"]["blocked"] == 1
    assert snapshot["models"]["m"]["prevented"] == 1
    assert snapshot["tokens_removed"] == {"prune_tool_results": 700, "clear_tool_results": 2500}
    clients = {s["client"]: s["points"][0] for s in snapshot["series"]["series"]}
    assert (
        clients["claude"][AT["usage_max"]] == 0.45 and clients["claude"][AT["demand_max"]] == 1.25
    )
    assert clients["python-httpx"][AT["blocked"]] == 1


@pytest.mark.parametrize(
    ("agent", "product"),
    [
        ("claude-cli/2.0.1 (external, cli)", "claude-cli"),
        ("OpenAI/Python 1.99.0", "openai"),
        ("", "-"),
        ("<script>alert(1)</script>", "scriptalert1"),
    ],
)
def test_a_client_is_labelled_by_its_user_agents_product(agent: str, product: str) -> None:
    assert client_product(agent) == product


def test_the_loop_guards_blocked_requests_are_listed() -> None:
    clock = Clock(100.0)
    loops = LocalLoops(60, timer=clock)

    async def fail(key: bytes, times: int) -> None:
        for _ in range(times):
            await loops.failed(key)

    asyncio.run(fail(b"\x01" * 16, 3))
    asyncio.run(fail(b"\x02" * 16, 1))
    clock.now += 10
    ((key, held),) = loops.blocked(3)
    assert key == b"\x01" * 16 and held.count == 3 and held.lifts_in_s == 50


# --- a real brim -----------------------------------------------------------------------------------


@pytest.fixture
def dashboard(
    brim: BrimFactory, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> str:
    monkeypatch.setenv("TEST_ADMIN_KEYS", ADMIN)
    monkeypatch.setenv("TEST_API_KEYS", "client-key")
    gemini = {"api": "gemini", "base_url": provider.url, "native_count": False}
    return brim(
        upstreams={"fake": fake_upstream(provider), "gem": gemini},
        server={"admin_keys_env": "TEST_ADMIN_KEYS", "api_keys_env": "TEST_API_KEYS"},
        models={
            "small": {"context_window": 3_000, "max_output": 500},
            "tight-3000": {"context_window": 24_000},  # at most 8 × its real window
        },
        archive={"enabled": True, "dir": str(tmp_path / "archive")},
        guard={"loop_limit": 2, "loop_window_s": 60},
    )


def overflow_prevented(base: str) -> Any:
    """One request that must be compressed to fit "small", sent with the OpenAI SDK."""
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="client-key", max_retries=0)
    reply = sdk.chat.completions.with_raw_response.create(
        model="small",
        messages=tool_session(OUTPUTS, system="sys"),  # type: ignore[arg-type]
    )
    assert reply.headers["x-brim-actions"] != "none"
    return reply


def overflow_survived_and_loop_blocked(base: str) -> None:
    """A request the provider refuses as too long (brim retries and learns its window), and a
    failing one sent until the loop guard answers 429."""
    key = {"Authorization": "Bearer client-key"}
    retried = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "tight-3000", "messages": [{"role": "user", "content": "x\n" * 6000}]},
        headers=key,
    )
    assert retried.status_code == 200 and retried.headers["x-brim-retries"] == "1"
    statuses = [
        httpx.post(f"{base}/v1/chat/completions", json=FAILING, headers=key).status_code
        for _ in range(3)
    ]
    assert statuses == [400, 400, 429]


SCALED = "gemscaled140-900000"  # the fake's tokenizer counts 1.4 × brim's


def ratio_learned(base: str) -> None:
    """Five Gemini replies to one client whose usage says 1.4 × brim's count: brim learns the
    ratio, and the client settles it (it is the shared ratio: the median of one)."""
    text = " ".join(f"{LINES[i % 10]}{i}" for i in range(2_000))
    for n in range(MIN_REPLIES):
        reply = httpx.post(
            f"{base}/v1beta/models/{SCALED}:generateContent",
            json={"contents": [{"role": "user", "parts": [{"text": f"{n} {text}"}]}]},
            headers={"x-brim-api-key": "client-key"},
        )
        assert reply.status_code == 200, reply.text
    assert wait_for(
        lambda: [r["replies"] for r in admin_status(base)["token_ratios"]] == [MIN_REPLIES]
    )


def admin_status(base: str) -> dict[str, Any]:
    reply = httpx.get(f"{base}/admin/status", headers={"x-brim-admin-key": ADMIN})
    assert reply.status_code == 200
    status: dict[str, Any] = reply.json()
    return status


def test_the_status_has_the_dashboards_figures(dashboard: str) -> None:
    overflow_prevented(dashboard)
    overflow_survived_and_loop_blocked(dashboard)
    ratio_learned(dashboard)
    status = admin_status(dashboard)
    ((ratio,),) = [status["token_ratios"]]
    assert (ratio["upstream"], ratio["model"], ratio["replies"]) == ("gem", SCALED, MIN_REPLIES)
    assert (ratio["clients"], ratio["settled"]) == (1, 1)  # how many taught it, never who
    assert 1.3 < ratio["ratio"] < 1.4 and ratio["updated_s_ago"] < 60
    totals = status["totals"]
    assert (totals["prevented"], totals["survived"], totals["blocked"]) == (1, 1, 1)
    assert status["tokens_removed"].get("clear_tool_results", 0) > 0
    fields = status["series"]["fields"]
    by_key = {(s["model"], s["client"]): s["points"] for s in status["series"]["series"]}
    ((point,),) = [by_key[("small", "openai")]]  # the OpenAI SDK's User-Agent: OpenAI/Python
    small = dict(zip(fields, point, strict=True))
    assert small["prevented"] == 1 and small["demand_max"] > 1 > small["usage_max"] > 0
    assert by_key[("tight-3000", "python-httpx")][0][fields.index("survived")] == 1
    assert {"model": "tight-3000", "kind": "window", "value": 3000} in [
        {k: fact[k] for k in ("model", "kind", "value")} for fact in status["learned"]
    ]
    guard = status["loop_guard"]
    assert (guard["limit"], guard["window_s"]) == (2, 60)
    ((blocked,),) = [guard["blocked"]]
    assert re.fullmatch(r"[0-9a-f]{12}", blocked["request"]) and blocked["failures"] == 2
    event = next(e for e in status["recent_events"] if e["model"] == "small")
    assert event["outcome"] == "compressed" and event["archive_keys"]
    assert "line 3:" not in str(status)  # keys and hashes, never content


@pytest.mark.parametrize(
    "headers", [{}, {"x-brim-admin-key": "wrong"}, {"Authorization": "Bearer client-key"}]
)
def test_the_status_needs_the_admin_key(dashboard: str, headers: dict[str, str]) -> None:
    reply = httpx.get(f"{dashboard}/admin/status", headers=headers)
    assert reply.status_code == 401
    error = reply.json()["error"]  # the OpenAI error format
    assert set(error) >= {"message", "type", "code"} and "admin key" in error["message"]


def test_the_page_is_served_with_a_strict_policy_and_no_data(dashboard: str) -> None:
    page = httpx.get(f"{dashboard}/ui")  # no brim API key needed for the page itself
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["referrer-policy"] == "no-referrer"
    assert '<script src="/ui/app.js"' in page.text and "http" not in page.text  # all local
    script = httpx.get(f"{dashboard}/ui/app.js")
    assert script.status_code == 200 and "x-brim-admin-key" in script.text
    assert re.findall(r"https?://[^\s\"]*", script.text) == ["http://www.w3.org/2000/svg"]
    assert "innerHTML" not in script.text  # data is written as text, never as markup
    assert httpx.get(f"{dashboard}/ui/app.css").status_code == 200
    other = httpx.get(f"{dashboard}/ui/other.js", headers={"Authorization": "Bearer client-key"})
    assert other.status_code == 404  # only the page's own files are public
    assert httpx.get(f"{dashboard}/ui/other.js").status_code == 401


def test_the_page_is_off_without_admin_keys(brim: BrimFactory) -> None:
    base = brim()
    for path in ("/ui", "/ui/app.js", "/admin/status"):
        reply = httpx.get(f"{base}{path}")
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "admin_disabled"


def test_brim_status_prints_the_figures(dashboard: str, capsys: pytest.CaptureFixture[str]) -> None:
    overflow_prevented(dashboard)
    overflow_survived_and_loop_blocked(dashboard)
    ratio_learned(dashboard)
    assert main(["status", "--url", dashboard, "--admin-key", ADMIN]) == 0
    out = capsys.readouterr().out
    assert "overflows prevented 1 · survived 1 · refused 0 · loop guard 429s 1" in out
    usage = re.search(r"^  small\s+openai\s+1\s+(\d+)%\s+(\d+)%", out, re.M)
    assert usage is not None and int(usage[1]) < 100 < int(usage[2])
    timeline = re.findall(r"^  \d\d:\d\d\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out, re.M)
    assert [sum(int(row[i]) for row in timeline) for i in range(4)] == [1, 1, 0, 1]
    assert re.search(r"^  clear_tool_results\s+[\d,]+$", out, re.M)
    assert re.search(r"^  tight-3000\s+window 3,000\s+", out, re.M)
    shared = rf"^  {SCALED}\s+gem\s+× 1\.3\d\d\s+1\s+{MIN_REPLIES}\s+\d+ s ago$"
    assert re.search(shared, out, re.M)
    assert re.search(r"^  [0-9a-f]{12}\s+2\s+\d+ s$", out, re.M)  # the blocked request
    assert re.search(r"^  [\d:]{8}\s+small\s+OpenAI/Python.*\scompressed\s.*sha256:", out, re.M)


def test_brim_status_says_why_it_cannot(
    dashboard: str, capsys: pytest.CaptureFixture[str], closed_port: int
) -> None:
    assert main(["status", "--url", dashboard, "--admin-key", "wrong"]) == 1
    assert "answered 401: A valid admin key is required." in capsys.readouterr().err
    assert main(["status", "--url", f"http://127.0.0.1:{closed_port}", "--admin-key", "k"]) == 1
    assert "cannot reach brim" in capsys.readouterr().err
    assert main(["status", "--url", dashboard]) == 2  # no key given
    assert "--admin-key or $BRIM_ADMIN_KEY" in capsys.readouterr().err


def test_brim_status_takes_the_key_from_the_environment(
    dashboard: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BRIM_ADMIN_KEY", ADMIN)
    assert load_config(None)[1] == []  # not taken for a configuration key
    assert main(["status", "--url", dashboard, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loop_guard"]["limit"] == 2


def test_brim_status_goes_straight_to_brim_whatever_http_proxy_says(
    dashboard: str, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy in the operator's environment is not asked for brim's own address."""
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert main(["status", "--url", dashboard, "--admin-key", ADMIN, "--json"]) == 0


# --- the page in a browser -------------------------------------------------------------------------


def browse(chromium: str, url: str, profile: Path, *extra: str) -> str:
    """Load `url` in headless Chromium, let its scripts and requests run, return its stdout
    (the rendered DOM with --dump-dom)."""
    done = subprocess.run(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",  # tests run as root in CI containers
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--window-size=1280,1200",
            "--virtual-time-budget=8000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_page_shows_a_prevented_overflow(
    dashboard: str, chromium: str, tmp_path: Path, artifacts: Path
) -> None:
    overflow_prevented(dashboard)
    overflow_survived_and_loop_blocked(dashboard)
    ratio_learned(dashboard)
    page = f"{dashboard}/ui#key={ADMIN}"  # a fragment: never sent to the server
    dom = browse(chromium, page, tmp_path / "profile", "--dump-dom")
    assert '<main id="board">' in dom and '<form id="login" hidden="">' in dom
    assert re.search(r'<rect class="bar prevented" data-t="\d+"', dom)  # the timeline
    assert re.search(r'<rect class="bar survived"', dom) and re.search(r'class="bar blocked"', dom)
    plot = dom[dom.index('id="usage-plot"') : dom.index("</svg>", dom.index('id="usage-plot"'))]
    assert plot.count('<circle class="point"') >= 2 and 'data-series="small · openai"' in plot
    assert re.search(r'<tr class="event compressed">.*?sha256:[0-9a-f]{12}', dom)
    assert re.search(r'data-policy="clear_tool_results"', dom)
    assert "tight-3000" in dom[dom.index('id="learned"') :]
    ratios = dom[dom.index('id="ratios"') : dom.index("</table>", dom.index('id="ratios"'))]
    assert re.search(
        rf'<tr data-model="{SCALED}"><td>{SCALED}</td><td>gem</td><td class="num">× 1\.3\d\d</td>'
        rf'<td class="num">1</td><td class="num">{MIN_REPLIES}</td>',
        ratios,
    ), ratios
    assert '<tr class="blocked"><td><code>' in dom
    assert ADMIN not in dom

    shot = artifacts / "ui.png"
    browse(chromium, page, tmp_path / "profile", f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")


def test_the_page_shows_nothing_without_the_key(
    dashboard: str, chromium: str, tmp_path: Path
) -> None:
    overflow_prevented(dashboard)
    dom = browse(chromium, f"{dashboard}/ui#key=wrong", tmp_path / "profile", "--dump-dom")
    assert '<main id="board" hidden="">' in dom and '<form id="login">' in dom
    assert "A valid admin key is required." in dom
    assert "tight-3000" not in dom and "openai" not in dom and "<circle" not in dom


def test_the_dashboard_files_are_package_data() -> None:
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    shipped = tomllib.loads(text)["tool"]["setuptools"]["package-data"]["brim.proxy"]
    assert {"ui/*.html", "ui/*.js", "ui/*.css"} <= set(shipped)
    folder = resources.files("brim.proxy").joinpath("ui")
    assert {name for name, _ in FILES.values()} == {
        item.name for item in folder.iterdir() if not item.name.startswith(".")
    }
