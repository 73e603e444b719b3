"""The `x-brim-*` headers of a reply (or error), all rendered here from the facts the stages
recorded on the request's report — never written by the stages themselves."""

from __future__ import annotations

from collections import Counter

from brim.adapters.exchange import RequestReport
from brim.policies.compress import SHORT


def actions(report: RequestReport) -> str:
    """`prune:3,clear:12,evict:4,fallback:1` — what was done to the request, in order; `none`."""
    if report.outcome is None and not report.retry_outcomes and not report.fallbacks:
        return "none"  # the common case: nothing was done
    done: Counter[str] = Counter()
    for outcome in report.outcomes:
        for record in outcome.records:
            if record.action != "notice":
                done[SHORT.get(record.policy, record.policy)] += 1
        if outcome.repairs:
            done["repair"] += len(outcome.repairs)
    if report.fallbacks:
        done["fallback"] = len(report.fallbacks)
    return ",".join(f"{name}:{n}" for name, n in done.items()) or "none"


async def brim_headers(
    report: RequestReport, *, warn_at: float, wait: bool = True
) -> dict[str, str]:
    """tokens in (as received) and out (as sent), budget, actions, retries, and how much of the
    context window the request used (with a warning past `warn_at`). A count still running
    beside the upstream call is waited for only with `wait` (a streamed reply's headers do not
    wait: they carry the byte bound unless the count is done)."""
    context = report.context
    if context is None:  # answered before limits were resolved (e.g. the loop breaker)
        return {}
    tokens = context.tokens
    if report.outcome is not None:
        received = report.outcome.tokens_in
    elif wait and tokens.pending is not None:
        received = await tokens.resolve()
    else:  # with nothing pending, what `resolve` would answer
        received = tokens.known()
    sent = report.tokens_sent(received)
    headers = {
        "x-brim-tokens-in": str(received),
        "x-brim-tokens-out": str(sent),
        "x-brim-budget": str(context.budget.effective),
        "x-brim-actions": actions(report),
        "x-brim-retries": str(report.retries),
    }
    if report.restored:  # originals the model fetched back in hidden rounds (`brim_restore`)
        headers["x-brim-restored"] = str(len(report.restored))
    window = context.limits.limits.context_window
    usage = sent / window
    headers["x-brim-context-usage"] = f"{usage:.3f}"
    if usage >= warn_at:
        headers["x-brim-context-warning"] = (
            f"{usage:.0%} of the {window}-token context window is in use"
        )
    return headers
