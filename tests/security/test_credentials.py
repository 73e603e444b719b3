"""A client's credential goes only to the upstream it addressed.

Two scripted providers on 127.0.0.1 record every header and query string they receive: "home",
where the client's requests are routed (its own key passes through there), and "other", behind
the summarizer, the fallback models and their token counters. A client on each wire API — the
official openai and anthropic SDKs, Gemini over plain HTTP with its key in `?key=` — sends its
own key in a request that brim summarizes, sends to a fallback, counts with the fallback's own
counter, or continues with a hidden restore round on the fallback. The other upstream never
sees the client's key: with its own `api_key_env` it sees that key, and without one the step is
skipped, which the log and the request's trace span say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from brim.policies.budget import budget_for, requested_output
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.wires import WIRES
from brim.proxy.config import BrimConfig
from tests.conftest import BrimFactory
from tests.fakes import LoopThread, Seen, counted, start_app
from tests.restoring import (
    Restoring,
    chat_body,
    conversation,
    gemini_body,
    logs,
    messages_body,
    responses_body,
)
from tests.test_restore_e2e import root_span

OTHER_ENV = "OTHER_UPSTREAM_OWN_KEY"
OTHER_KEY = "other-upstream-own-key-0123"
WITHHELD = "brim.credential.withheld"
# The header each kind of upstream takes a configured key in, by the path it was asked on.
OWN_KEY_HEADER = {
    "/v1/chat/completions": ("authorization", f"Bearer {OTHER_KEY}"),
    "/v1/responses": ("authorization", f"Bearer {OTHER_KEY}"),
    "/v1/messages": ("x-api-key", OTHER_KEY),
    "/v1/messages/count_tokens": ("x-api-key", OTHER_KEY),
    "/v1beta/": ("x-goog-api-key", OTHER_KEY),
}


@dataclass(frozen=True)
class Client:
    """A client of one wire API with its own key (`secret`), and which of the other upstreams
    serves its API (where its summaries and fallbacks are routed)."""

    api: str  # brim's name of the API
    scripted: str  # the scripted provider's name of it
    secret: str
    other_upstream: str

    def body(self, texts: list[str], model: str) -> dict[str, Any]:
        builders = {
            "openai.chat": chat_body,
            "anthropic.messages": messages_body,
            "openai.responses": responses_body,
        }
        if self.api == "gemini.generate":
            return gemini_body(texts)
        return builders[self.api](texts, model=model)

    def send(self, base: str, model: str, body: dict[str, Any]) -> httpx.Headers:
        """The request as the API's own client sends it (its key where that client puts it);
        the reply's headers. The reply must be a success."""
        if self.api == "openai.chat":
            sdk = openai.OpenAI(base_url=f"{base}/v1", api_key=self.secret, max_retries=0)
            return sdk.chat.completions.with_raw_response.create(**body).headers
        if self.api == "openai.responses":
            sdk = openai.OpenAI(base_url=f"{base}/v1", api_key=self.secret, max_retries=0)
            return sdk.responses.with_raw_response.create(**body).headers
        if self.api == "anthropic.messages":
            claude = anthropic.Anthropic(base_url=base, api_key=self.secret, max_retries=0)
            return claude.messages.with_raw_response.create(**body).headers
        reply = httpx.post(
            f"{base}/v1beta/models/{model}:generateContent?key={self.secret}",
            json=body,
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return reply.headers


CLIENTS = {
    "openai.chat": Client("openai.chat", "chat", "sk-chat-client-secret", "other-openai"),
    "openai.responses": Client(
        "openai.responses", "responses", "sk-responses-client-secret", "other-openai"
    ),
    "anthropic.messages": Client(
        "anthropic.messages", "messages", "sk-ant-messages-client-secret", "other-anthropic"
    ),
    "gemini.generate": Client(
        "gemini.generate", "gemini", "AIza-gemini-client-secret", "other-gemini"
    ),
}
NATIVELY_COUNTED = ("anthropic.messages", "gemini.generate")


def test_every_wire_api_has_a_client() -> None:
    assert set(CLIENTS) == set(WIRES)


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest) -> Client:
    return CLIENTS[request.param]


@pytest.fixture(autouse=True)
def other_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OTHER_ENV, OTHER_KEY)


@pytest.fixture
def fakes(loop_thread: LoopThread) -> Iterator[Callable[[], Restoring]]:
    """Starts a recording provider (one that calls brim_restore when offered) on loopback."""
    runners: list[Any] = []

    def make() -> Restoring:
        fake = Restoring()
        runner, fake.url = loop_thread.run(start_app(fake.app()))
        runners.append(runner)
        return fake

    yield make
    for runner in runners:
        loop_thread.run(runner.cleanup())


