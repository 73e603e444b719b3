"""The request line (`brim.request`): one INFO line for each request brim changed, retried or
refused, none at INFO for the others; the JSON formatter; `brim serve`'s --log-level /
--log-format and BRIM_LOG_LEVEL / BRIM_LOG_FORMAT; and no body or key in any log line."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from brim.proxy.logs import TEXT_FORMAT, JsonFormatter
from tests.conftest import BrimFactory, every_api
from tests.fake_anthropic import FakeAnthropic
from tests.fakes import FakeProvider, wait_for
from tests.test_wire_contract import CASES, Case, session, windows

LINE = re.compile(
    r"^(?P<model>\S+) client=(?P<client>\S+) (?P<tokens_in>[\d,]+) → (?P<tokens_out>[\d,]+) / "
    r"(?P<budget>[\d,]+) tokens actions=(?P<actions>\S+) retries=(?P<retries>\d+) "
    r"restored=(?P<restored>\d+) \+(?P<added_ms>\d+\.\d) ms request_id=(?P<request_id>\S+)$"
)
FIELDS = {
    "model",
    "client",
    "route",
    "upstream",
    "outcome",
    "tokens_in",
    "tokens_out",
    "budget",
    "actions",
    "retries",
    "restored",
    "added_ms",
    "request_id",
}
CANARY_KEY = "sk-logcanary-KEY-7d1e"
CANARY_BODY = "password=hunter2-logcanary-BODY-55aa"


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


@pytest.fixture
def serve(
    brim: BrimFactory, provider: FakeProvider, anthropic_fake: FakeAnthropic
) -> Callable[..., str]:
    """brim in front of the fakes of all four wire APIs (as tests/test_wire_contract.py)."""

    def start(**sections: Any) -> str:
        return brim(**{**every_api(provider, anthropic_fake.url), **sections})

    return start


def post(
    base: str, case: Case, model: str, items: list[dict[str, Any]], **headers: str
) -> httpx.Response:
    body = case.body(model, items, False)
    return httpx.post(f"{base}{case.path(model, False)}", json=body, headers=headers, timeout=60)


def published(base: str) -> None:
    """Return once brim has published the requests it has answered: it does so just after
    writing each reply, before it reads anything that comes in later (here, a health check)."""
    assert httpx.get(f"{base}/healthz").status_code == 200


def request_lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[Any]:
    return [r for r in caplog.records if r.name == "brim.request" and r.levelno >= level]


def test_a_compressed_request_logs_one_info_line_with_its_numbers(
    case: Case, serve: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    model = case.model(6_000)
    base = serve(
        models=windows((model, 6_000)),
        clients={"nightly-bot": {"user_agent": "nightly-bot/*", "cli_overhead": 0}},
    )
    with caplog.at_level(logging.INFO, logger="brim.request"):
        reply = post(base, case, model, session(case, 10), **{"user-agent": "nightly-bot/2.1"})
        assert reply.status_code == 200, reply.text
        wait_for(lambda: request_lines(caplog))
    (record,) = request_lines(caplog)
    assert record.levelno == logging.INFO
    headers = reply.headers
    text = record.getMessage()
    match = LINE.match(text)
    assert match, text
    assert match["model"] == model and match["client"] == "nightly-bot"
    assert int(match["tokens_in"].replace(",", "")) == int(headers["x-brim-tokens-in"])
    assert int(match["tokens_out"].replace(",", "")) == int(headers["x-brim-tokens-out"])
    assert int(match["budget"].replace(",", "")) == int(headers["x-brim-budget"])
    assert "," in match["tokens_in"]  # thousands, as people read them: 8,123
    assert match["actions"] == headers["x-brim-actions"] != "none"
    assert match["retries"] == "0" and match["restored"] == "0"
    assert match["request_id"] == headers["x-brim-request-id"]

    # The JSON formatter: the same facts as keys of one object on one line.
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = orjson.loads(line)
    assert set(entry) == {"time", "level", "logger", "message", *FIELDS}
    assert (entry["level"], entry["logger"], entry["message"]) == ("INFO", "brim.request", text)
    assert entry["model"] == model and entry["client"] == "nightly-bot"
    assert entry["route"] == case.api and entry["outcome"] == "compressed"
    assert entry["tokens_in"] == int(headers["x-brim-tokens-in"])
    assert entry["tokens_out"] == int(headers["x-brim-tokens-out"])
    assert entry["budget"] == int(headers["x-brim-budget"])
    assert entry["tokens_out"] <= entry["budget"] < entry["tokens_in"]
    assert entry["actions"] == headers["x-brim-actions"]
    assert (entry["retries"], entry["restored"]) == (0, 0)
    assert isinstance(entry["added_ms"], float) and entry["added_ms"] >= 0
    assert entry["added_ms"] == float(match["added_ms"])
    assert entry["request_id"] == headers["x-brim-request-id"]


def test_an_untouched_request_logs_nothing_at_info_and_one_line_at_debug(
    case: Case, serve: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    model = case.model(50_000)
    base = serve(models=windows((model, 50_000)))
    with caplog.at_level(logging.INFO, logger="brim.request"):
        reply = post(base, case, model, session(case, 1))
        assert reply.status_code == 200 and reply.headers["x-brim-actions"] == "none"
        published(base)  # while the level is INFO
    assert request_lines(caplog, logging.DEBUG) == []
    with caplog.at_level(logging.DEBUG, logger="brim.request"):
        reply = post(base, case, model, session(case, 1), **{"user-agent": "curl/8.5.0 extra"})
        assert reply.status_code == 200
        wait_for(lambda: request_lines(caplog, logging.DEBUG))
    (record,) = request_lines(caplog, logging.DEBUG)
    assert record.levelno == logging.DEBUG
    match = LINE.match(record.getMessage())
    assert match, record.getMessage()
    assert match["actions"] == "none" and match["tokens_in"] == match["tokens_out"]
    assert match["client"] == "curl/8.5.0"  # no [clients] rule: the User-Agent's first word


def test_a_retried_request_logs_its_retry(
    case: Case, serve: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    model = case.model(3_000)
    base = serve(models={model: {"context_window": 24_000}})  # brim believes it is 8x larger
    with caplog.at_level(logging.INFO, logger="brim.request"):
        reply = post(base, case, model, session(case, 5))
        assert reply.status_code == 200, reply.text
        wait_for(lambda: request_lines(caplog))
    retries = int(reply.headers["x-brim-retries"])
    # Once: where the provider states its window, brim cuts to it; the Responses fake does not
    # state it, and the retry's first step (a cut well below what was sent) already fits.
    assert retries == 1
    (record,) = request_lines(caplog)
    match = LINE.match(record.getMessage())
    assert match, record.getMessage()
    assert match["retries"] == str(retries)
    assert match["actions"] == reply.headers["x-brim-actions"]
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["retries"] == retries and entry["outcome"] == "retried"


def test_a_refused_request_logs_its_outcome(
    brim: BrimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    base = brim(models={"strict-tiny": {"context_window": 300, "max_output": 50}})
    system = "You are an assistant with very detailed standing instructions. " * 200
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
    with caplog.at_level(logging.INFO, logger="brim.request"):
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.chat.completions.create(
                model="strict-tiny",
                messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
            )
        wait_for(lambda: request_lines(caplog))
    assert caught.value.code == "context_length_exceeded"
    (record,) = request_lines(caplog)
    assert record.getMessage().endswith(" outcome=refused")
    assert getattr(record, "outcome") == "refused"  # noqa: B009


def test_client_input_cannot_forge_a_log_line(
    brim: BrimFactory, caplog: pytest.LogCaptureFixture
) -> None:
    base = brim(models={"small": {"context_window": 3_000, "max_output": 500}})
    forged = "small\n2026-01-01 INFO brim.request: forged"
    with caplog.at_level(logging.DEBUG, logger="brim.request"):
        reply = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": forged, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-request-id": "id with spaces"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        wait_for(lambda: request_lines(caplog, logging.DEBUG))
    (record,) = request_lines(caplog, logging.DEBUG)
    message = record.getMessage()
    assert "\n" not in message and LINE.match(message), message
    assert message.startswith("small?2026-01-01?INFO?brim.request:?forged client=")
    # Not a short token: brim made its own id (tests/security/test_edge_input.py).
    assert re.search(r" request_id=[0-9a-f]{24}$", message), message


def test_no_log_line_holds_a_key_or_a_body(
    case: Case, serve: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every record brim's process logs at DEBUG — access log and request lines included, for
    a compressed request and an untouched one carrying keys in every header a client uses and
    a secret in the body — formatted as text and as JSON, extras and all."""
    small, large = case.model(6_000), case.model(50_000)
    base = serve(models=windows((small, 6_000), (large, 50_000)))
    items = session(case, 10)
    items[0] = case.user(f"Find out why the nightly build fails. {CANARY_BODY}")
    keys = {
        "authorization": f"Bearer {CANARY_KEY}",
        "x-api-key": CANARY_KEY,
        "x-goog-api-key": CANARY_KEY,
        "api-key": CANARY_KEY,
    }
    with caplog.at_level(logging.DEBUG):
        assert post(base, case, small, items, **keys).headers["x-brim-actions"] != "none"
        assert post(base, case, large, items[:3], **keys).headers["x-brim-actions"] == "none"
        wait_for(lambda: len(request_lines(caplog, logging.DEBUG)) == 2)
    records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert len(request_lines(caplog, logging.DEBUG)) == 2
    assert any(r.name == "aiohttp.access" for r in records)  # the access log was on
    text, json = logging.Formatter(TEXT_FORMAT), JsonFormatter()
    written = "\n".join(f"{text.format(r)}\n{json.format(r)}" for r in records)
    assert small in written  # the lines are there…
    for secret in ("logcanary", "hunter2"):
        assert secret not in written  # …and hold no key and no body


