"""`brim inspect` and `brim models`: what brim knows about a request or a model, offline (the
token ratios learned by the brims on `[cache] url` aside, which the command reads first)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict

from brim.middleware.stages.guard import guard_outcome, summary_low_water
from brim.policies import model_table
from brim.policies.budget import budget_for, requested_output
from brim.policies.clients import match_client
from brim.policies.compress import build_policies
from brim.policies.limits import LimitsRegistry, ResolvedLimits
from brim.policies.ratios import Shared, TokenRatios
from brim.policies.tokens import TokenCounter
from brim.policies.wires import WIRES, wire_of_body
from brim.policies.wires.base import Wire
from brim.proxy.config import BrimConfig


class InspectError(ValueError):
    """The request file cannot be inspected; the message says why."""


def read_request(path: str) -> dict[str, Any]:
    try:
        data = orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise InspectError(f"{path}: no such file") from None
    except orjson.JSONDecodeError as exc:
        raise InspectError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not any(
        isinstance(data.get(field), list | str) for field in ("messages", "input", "contents")
    ):
        raise InspectError(
            f"{path}: expected a request body with `messages` (Chat Completions, Anthropic "
            "Messages), `input` (Responses) or `contents` (Gemini)"
        )
    return data


def wire_named(api: str | None, body: Mapping[str, Any]) -> Wire:
    """The wire API `api` names (e.g. "anthropic.messages"), or the one the body's shape says."""
    if api is None:
        return wire_of_body(body)
    if api not in WIRES:
        raise InspectError(f"unknown wire API {api!r}; known: {', '.join(WIRES)}")
    return WIRES[api]


def limits_report(resolved: ResolvedLimits) -> dict[str, Any]:
    limits = resolved.limits
    return {
        "model": resolved.model.raw,
        "normalised": limits.model,
        "cli": resolved.model.cli,
        "provider": limits.provider,
        "context_window": limits.context_window,
        "max_output": limits.max_output,
        "output_counts_against_window": limits.output_counts,
        "tokenizer": limits.tokenizer,
        "cli_overhead": resolved.cli_overhead,
        "sources": {figure: str(source) for figure, source in resolved.sources.items()},
    }


def shared_row(shared: Shared) -> dict[str, Any]:
    """What is shown of a model's learned ratio on one upstream: the shared value (None until
    a client settled), how many clients taught it, how many of them settled (their median is
    the shared value), and their replies — never who they are."""
    return {
        "ratio": None if shared.value is None else round(shared.value, 4),
        "clients": shared.owners,
        "settled": shared.settled,
        "replies": shared.replies,
    }


def shared_ratios(
    ratios: TokenRatios, registry: LimitsRegistry, counter: TokenCounter, now: float
) -> list[dict[str, Any]]:
    """Each upstream's model some client taught a ratio of (`GET /admin/status`
    `token_ratios`), its `shared_row`, and when it was last updated."""
    rows = []
    for upstream, model in ratios.models():
        prior = counter.prior(registry.resolve(model).limits.tokenizer)
        shared = ratios.shared(upstream, model, prior)
        if shared is not None:
            rows.append(
                {
                    "upstream": upstream,
                    "model": model,
                    **shared_row(shared),
                    "updated_s_ago": round(max(0.0, now - shared.updated)),
                }
            )
    return rows


def ratio_report(
    resolved: ResolvedLimits, counter: TokenCounter, ratios: TokenRatios
) -> dict[str, Any]:
    """How brim scales its counts for the model: the tokenizer's prior, and what the clients of
    each upstream taught (`policies.ratios`): its shared ratio replaces the prior there for a
    client that has not settled its own."""
    limits = resolved.limits
    prior = counter.prior(limits.tokenizer)
    learned = []
    for upstream, model in ratios.models():
        shared = ratios.shared(upstream, model, prior) if model == limits.model else None
        if shared is not None:
            learned.append({"upstream": upstream, **shared_row(shared)})
    return {"prior": prior, "learned": learned}


