"""The guard and compression, measured in process: no network, just brim's own work."""

from __future__ import annotations

import asyncio
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from bench import procs
from brim.adapters.adapter import UpstreamResponse
from brim.adapters.exchange import Exchange
from brim.middleware.services.sessions import SessionMemory
from brim.middleware.stages.guard import Guard
from brim.middleware.stages.resolve_limits import ResolveLimits
from brim.policies.compress import DEFAULT_ORDER, build_policies, compress_request
from brim.policies.limits import LimitsRegistry, ModelFacts
from brim.policies.tokens import CounterMeter, TokenCounter
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files

WORDS = [
    "def",
    "return",
    "value",
    "config",
    "error",
    "path",
    "result",
    "json",
    "line",
    "self",
    "import",
    "the",
    "a",
]


def agent_session(tool_calls: int, tokens_per_result: int, seed: int = 7) -> list[dict[str, Any]]:
    """A coding-agent history: a system prompt, a task, then tool calls with varied output."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools. " * 40},
        {"role": "user", "content": "Find and fix the bug in the billing module."},
    ]
    for n in range(tool_calls):
        words = [WORDS[(n * 7 + i * 13 + seed) % len(WORDS)] for i in range(tokens_per_result)]
        lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": orjson.dumps({"path": f"src/m{n}.py"}).decode(),
                        },
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{n}",
                "content": f"# module {n}\n" + "\n".join(lines),
            }
        )
    return messages


def _exchange(body: dict[str, Any]) -> Exchange:
    raw = orjson.dumps(body)
    return Exchange(
        api="openai.chat",
        method="POST",
        endpoint="/chat/completions",
        query="",
        model=body["model"],
        body=body,
        raw=raw,
        headers=CIMultiDictProxy(CIMultiDict()),
        stream=False,
        upstream="fake",
        request_id="bench",
    )


def _limits(counter: TokenCounter, model: str, window: int) -> ResolveLimits:
    registry = LimitsRegistry({model: ModelFacts(context_window=window, max_output=8_192)})
    return ResolveLimits(registry, counter, safety_margin=0.05, clients={})


async def _answer(exchange: Exchange) -> UpstreamResponse:
    return UpstreamResponse(status=200, headers={}, body=b"{}")


async def guard_added_ms(counter: TokenCounter, body: dict[str, Any], window: int) -> float:
    limits = _limits(counter, body["model"], window)
    guard = Guard(counter, build_policies(DEFAULT_ORDER, {}), low_water=0.85, repair_pairs=True)

    async def guarded(exchange: Exchange) -> UpstreamResponse:
        return await guard(exchange, _answer)

    exchange = _exchange(body)
    started = time.perf_counter()
    await limits(exchange, guarded)
    elapsed = (time.perf_counter() - started) * 1000
    assert exchange.report.outcome is None, "the fitting request was compressed"
    return elapsed


def guard_fitting(tool_calls: int, tokens_per_result: int, turns: int = 7) -> dict[str, Any]:
    """The guard (with limits) on a request that fits: cold (nothing counted yet), then warm —
    the session's next turns, each two new messages on the same history — in one event loop,
    as in a running brim (whose worker threads are started already). Warm: the median turn."""
    use_bundled_tiktoken_files()
    counter = TokenCounter()
    counter.warm()
    messages = agent_session(tool_calls, tokens_per_result)
    body = {"model": "big-model", "messages": messages}
    tokens = counter.request(CHAT, body, "o200k_base").total
    counter = TokenCounter()  # cold: nothing cached
    counter.warm()

    def next_turn(turn: int) -> dict[str, Any]:
        return {
            "model": "big-model",
            "messages": [
                *messages,
                {"role": "assistant", "content": f"Found it ({turn})."},
                {"role": "user", "content": f"Fix it ({turn})."},
            ],
        }

    async def run() -> tuple[float, list[float]]:
        cold = await guard_added_ms(counter, body, tokens * 2)
        warm = [await guard_added_ms(counter, next_turn(t), tokens * 2) for t in range(turns)]
        return cold, warm

    cold, warm = asyncio.run(run())
    return {
        "tokens": tokens,
        "tool_calls": tool_calls,
        "cold_ms": round(cold, 2),
        "warm_ms": round(statistics.median(warm), 2),
        "warm_min_ms": round(min(warm), 2),
        "warm_max_ms": round(max(warm), 2),
    }


def compression(tool_calls: int, tokens_per_result: int, budget: int) -> dict[str, Any]:
    use_bundled_tiktoken_files()
    counter = TokenCounter()
    counter.warm()
    policies = build_policies(DEFAULT_ORDER, {})
    messages = agent_session(tool_calls, tokens_per_result)
    meter = CounterMeter(counter, "o200k_base", "big-model", CHAT)
    body = {"model": "big-model", "messages": messages}
    started = time.perf_counter()
    cold = compress_request(body, meter, policies, limit=budget, low_water=0.85)
    cold_ms = (time.perf_counter() - started) * 1000
    later = {
        "model": "big-model",
        "messages": [*messages, {"role": "user", "content": "and then?"}],
    }
    started = time.perf_counter()
    warm = compress_request(later, meter, policies, limit=budget, low_water=0.85)
    warm_ms = (time.perf_counter() - started) * 1000
    assert cold.fits and warm.fits
    carried_ms = asyncio.run(guard_carrying_ms(counter, body, later, budget))
    return {
        "tokens_in": cold.tokens_in,
        "tokens_out": cold.tokens_out,
        "budget": budget,
        "tool_calls": tool_calls,
        "actions": cold.actions,
        "cold_ms": round(cold_ms, 1),
        "warm_ms": round(warm_ms, 1),
        "carried_ms": round(carried_ms, 1),
    }


async def guard_carrying_ms(
    counter: TokenCounter, body: dict[str, Any], later: dict[str, Any], budget: int
) -> float:
    """The guard stage as deployed (with its session memory) on the session's next turn after
    a compressed one, which goes out as that one plus what is new: the stage's own time."""
    limits = _limits(counter, body["model"], math.ceil(budget / 0.95))  # no max_tokens asked
    guard = Guard(
        counter,
        build_policies(DEFAULT_ORDER, {}),
        low_water=0.85,
        repair_pairs=True,
        sessions=SessionMemory(32 * 2**20),
        room_for_turns=4,
    )
    elapsed = 0.0

    async def guarded(exchange: Exchange) -> UpstreamResponse:
        nonlocal elapsed
        started = time.perf_counter()
        answer = await guard(exchange, _answer)
        elapsed = (time.perf_counter() - started) * 1000
        return answer

    await limits(_exchange(body), guarded)
    exchange = _exchange(later)
    await limits(exchange, guarded)
    assert exchange.report.outcome is not None and exchange.report.outcome.carried
    return elapsed