# `brim serve` as a user runs it: the level and format from flags and the environment.

BRIM = str(Path(sys.executable).with_name("brim"))


@pytest.fixture
def served(tmp_path: Path, provider: FakeProvider) -> Iterator[Callable[..., tuple[str, str]]]:
    """Run `brim serve` with extra args and environment, send it one request that must be
    compressed and one that fits, stop it, and return its stderr and the compressed reply's
    request id."""
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'[upstreams.fake]\napi = "openai"\nbase_url = "{provider.url}/v1"\n'
        '[models."small"]\ncontext_window = 6000\nmax_output = 1000\n'
    )
    running: list[subprocess.Popen[str]] = []

    def run(*args: str, **env: str) -> tuple[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("BRIM_")}
        process = subprocess.Popen(
            [BRIM, "serve", "--config", str(config), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**environ, **env},
        )
        running.append(process)
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        port = re.search(r":(\d+)$", line.strip())
        assert port, (line, process.stderr.read() if process.poll() is not None else "")
        base = f"http://127.0.0.1:{port.group(1)}/v1/chat/completions"
        chat = CASES["openai.chat"]
        cut = httpx.post(base, json=chat.body("small", session(chat, 10), False), timeout=60)
        assert cut.status_code == 200 and cut.headers["x-brim-actions"] != "none", cut.text
        fits = httpx.post(base, json=chat.body("small", session(chat, 1), False), timeout=60)
        assert fits.status_code == 200 and fits.headers["x-brim-actions"] == "none", fits.text
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        return process.stderr.read(), cut.headers["x-brim-request-id"]

    yield run
    for process in running:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_takes_level_and_format_from_the_environment(
    served: Callable[..., tuple[str, str]],
) -> None:
    stderr, request_id = served(BRIM_LOG_FORMAT="json", BRIM_LOG_LEVEL="info")
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    entries = [orjson.loads(line) for line in lines]  # every log line is one JSON object
    assert entries and all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    logged = [e for e in entries if e["logger"] == "brim.request"]
    assert len(logged) == 1, stderr  # the compressed request; the one that fit has none
    (entry,) = logged
    assert set(entry) >= FIELDS
    assert (entry["level"], entry["model"], entry["request_id"]) == ("INFO", "small", request_id)
    assert entry["tokens_out"] <= entry["budget"] < entry["tokens_in"]
    assert entry["actions"] != "none" and entry["retries"] == 0
    # Only brim's own start-up lines are not log records.
    others = [line for line in stderr.splitlines() if not line.startswith("{")]
    assert all(line.startswith("brim: ") for line in others), others

    stderr, _ = served(BRIM_LOG_FORMAT="json", BRIM_LOG_LEVEL="warning")
    assert "brim.request" not in stderr and "aiohttp.access" not in stderr

    stderr, _ = served(BRIM_LOG_FORMAT="JSON", BRIM_LOG_LEVEL="DEBUG")  # any case
    logged = [e for e in map(orjson.loads, re.findall(r"^\{.*$", stderr, re.M))]
    requests = [e for e in logged if e["logger"] == "brim.request"]
    assert [e["level"] for e in requests] == ["INFO", "DEBUG"]  # at debug, the one that fit too


def test_serve_flags_win_over_the_environment(served: Callable[..., tuple[str, str]]) -> None:
    stderr, request_id = served(
        "--log-format",
        "text",
        "--log-level",
        "info",
        BRIM_LOG_FORMAT="json",
        BRIM_LOG_LEVEL="error",
    )
    lines = [line for line in stderr.splitlines() if " brim.request: " in line]
    assert len(lines) == 1, stderr
    line = lines[0]
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO brim.request: ", line), line
    match = LINE.match(line.split(" brim.request: ", 1)[1])
    assert match and match["model"] == "small" and match["request_id"] == request_id, line
    assert not any(line.startswith("{") for line in stderr.splitlines())


def test_serve_refuses_an_unknown_log_setting(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BRIM_")}
    done = subprocess.run(
        [BRIM, "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**environ, "BRIM_LOG_FORMAT": "xml"},
    )
    assert done.returncode == 2
    assert "BRIM_LOG_FORMAT='xml': expected one of text, json" in done.stderr
