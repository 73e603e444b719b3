"""The outermost stage: one span per request (OpenTelemetry GenAI conventions), metrics, the
audit line, the status board, and the context-usage headers on every reply.

It reads what the other stages wrote into `exchange.report`; it never sees keys or, unless
`[telemetry] capture_content` is on, message bodies.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from multidict import CIMultiDict
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from adapters.base import UpstreamResponse
from adapters.errors import BrimError, ContextTooLarge, UpstreamError
from adapters.exchange import Exchange, RequestReport
from middleware.audit import AuditLog
from middleware.base import CallNext
from middleware.telemetry import StatusBoard, Telemetry

log = logging.getLogger("brim.observe")
PROPAGATOR = TraceContextTextMapPropagator()
CONTENT_LIMIT = 64 * 1024


def _usage(payload: Any, into: dict[str, int]) -> None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict) and isinstance(payload, dict):
        message = payload.get("message")  # Anthropic's message_start
        usage = message.get("usage") if isinstance(message, dict) else None
    if not isinstance(usage, dict):
        return
    for theirs, ours in (
        ("prompt_tokens", "input"),
        ("input_tokens", "input"),
        ("completion_tokens", "output"),
        ("output_tokens", "output"),
    ):
        value = usage.get(theirs)
        if isinstance(value, int) and value > 0:
            into[ours] = value


def usage_from_events(chunk: bytes, into: dict[str, int]) -> None:
    if b'"usage"' not in chunk:
        return
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                _usage(orjson.loads(line[5:]), into)
            except orjson.JSONDecodeError:
                continue


class Observe:
    def __init__(
        self,
        telemetry: Telemetry,
        status: StatusBoard,
        audit: AuditLog | None = None,
        *,
        warn_at: float = 0.8,
    ) -> None:
        if not 0 < warn_at <= 1:
            raise ValueError(f"warn_at must be in (0, 1], not {warn_at}")
        self.telemetry = telemetry
        self.status = status
        self.audit = audit
        self.warn_at = warn_at

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        tracing = not isinstance(self.telemetry.tracer, trace.NoOpTracer)
        parent = PROPAGATOR.extract(carrier=dict(exchange.headers)) if tracing else None
        body = exchange.body or {}
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": exchange.api.split(".")[0],
            "gen_ai.request.model": exchange.model,
            "brim.request_id": exchange.request_id,
            "brim.route": exchange.api,
        }
        for field_name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(body.get(field_name), int):
                attributes["gen_ai.request.max_tokens"] = body[field_name]
        if self.telemetry.capture_content:
            content = orjson.dumps(body.get("messages", [])).decode()
            attributes["gen_ai.input.messages"] = content[:CONTENT_LIMIT]
        span = self.telemetry.tracer.start_span(
            f"chat {exchange.model}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent)) if tracing else None
        report = exchange.report
        try:
            reply = await call_next(exchange)
        except BrimError as error:
            outcome = "refused" if isinstance(error, ContextTooLarge) else "upstream_error"
            if isinstance(error, UpstreamError):
                _usage_from_body(error.body, report.usage)
            self._finish(span, exchange, report, outcome, error)
            raise
        except BaseException as error:
            self._finish(span, exchange, report, "error", error)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        outcome = self._outcome(report)
        reply = dataclasses.replace(reply, headers=self._usage_headers(reply, report))
        if reply.chunks is None:
            if reply.payload is not None:
                _usage(reply.payload, report.usage)
            else:
                _usage_from_body(reply.body or b"", report.usage)
            self._finish(span, exchange, report, outcome, None)
            return reply
        return dataclasses.replace(
            reply, chunks=self._watch(reply.chunks, span, exchange, report, outcome)
        )

    async def _watch(
        self,
        chunks: AsyncIterator[bytes],
        span: Span,
        exchange: Exchange,
        report: RequestReport,
        outcome: str,
    ) -> AsyncIterator[bytes]:
        error: BaseException | None = None
        try:
            async for chunk in chunks:
                usage_from_events(chunk, report.usage)
                yield chunk
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._finish(span, exchange, report, outcome if error is None else "error", error)

    @staticmethod
    def _outcome(report: RequestReport) -> str:
        if report.retries:
            return "retried"
        if report.outcome is not None and report.outcome.records:
            return "compressed"
        if report.outcome is not None and report.outcome.repairs:
            return "repaired"
        return "ok"

    def _usage_headers(self, reply: UpstreamResponse, report: RequestReport) -> CIMultiDict[str]:
        headers = CIMultiDict(reply.headers)
        context = report.context
        if context is None:
            return headers
        window = context.limits.limits.context_window
        sent = self._tokens_out(report)
        if sent is not None and window:
            usage = sent / window
            headers["x-brim-context-usage"] = f"{usage:.3f}"
            if usage >= self.warn_at:
                headers["x-brim-context-warning"] = (
                    f"{usage:.0%} of the {window}-token context window is in use"
                )
        return headers

    @staticmethod
    def _tokens_out(report: RequestReport) -> int | None:
        if report.retry_outcomes:
            return report.retry_outcomes[-1].tokens_out
        if report.outcome is not None:
            return report.outcome.tokens_out
        if report.context is not None:
            tokens = report.context.tokens
            return tokens.exact if tokens.exact is not None else tokens.upper_bound
        return None

    def _finish(
        self,
        span: Span,
        exchange: Exchange,
        report: RequestReport,
        outcome: str,
        error: BaseException | None,
    ) -> None:
        try:
            self._publish(span, exchange, report, outcome, error)
        except Exception:  # telemetry must never break a request
            log.exception("could not publish telemetry for request %s", exchange.request_id)
        finally:
            span.end()

    def _publish(
        self,
        span: Span,
        exchange: Exchange,
        report: RequestReport,
        outcome: str,
        error: BaseException | None,
    ) -> None:
        telemetry = self.telemetry
        context = report.context
        tokens_out = self._tokens_out(report)
        tokens_in = report.outcome.tokens_in if report.outcome else tokens_out
        attributes: dict[str, Any] = {
            "brim.outcome": outcome,
            "brim.retries": report.retries,
            "brim.upstream_calls": report.upstream_calls,
        }
        if context is not None:
            attributes["brim.budget"] = context.budget.effective()
            attributes["brim.context_window"] = context.limits.limits.context_window
            if not context.fits:
                span.add_event(
                    "brim.overflow.predicted",
                    {"brim.tokens": tokens_in or 0, "brim.budget": context.budget.effective()},
                )
        if tokens_in is not None:
            attributes["brim.tokens.in"] = tokens_in
        if tokens_out is not None:
            attributes["brim.tokens.out"] = tokens_out
        outcomes = [o for o in (report.outcome, *report.retry_outcomes) if o is not None]
        actions = [o.actions for o in outcomes if o.actions != "none"]
        attributes["brim.actions"] = ",".join(actions) or "none"
        removed: dict[str, int] = defaultdict(int)
        for stage_outcome in outcomes:
            by_policy: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
            for record in stage_outcome.records:
                totals = by_policy[record.policy]
                totals[0] += record.tokens_before
                totals[1] += record.tokens_after
                totals[2] += 1
            for policy, (before, after, items) in by_policy.items():
                span.add_event(
                    "brim.compressed",
                    {
                        "brim.policy": policy,
                        "brim.tokens.before": before,
                        "brim.tokens.after": after,
                        "brim.items": items,
                    },
                )
                removed[policy] += max(0, before - after)
            for record in stage_outcome.records:
                if record.policy == "summarize":
                    span.add_event(
                        "brim.summarized",
                        {
                            "brim.summary": record.detail,
                            "brim.tokens.before": record.tokens_before,
                            "brim.tokens.after": record.tokens_after,
                            "brim.archive_key": record.archive_key or "",
                        },
                    )
            if stage_outcome.repairs:
                span.add_event(
                    "brim.pairs.repaired",
                    {"brim.repairs": list(stage_outcome.repairs)},
                )
        for message in report.overflow_messages:
            span.add_event("brim.overflow.upstream", {"brim.provider_message": message[:500]})
        for attempt in range(1, report.retries + 1):
            span.add_event("brim.retry", {"brim.attempt": attempt})
        if "input" in report.usage:
            attributes["gen_ai.usage.input_tokens"] = report.usage["input"]
        if "output" in report.usage:
            attributes["gen_ai.usage.output_tokens"] = report.usage["output"]
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            if isinstance(error, BrimError):
                span.set_attribute("error.type", error.code or type(error).__name__)

        labels = {"route": exchange.api, "model": exchange.model, "outcome": outcome}
        telemetry.requests.add(1, labels)
        model = {"model": exchange.model}
        if report.outcome is not None and report.outcome.records and context and not context.fits:
            telemetry.prevented.add(1, model)
        if report.retries:
            telemetry.retries.add(report.retries, model)
            if error is None:
                telemetry.survived.add(1, model)
        for policy, tokens in removed.items():
            telemetry.tokens_removed.add(tokens, {"policy": policy, "model": exchange.model})
        total_ms = (time.perf_counter() - report.started) * 1000
        upstream_ms = report.upstream_seconds * 1000
        telemetry.upstream_latency.record(upstream_ms, model)
        telemetry.added_latency.record(max(0.0, total_ms - upstream_ms), model)

        self.status.record(exchange.model, outcome, tokens_in or 0, tokens_out or 0)
        eventful = outcome in ("compressed", "repaired", "retried", "refused") or (
            context is not None and not context.fits
        )
        if eventful:
            trace_id = format(span.get_span_context().trace_id, "032x")
            event = {
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "request_id": exchange.request_id,
                "trace_id": trace_id,
                "client": exchange.user_agent,
                "route": exchange.api,
                "model": exchange.model,
                "outcome": outcome,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "budget": context.budget.effective() if context else None,
                "actions": attributes["brim.actions"],
                "retries": report.retries,
                "fallbacks": report.fallbacks,
                "archive_keys": report.archive_keys,
            }
            self.status.recent.append(event)
            if self.audit is not None:
                self.audit.write(event)


def _usage_from_body(body: bytes, into: dict[str, int]) -> None:
    if b'"usage"' not in body[:65536] and b'"usage"' not in body[-4096:]:
        return
    try:
        _usage(orjson.loads(body), into)
    except orjson.JSONDecodeError:
        usage_from_events(body, into)