def inspect_request(
    config: BrimConfig,
    registry: LimitsRegistry,
    counter: TokenCounter,
    body: Mapping[str, Any],
    *,
    model: str | None = None,
    user_agent: str = "",
    api: str | None = None,
    ratios: TokenRatios | None = None,
    upstream: str | None = None,
) -> dict[str, Any]:
    """What brim knows and would do about a request of any wire API (`api`, or guessed from the
    body's shape); Gemini bodies carry no model, so `model` names it. Counted at the shared
    ratio of the model on `upstream` (the one the request routes to: what a client that has
    not settled its own is counted at), if `ratios` has one, else at its tokenizer's prior."""
    wire = wire_named(api, body)
    model_id = model or body.get("model")
    if not isinstance(model_id, str) or not model_id:
        raise InspectError("the request names no model; pass --model")
    resolved = registry.resolve(model_id)
    client = match_client(config.clients, user_agent, CIMultiDict())
    budget = budget_for(
        resolved,
        requested_output(body),
        safety_margin=config.guard.safety_margin,
        cli_overhead=client[1].overhead if client else None,
    )
    tokenizer = resolved.limits.tokenizer
    prior = counter.prior(tokenizer)
    learned = None
    if ratios is not None and upstream is not None:
        learned = ratios.shared(upstream, resolved.limits.model, prior)
    ratio = prior if learned is None or learned.value is None else learned.value
    count = counter.request(wire, body, tokenizer, resolved.limits.model, ratio)
    raw = orjson.dumps(body)
    items = [item for item in wire.conversation(body) if isinstance(item, Mapping)]
    return {
        "limits": limits_report(resolved),
        "client": client[0] if client else None,
        "budget": {
            **asdict(budget),
            "margin_tokens": budget.margin_tokens,
            "requested_output": requested_output(body),
            "effective": budget.effective,
        },
        "tokens": {
            "messages": [
                {
                    "index": i,
                    "role": wire.dialect.role(item) or item.get("type"),
                    "tokens": n,
                    "tool_calls": len(wire.dialect.calls(item)),
                }
                for i, (item, n) in enumerate(zip(items, count.messages, strict=False))
            ],
            "tools": count.tools,
            "response_format": count.response_format,
            "priming": count.priming,
            "total": count.total,
            "upper_bound": counter.upper_bound(raw, body, tokenizer, wire, ratio),
            "ratio": {
                "value": round(ratio, 4),
                "learned_from": None
                if learned is None or learned.value is None
                else {
                    "upstream": upstream,
                    "clients": learned.owners,
                    "settled": learned.settled,
                    "replies": learned.replies,
                },
            },
        },
        "api": wire.name,
        "fits": budget.fits(count.total),
        "guard": guard_report(config, counter, body, resolved, budget.effective, wire, ratio),
    }


def guard_report(
    config: BrimConfig,
    counter: TokenCounter,
    body: Mapping[str, Any],
    resolved: ResolvedLimits,
    limit: int,
    wire: Wire,
    ratio: float | None = None,
) -> dict[str, Any]:
    """What the guard would do to this request, as `brim serve` is configured (offline: no
    provider count, no summaries), counting at `ratio`."""
    guard = config.guard
    outcome = guard_outcome(
        counter,
        build_policies(guard.policies, guard.policy_settings()),
        body,
        wire,
        resolved.limits.tokenizer,
        resolved.limits.model,
        limit,
        low_water=summary_low_water(guard.low_water, summarizing=config.summarize.enabled),
        repair=guard.repair_pairs,
        ratio=ratio,
    )
    return {
        "enabled": guard.enabled,
        "action": "forward unchanged"
        if not outcome.changed
        else ("compress" if outcome.fits else "refuse (400 context_length_exceeded)"),
        "tokens_in": outcome.tokens_in,
        "tokens_out": outcome.tokens_out,
        "target": outcome.target,
        "actions": outcome.actions,
        "tried": list(outcome.tried),
        "repairs": list(outcome.repairs),
        "records": [asdict(record) for record in outcome.records],
    }


def _n(value: int) -> str:
    return f"{value:,}"