def config(home: str, other: str, *, keyed: bool, **sections: Any) -> BrimConfig:
    """brim with each API routed to `home`, and the summarizer (`summarizer-*`) and fallback
    models (`fb-*`) on `other`, on every API — with `other`'s own key where `keyed`, else with
    none."""
    own = {"api_key_env": OTHER_ENV} if keyed else {}
    sections.setdefault("restore", {"enabled": False})
    return BrimConfig(
        upstreams={
            "home-openai": {"api": "openai", "base_url": f"{home}/v1"},
            "home-anthropic": {"api": "anthropic", "base_url": home},
            "home-gemini": {"api": "gemini", "base_url": home},
            "other-openai": {"api": "openai", "base_url": f"{other}/v1", **own},
            "other-anthropic": {"api": "anthropic", "base_url": other, **own},
            "other-gemini": {"api": "gemini", "base_url": other, **own},
        },
        routes={
            "summarizer-*": ["other-openai", "other-anthropic", "other-gemini"],
            "fb-*": ["other-openai", "other-anthropic", "other-gemini"],
            "*": ["home-openai", "home-anthropic", "home-gemini"],
        },
        **sections,
    )


@dataclass
class Run:
    home: Restoring
    other: Restoring
    headers: httpx.Headers
    spans: InMemorySpanExporter
    body: dict[str, Any]  # the client's request


def run(
    brim: BrimFactory,
    fakes: Callable[[], Restoring],
    client: Client,
    model: str,
    *,
    keyed: bool,
    turns: int = 16,
    **sections: Any,
) -> Run:
    """One request of `client` for `model`, through a brim of its own in front of two fresh
    providers."""
    home, other = fakes(), fakes()
    spans = InMemorySpanExporter()
    base = brim(
        config=config(home.url, other.url, keyed=keyed, **sections),
        span_processors=[SimpleSpanProcessor(spans)],
    )
    body = client.body(logs(turns=turns), model)
    headers = client.send(base, model, body)
    return Run(home, other, headers, spans, body)


def run_without_key(caplog: pytest.LogCaptureFixture, *args: Any, **options: Any) -> Run:
    """`run` with the other upstreams keyless, its warnings captured afresh."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="brim.credentials"):
        return run(*args, keyed=False, **options)


def _sent(seen: Seen) -> str:
    return " ".join([*seen.headers.values(), seen.query])


def assert_only_its_own_key(run: Run, client: Client) -> None:
    """The other upstream was called, each time with its own key and never the client's."""
    assert run.other.seen, "the other upstream was never called"
    for seen in run.other.seen:
        assert client.secret not in _sent(seen), (seen.path, seen.headers, seen.query)
        header, value = next(v for p, v in OWN_KEY_HEADER.items() if seen.path.startswith(p))
        assert seen.headers.get(header) == value, (seen.path, seen.headers)


def assert_skipped(
    run: Run, client: Client, caplog: pytest.LogCaptureFixture, step: str, upstream: str
) -> None:
    """The other upstream saw nothing; the client's key went to its own upstream only; the log
    and the request's span say which step was skipped on which upstream."""
    assert run.other.seen == []
    assert any(client.secret in _sent(seen) for seen in run.home.seen)
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "brim.credentials" and r.levelno == logging.WARNING
    ]
    assert any(step in line and repr(upstream) in line for line in warned), warned
    assert not any(client.secret in line for line in warned)  # a log never holds a key
    root = root_span(run.spans)
    events = [dict(e.attributes or {}) for e in root.events if e.name == WITHHELD]
    assert any(e["brim.step"] == step and e["brim.upstream"] == upstream for e in events), events
    attribute = (root.attributes or {})["brim.credentials_withheld"]
    assert any(item.startswith(f"{step}:") for item in attribute)  # type: ignore[union-attr]


