"""The rule that a client's credential goes only to the upstream it addressed
(`adapters.credentials`): which upstreams brim may call for a request, what of a client's it
carries, and how a step not taken is recorded."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from pydantic import SecretStr

from brim.adapters.credentials import (
    Caller,
    caller_of,
    key_parameters,
    may_call,
    withhold,
    without_key,
)
from brim.adapters.exchange import Withheld
from brim.adapters.upstream_config import UpstreamConfig
from tests.builders import exchange

BARE = UpstreamConfig(api="openai", base_url="https://other.test/v1")
KEYED = BARE.model_copy(update={"api_key": SecretStr("sk-own")})  # as api_key_env sets it
CLI = UpstreamConfig(api="cli", command="claude")


@pytest.mark.parametrize(
    ("query", "without", "keys"),
    [
        ("", "", ""),
        ("alt=sse", "alt=sse", ""),
        ("key=AIza-1", "", "key=AIza-1"),
        ("alt=sse&key=AIza-1&x=2", "alt=sse&x=2", "key=AIza-1"),
        ("%6Bey=AIza-1&keys=2&monkey=3", "keys=2&monkey=3", "%6Bey=AIza-1"),  # encoded name
        ("%6Bey=AIza-1&alt=sse", "alt=sse", "%6Bey=AIza-1"),  # no "key" left in the text
        ("k%65y=AIza-1", "", "k%65y=AIza-1"),
        ("key=a&key=b", "", "key=a&key=b"),
    ],
)
def test_the_key_parameters_of_a_query_string(query: str, without: str, keys: str) -> None:
    assert without_key(query) == without
    assert key_parameters(query) == keys


def test_brim_calls_an_upstream_with_its_own_key_or_the_one_the_client_addressed() -> None:
    assert may_call("other", KEYED, "home")  # its own api_key_env
    assert may_call("other", CLI, "home")  # a CLI on its own login: no key of the client's
    assert may_call("home", BARE, "home")  # the client's own upstream: its key may go there
    assert not may_call("other", BARE, "home")  # anywhere else: no
    assert not may_call("other", BARE, None)  # nor for a request brim made itself


def test_a_caller_holds_the_clients_credentials_and_nothing_else() -> None:
    headers = {"Authorization": "Bearer c", "X-Api-Key": "c", "User-Agent": "ua", "Cookie": "s"}
    made = caller_of(
        exchange("gemini.generate", headers=headers, query="alt=sse&key=AIza", upstream="home")
    )
    assert made.api == "gemini.generate" and made.upstream == "home"
    assert dict(made.headers) == {"Authorization": "Bearer c", "X-Api-Key": "c"}
    assert made.query == "key=AIza"


def test_a_step_not_taken_is_recorded_once_and_logged_without_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = exchange(headers={"Authorization": "Bearer sk-secret"}, upstream="home")
    caller = caller_of(request)
    with caplog.at_level(logging.WARNING, logger="brim.credentials"):
        withhold(caller, "summarize", "cheap", "other")
        withhold(caller, "summarize", "cheap", "other")  # again, in the same request
        withhold(caller, "fallback", "big", "other")
    assert request.report.withheld == (
        Withheld("summarize", "cheap", "other"),
        Withheld("fallback", "big", "other"),
    )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("'other'" in line and "'home'" in line for line in lines)
    assert not any("sk-secret" in line for line in lines)


def test_a_caller_without_a_report_still_logs() -> None:
    caller = dataclasses.replace(Caller(api="openai.chat"), request_id="r")
    withhold(caller, "summarize", "cheap", "other")  # no report to record on: no error