def _taught(shown: Mapping[str, Any]) -> str:
    """Who taught a `shared_row`'s ratio, in words (how many clients, never which)."""
    clients, settled = shown["clients"], shown["settled"]
    replies = _plural(shown["replies"], "reply", "replies")
    if shown["ratio"] is None:
        return f"being learned from {_plural(clients, 'client', 'clients')} ({replies})"
    if clients == 1:
        return f"learned from 1 client ({replies})"
    of = f"{settled} of {clients}" if settled < clients else f"{clients}"
    return f"the median of {of} clients ({replies})"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def render_inspection(report: Mapping[str, Any], source: str) -> str:
    limits, budget, tokens = report["limits"], report["budget"], report["tokens"]
    sources = limits["sources"]
    tokenizer = limits["tokenizer"]
    ratio, learned = tokens["ratio"]["value"], tokens["ratio"]["learned_from"]
    encoding = "o200k_base" if tokenizer == "claude" else tokenizer
    if learned:
        tokenizer += (
            f" ({encoding} × {ratio:g}, {_taught({**learned, 'ratio': ratio})}"
            f" of upstream {learned['upstream']})"
        )
    elif ratio != 1:
        tokenizer += f" ({encoding} × {ratio:g}, an estimate)"
    cli = f", CLI {limits['cli']}" if limits["cli"] else ""
    counts = "yes" if limits["output_counts_against_window"] else "no"
    asks = budget["requested_output"]
    rule = report["client"]
    lines = [
        f"request   {source} ({report['api']})",
        f"model     {limits['model']}  →  {limits['normalised']}  "
        f"(provider {limits['provider']}{cli})",
        f"limits    window {_n(limits['context_window'])} [{sources['context_window']}]"
        f" · max output {_n(limits['max_output'])} [{sources['max_output']}]"
        f" · output counts against the window: {counts}",
        f"tokenizer {tokenizer} [{sources['tokenizer']}]",
        "",
        "budget",
        f"  context window        {_n(budget['context_window']):>12}",
        f"  − reserved output     {_n(budget['reserved_output']):>12}"
        + (f"   (request asks {_n(asks)})" if asks else ""),
        f"  − CLI overhead        {_n(budget['cli_overhead']):>12}"
        + (f"   (client rule {rule})" if rule else ""),
        f"  − safety margin {budget['safety_margin']:>4.0%}  {_n(budget['margin_tokens']):>12}",
        f"  = effective           {_n(budget['effective']):>12}",
        "",
        "tokens",
        "  #     role        tokens",
    ]
    for item in tokens["messages"]:
        calls = f"   (tool calls: {item['tool_calls']})" if item["tool_calls"] else ""
        lines.append(f"  {item['index']:<5} {item['role']!s:<10} {_n(item['tokens']):>8}{calls}")
    bound = _n(tokens["upper_bound"])
    lines += [
        f"  tool definitions {_n(tokens['tools']):>12}",
        f"  response format  {_n(tokens['response_format']):>12}",
        f"  reply priming    {_n(tokens['priming']):>12}",
        f"  total            {_n(tokens['total']):>12}   (free upper bound {bound})",
        "",
    ]
    guard = report["guard"]
    lines += [
        f"guard     {guard['action']}"
        + ("" if guard["enabled"] else "  (but [guard] enabled = false: brim would forward it)"),
        f"  {_n(guard['tokens_in'])} → {_n(guard['tokens_out'])} tokens"
        f" (target {_n(guard['target'])}): {guard['actions']}",
    ]
    for repair in guard["repairs"]:
        lines.append(f"  repair: {repair}")
    for record in guard["records"]:
        where = f"message {record['index']}" if record["index"] >= 0 else "new message"
        lines.append(
            f"  {record['policy']:<20} {record['action']:<10} {where:<12}"
            f" {_n(record['tokens_before']):>8} → {_n(record['tokens_after'])}"
        )
    lines.append("")
    effective, total = budget["effective"], tokens["total"]
    if report["fits"]:
        share = f"{total / effective:.1%}" if effective else "-"
        spare = _n(effective - total)
        lines.append(f"fits: yes — {_n(total)} of {_n(effective)} ({share}), {spare} to spare")
    else:
        lines.append(f"fits: NO — {_n(total)} exceeds {_n(effective)} by {_n(total - effective)}")
    return "\n".join(lines)


def model_rows(
    registry: LimitsRegistry,
    pattern: str | None,
    counter: TokenCounter | None = None,
    ratios: TokenRatios | None = None,
) -> list[dict[str, Any]]:
    """Resolved limits of the configured and built-in ids, or of every known id matching
    `pattern` (a glob; a plain word matches anywhere in the id), each with the ratio brim
    counts it at (`ratio_report`) and, first, the ids `ratios` learned a ratio for."""
    counter = counter or TokenCounter()
    ratios = ratios or TokenRatios()
    measured = sorted({model for _, model in ratios.models()})
    if pattern is None:
        ids = [*measured, *registry.configured, *sorted(registry.learned), *model_table.CLI_MODELS]
    else:
        glob = pattern.lower() if any(c in pattern for c in "*?[") else f"*{pattern.lower()}*"
        known = [*measured, *registry.known_ids()]
        ids = [i for i in known if fnmatch.fnmatchcase(i, glob)]
        if not ids:
            ids = [pattern]  # not a known id: show how it resolves
    rows = []
    for model_id in dict.fromkeys(ids):
        resolved = registry.resolve(model_id)
        rows.append(
            {**limits_report(resolved), "token_ratio": ratio_report(resolved, counter, ratios)}
        )
    return rows


def render_models(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'model':<44} {'window':>10} {'max out':>9}  {'out/win':<7} {'tokenizer':<12} "
        f"{'ratio':<7} sources"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        sources = row["sources"]
        overhead = f"; CLI overhead {_n(row['cli_overhead'])}" if row["cli_overhead"] else ""
        ratio = row["token_ratio"]
        learned = ratio["learned"]
        shown = next((each["ratio"] for each in learned if each["ratio"]), ratio["prior"])
        how = "; ".join(
            ("" if each["ratio"] is None else f"×{each['ratio']:g} ")
            + f"{_taught(each)} of {each['upstream']}"
            for each in learned
        )
        lines.append(
            f"{row['model']:<44} {_n(row['context_window']):>10} {_n(row['max_output']):>9}  "
            f"{'yes' if row['output_counts_against_window'] else 'no':<7} {row['tokenizer']:<12} "
            f"{'×' + format(shown, '.3g'):<7} "
            f"window: {sources['context_window']}, max out: {sources['max_output']}, "
            f"ratio: {how or 'prior'}{overhead}"
        )
    return "\n".join(lines)