# What a fresh process runs to measure `compression` with the code of its working directory.
_MEASURE = (
    "import sys, orjson\n"
    "from bench import inprocess\n"
    "calls, per, budget = map(int, sys.argv[1:4])\n"
    "sys.stdout.write(orjson.dumps(inprocess.compression(calls, per, budget)).decode())\n"
)
TIMES = ("cold_ms", "warm_ms", "carried_ms")


def compression_in(root: Path, tool_calls: int, tokens_per_result: int, budget: int) -> Any:
    """`compression` measured in a fresh process running the code of checkout `root`."""
    sizes = [str(tool_calls), str(tokens_per_result), str(budget)]
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *sizes],
        capture_output=True,
        check=True,
        timeout=600,
        **procs.running_in(root),
    )
    return orjson.loads(done.stdout)


def compression_against(
    base: Path, tool_calls: int, tokens_per_result: int, budget: int, rounds: int = 5
) -> dict[str, Any]:
    """`compression` with this checkout's code and with checkout `base`'s, each in a fresh
    process, alternating for `rounds` rounds (so both meet the same machine): the medians of
    each, and this checkout's as a multiple of the base's. The same request must come out the
    same size from both, or the times compare different work (`same_output`)."""
    runs: dict[str, list[Any]] = {"this": [], "base": []}
    for _ in range(rounds):
        for name, root in (("this", procs.ROOT), ("base", base)):
            runs[name].append(compression_in(root, tool_calls, tokens_per_result, budget))
    medians = {
        name: {time: round(statistics.median(run[time] for run in done), 1) for time in TIMES}
        for name, done in runs.items()
    }
    return {
        "rounds": rounds,
        "base": str(base),
        "this_ms": medians["this"],
        "base_ms": medians["base"],
        "ratio": {
            time: round(medians["this"][time] / max(medians["base"][time], 1e-9), 2)
            for time in TIMES
        },
        "same_output": len({run["tokens_out"] for done in runs.values() for run in done}) == 1,
    }