def test_a_summary_on_another_upstream_never_carries_the_clients_key(
    brim: BrimFactory,
    fakes: Callable[[], Restoring],
    client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sections: dict[str, Any] = {
        "models": {"m-small": {"context_window": 8_000, "max_output": 1_000}},
        "guard": {"policies": ["evict", "truncate"]},
        "summarize": {"enabled": True, "provider": "summarizer-x", "max_retries": 0},
    }
    keyed = run(brim, fakes, client, "m-small", keyed=True, **sections)
    assert "summarize" in keyed.headers["x-brim-actions"]
    assert_only_its_own_key(keyed, client)
    assert {call.model for call in keyed.other.calls} == {"summarizer-x"}

    bare = run_without_key(caplog, brim, fakes, client, "m-small", **sections)
    actions = bare.headers["x-brim-actions"]
    assert "evict" in actions and "summarize" not in actions  # evict's notice stands
    assert_skipped(bare, client, caplog, "summarize", client.other_upstream)


def test_a_fallback_on_another_upstream_never_carries_the_clients_key(
    brim: BrimFactory,
    fakes: Callable[[], Restoring],
    client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    models = {
        "m-small": {"context_window": 6_000, "max_output": 1_000, "fallbacks": ["fb-big"]},
        "fb-big": {"context_window": 100_000, "max_output": 1_000},
    }
    keyed = run(brim, fakes, client, "m-small", keyed=True, models=models)
    assert keyed.headers["x-brim-actions"] == "fallback:1"
    assert keyed.home.seen == []
    assert_only_its_own_key(keyed, client)
    (call,) = keyed.other.calls
    assert call.model == "fb-big"
    whole = conversation(client.scripted, keyed.body)
    assert conversation(client.scripted, call.body) == whole  # nothing was cut

    bare = run_without_key(caplog, brim, fakes, client, "m-small", models=models)
    assert "fallback" not in bare.headers["x-brim-actions"]
    assert bare.headers["x-brim-actions"] != "none"  # compressed instead, on its own upstream
    assert_skipped(bare, client, caplog, "fallback", client.other_upstream)


@pytest.mark.parametrize("api", NATIVELY_COUNTED)
def test_a_fallbacks_own_token_counter_never_gets_the_clients_key(
    brim: BrimFactory,
    fakes: Callable[[], Restoring],
    api: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """brim's estimate of the request for the fallback lies within its error band around the
    fallback's budget: the fallback's upstream counts it — with its own key, or not at all."""
    client = CLIENTS[api]
    tokenizer = "claude" if api == "anthropic.messages" else "o200k_base"
    asked = client.body(logs(turns=16), "fb-count")
    estimate = counted(api, asked, tokenizer)
    window = estimate
    while True:  # the smallest window whose budget is 5 % over the estimate
        facts = ModelFacts(context_window=window, max_output=1_000, tokenizer=tokenizer)
        resolved = LimitsRegistry({"fb-count": facts}).resolve("fb-count")
        if budget_for(resolved, requested_output(asked)).effective >= estimate * 1.05:
            break
        window += 50
    models = {
        "m-small": {"context_window": 6_000, "max_output": 1_000, "fallbacks": ["fb-count"]},
        "fb-count": {"context_window": window, "max_output": 1_000, "tokenizer": tokenizer},
    }
    keyed = run(brim, fakes, client, "m-small", keyed=True, models=models)
    assert keyed.headers["x-brim-actions"] == "fallback:1"
    counts = [s for s in keyed.other.seen if s.path.endswith(("count_tokens", ":countTokens"))]
    assert len(counts) == 1  # it was counted there…
    assert_only_its_own_key(keyed, client)  # …with the other upstream's own key

    bare = run_without_key(caplog, brim, fakes, client, "m-small", models=models)
    assert_skipped(bare, client, caplog, "fallback", client.other_upstream)


def test_a_restore_round_on_another_upstream_never_carries_the_clients_key(
    brim: BrimFactory,
    fakes: Callable[[], Restoring],
    client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The guard cuts the request (offering brim_restore); its own upstream refuses it as too
    long (its real window is 5 000); the retry sends it to the fallback on the other upstream,
    whose model calls brim_restore: brim answers and asks the other upstream again."""
    sections: dict[str, Any] = {
        "models": {
            "m-tight-5000": {
                "context_window": 8_000,
                "max_output": 1_000,
                "fallbacks": ["fb-restore"],
            },
            "fb-restore": {"context_window": 100_000, "max_output": 1_000},
        },
        "guard": {"prefer_fallback": False},  # the cut comes first here
        "restore": {"enabled": True},
    }
    keyed = run(brim, fakes, client, "m-tight-5000", keyed=True, **sections)
    assert keyed.headers["x-brim-restored"] == "1"
    assert [c.reply for c in keyed.home.calls] == ["overflow"]
    assert [(c.model, c.reply) for c in keyed.other.calls] == [
        ("fb-restore", "read 1"),
        ("fb-restore", "final"),  # the hidden round, on the fallback too
    ]
    assert_only_its_own_key(keyed, client)

    bare = run_without_key(caplog, brim, fakes, client, "m-tight-5000", **sections)
    assert "fallback" not in bare.headers["x-brim-actions"]
    assert_skipped(bare, client, caplog, "fallback", client.other_upstream)
    assert [c.model for c in bare.home.calls if c.reply == "final"] == ["m-tight-5000"]
