"""The outermost stage: one span per request (OpenTelemetry GenAI conventions), metrics, the
audit line, the status board and the request's log line.

It reads what the other stages wrote into `exchange.report`; it never sees keys or, unless
`[telemetry] capture_content` is on, message bodies. The log line (`brim.request`) has neither,
ever: it is made of counts, names and the request id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import Token
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_SYSTEM_INSTRUCTIONS,
    GEN_AI_TOKEN_TYPE,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GenAiProviderNameValues,
    GenAiTokenTypeValues,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from brim.adapters.adapter import Reported, UpstreamResponse
from brim.adapters.errors import (
    BrimError,
    ContextTooLarge,
    RateLimitExceeded,
    RepeatedFailure,
    UpstreamError,
)
from brim.adapters.exchange import Exchange, RequestReport
from brim.adapters.upstream_config import UpstreamConfig
from brim.middleware.services.audit import AuditLog
from brim.middleware.services.instruments import Telemetry, bind
from brim.middleware.services.reply_headers import actions
from brim.middleware.services.status_board import StatusBoard, client_product
from brim.middleware.services.store import PREFIX_DIGITS, normalize_key
from brim.middleware.services.usage import StreamUsage, body_reported, whole_reported
from brim.middleware.stage import CallNext
from brim.policies.budget import requested_output
from brim.policies.compress import Outcome
from brim.policies.limits import LimitSource

if TYPE_CHECKING:
    from brim.middleware.pipeline import PipelineConfig, Services

log = logging.getLogger("brim.observe")
# One line per request: at INFO for a request brim changed, retried or refused, at DEBUG for the
# others. Its `extra` fields are what `proxy.logs.JsonFormatter` writes as keys.
request_log = logging.getLogger("brim.request")
REQUEST_LINE = (
    "%s client=%s %s → %s / %s tokens actions=%s retries=%d restored=%d +%.1f ms request_id=%s"
)
PLAIN_OUTCOMES = frozenset({"ok", "compressed", "repaired", "retried"})
PROPAGATOR = TraceContextTextMapPropagator()
CONTENT_LIMIT = 64 * 1024  # characters of captured content per attribute
# A request's count, upstream latency and added latency, each bound to its series.
BoundSeries = tuple[Callable[[float], None], Callable[[float], None], Callable[[float], None]]
BOUND_SERIES = 4096  # metric series an `Observe` keeps bound (labels are bounded: a backstop)
# The GenAI client metrics' series of a request: its duration, its input and its output tokens,
# by (operation, provider, request model label, response model label, error type).
GenAiKey = tuple[str, str, str, str | None, str | None]


# The provider, as the GenAI conventions name it (`gen_ai.provider.name`), by the provider name
# brim's limits resolve to (litellm's provider names, and brim's own).
PROVIDERS = {
    "openai": GenAiProviderNameValues.OPENAI.value,
    "text-completion-openai": GenAiProviderNameValues.OPENAI.value,
    "azure": GenAiProviderNameValues.AZURE_AI_OPENAI.value,
    "azure_ai": GenAiProviderNameValues.AZURE_AI_INFERENCE.value,
    "anthropic": GenAiProviderNameValues.ANTHROPIC.value,
    "gemini": GenAiProviderNameValues.GCP_GEMINI.value,
    "google": GenAiProviderNameValues.GCP_GEMINI.value,
    "vertex_ai": GenAiProviderNameValues.GCP_VERTEX_AI.value,
    "bedrock": GenAiProviderNameValues.AWS_BEDROCK.value,
    "cohere": GenAiProviderNameValues.COHERE.value,
    "mistral": GenAiProviderNameValues.MISTRAL_AI.value,
    "groq": GenAiProviderNameValues.GROQ.value,
    "deepseek": GenAiProviderNameValues.DEEPSEEK.value,
    "xai": GenAiProviderNameValues.X_AI.value,
    "perplexity": GenAiProviderNameValues.PERPLEXITY.value,
    "watsonx": GenAiProviderNameValues.IBM_WATSONX_AI.value,
}


def provider_name(model_provider: str, upstream: UpstreamConfig | None) -> str:
    """`gen_ai.provider.name`: the provider that served the request — an Anthropic or Gemini
    upstream's own; behind an OpenAI-compatible or litellm upstream, the model's provider where
    brim knows it (else OpenAI, or litellm's provider prefix). The conventions' value where
    they have one, else brim's own name of it."""
    provider = model_provider
    if upstream is not None and upstream.api in ("anthropic", "gemini"):
        provider = upstream.api
    elif provider == "unknown" and upstream is not None:
        prefix = upstream.model_prefix.split("/")[0]
        provider = "openai" if upstream.api == "openai" else (prefix or upstream.api)
    return PROVIDERS.get(provider, provider)


def bounded_json(value: list[Any], limit: int) -> str:
    """`value` as JSON of at most `limit` characters, and always valid JSON: long texts are
    shortened first (with a marker), then the oldest items dropped."""
    text = orjson.dumps(value).decode()
    if len(text) <= limit:
        return text
    for longest in (4096, 1024, 256, 64):
        shortened = _shorten(value, longest)
        text = orjson.dumps(shortened).decode()
        if len(text) <= limit:
            return text
    items = list(shortened)
    while items and len(text) > limit:
        items.pop(0)
        text = orjson.dumps([{"dropped": "earlier items"}, *items]).decode()
    return text if len(text) <= limit else "[]"


def _shorten(value: Any, longest: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= longest else value[:longest] + f"… [{len(value)} chars]"
    if isinstance(value, dict):
        return {key: _shorten(item, longest) for key, item in value.items()}
    if isinstance(value, list):
        return [_shorten(item, longest) for item in value]
    return value


def restore_label(key: str) -> str:
    """A key the model passed to `brim_restore`, as telemetry and the audit log name it:
    `sha256:<16 hex>`, or `malformed` (model input: never repeated as it came)."""
    digits = normalize_key(key)
    return "malformed" if digits is None else f"sha256:{digits[:PREFIX_DIGITS]}"


def _recording(span: Span) -> bool:
    """Whether `span` records (a tracing exporter, and this request sampled). Without tracing
    every span is `INVALID_SPAN`: nothing to ask it (nor, in `_finish`, to end)."""
    return span is not INVALID_SPAN and span.is_recording()


def _report(found: Reported, report: RequestReport) -> None:
    """What the reply said of itself, onto the request's report."""
    if found.usage is not None:
        report.usage = report.usage.merged(found.usage)
    if found.model is not None:
        report.response_model = found.model


def error_type(error: BaseException) -> str:
    """`error.type` of a request that failed: brim's code for the error where it has one
    (`context_length_exceeded`, `upstream_timeout`, …), else the exception's class (`RateLimited`,
    `CancelledError`): a small, fixed set of values, never text from a client or a provider."""
    code = error.code if isinstance(error, BrimError) else None
    return code or type(error).__name__


class Observe:
    @classmethod
    def from_config(cls, config: PipelineConfig, services: Services) -> Observe:
        return cls(
            services.telemetry,
            services.status,
            services.audit,
            upstreams=services.upstreams.configs,
        )

    def __init__(
        self,
        telemetry: Telemetry,
        status: StatusBoard,
        audit: AuditLog | None = None,
        *,
        upstreams: Mapping[str, UpstreamConfig] | None = None,
    ) -> None:
        self.telemetry = telemetry
        self.status = status
        self.audit = audit
        self.upstreams = dict(upstreams or {})
        self.tracing = not isinstance(telemetry.tracer, trace.NoOpTracer)
        # the metric series of each (route, model label, outcome), found once (`_bind`)
        self._bound: dict[tuple[str, str, str], BoundSeries] = {}
        self._genai: dict[GenAiKey, BoundSeries] = {}  # likewise (`_bind_genai`)

    async def __call__(self, exchange: Exchange, call_next: CallNext) -> UpstreamResponse:
        if self.tracing:
            span, token = self._open_span(exchange)
        else:  # no tracing exporter: the no-op span, as a no-op tracer would start
            span, token = INVALID_SPAN, None
        try:
            reply = await call_next(exchange)
            answered = time.perf_counter()  # a stream's reading time is the provider's, not brim's
        except BrimError as error:
            outcome = (
                "refused"
                if isinstance(error, ContextTooLarge)
                else "blocked"  # by the loop guard
                if isinstance(error, RepeatedFailure)
                else "rate_limited"  # by the client's requests or tokens per minute
                if isinstance(error, RateLimitExceeded)
                else "upstream_error"
            )
            failed = time.perf_counter()
            self._finish_soon(span, exchange, outcome, error, failed, failed)
            raise
        except BaseException as error:
            failed = time.perf_counter()
            self._finish_soon(span, exchange, "error", error, failed, failed)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        outcome = self._outcome(exchange.report)
        if reply.chunks is None:
            self._finish_soon(span, exchange, outcome, None, answered, answered, reply)
            return reply
        # A stream's usage: as a stage inside read it (`LearnRatios`), else read here.
        reported, watching = reply.reported, None
        if reported is None:
            watching = StreamUsage(exchange.wire)
            reported = watching.reported
        return dataclasses.replace(
            reply,
            chunks=self._watch(reply.chunks, span, exchange, outcome, answered, watching, reported),
            reported=reported,
        )

    def _open_span(self, exchange: Exchange) -> tuple[Span, Token[Context]]:
        """The request's span, as the current one (the token detaches it), under the client's
        trace context where it sent one."""
        parent = PROPAGATOR.extract(carrier=dict(exchange.headers))
        body = exchange.body or {}
        wire = exchange.wire
        attributes: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: wire.operation,
            GEN_AI_REQUEST_MODEL: exchange.model,
            "brim.request_id": exchange.request_id,
            "brim.route": exchange.api,
        }
        output_limit = requested_output(body)
        if output_limit is not None:
            attributes[GEN_AI_REQUEST_MAX_TOKENS] = output_limit
        if self.telemetry.capture_content:
            messages = wire.genai_messages(wire.conversation(body))
            attributes[GEN_AI_INPUT_MESSAGES] = bounded_json(messages, CONTENT_LIMIT)
            if system := wire.system_instructions(body):
                attributes[GEN_AI_SYSTEM_INSTRUCTIONS] = bounded_json(system, CONTENT_LIMIT)
        span = self.telemetry.tracer.start_span(
            f"{wire.operation} {exchange.model}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )
        return span, otel_context.attach(trace.set_span_in_context(span, parent))

    async def _watch(
        self,
        chunks: AsyncIterator[bytes],
        span: Span,
        exchange: Exchange,
        outcome: str,
        answered: float,
        watching: StreamUsage | None,
        reported: Reported,
    ) -> AsyncIterator[bytes]:
        """The stream, as it passes: what it says of itself read by `watching` (None: a stage
        inside reads it into `reported`)."""
        error: BaseException | None = None
        try:
            async for chunk in chunks:
                if watching is not None:
                    watching.feed(chunk)
                yield chunk
        except BaseException as exc:
            error = exc
            raise
        finally:
            outcome = outcome if error is None else "error"
            ended = time.perf_counter()
            self._finish_soon(span, exchange, outcome, error, answered, ended, None, reported)

    @staticmethod
    def _outcome(report: RequestReport) -> str:
        if report.retries:
            return "retried"
        if report.outcome is not None and report.outcome.records:
            return "compressed"
        if report.outcome is not None and report.outcome.repairs:
            return "repaired"
        return "ok"

    def _finish_soon(
        self,
        span: Span,
        exchange: Exchange,
        outcome: str,
        error: BaseException | None,
        answered: float,
        ended: float,
        reply: UpstreamResponse | None = None,
        reported: Reported | None = None,
    ) -> None:
        """Publish the request once its reply (or error) is on its way: on the event loop's next
        turn, so the client's reply is written first (the handler runs on to the write without
        giving the loop a turn; the loop then runs this before anything it reads afterwards,
        such as the client's next request). Where no loop runs (a stream closed by the garbage
        collector), at once."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._finish(span, exchange, outcome, error, answered, ended, reply, reported)
        else:
            loop.call_soon(
                self._finish, span, exchange, outcome, error, answered, ended, reply, reported
            )

    def _finish(
        self,
        span: Span,
        exchange: Exchange,
        outcome: str,
        error: BaseException | None,
        answered: float,
        ended: float,
        reply: UpstreamResponse | None,
        reported: Reported | None,
    ) -> None:
        """Publish the request, with what a whole `reply` says of itself (its usage, the model
        that answered: read once, `middleware.services.usage`), or a stream's (`reported`, read as
        it passed). `answered`: when the pipeline returned the reply (its headers, for a stream)
        or the error; `ended`: when the reply's last byte went (or the error)."""
        report = exchange.report
        recording = _recording(span)
        try:
            if reply is not None:
                _report(whole_reported(exchange.wire, reply), report)
            elif reported is not None:
                _report(reported, report)
            elif recording and isinstance(error, UpstreamError):
                _report(body_reported(exchange.wire, error.body), report)
            self._publish(span, recording, exchange, report, outcome, error, answered, ended)
        except Exception:  # telemetry must never break a request
            log.exception("could not publish telemetry for request %s", exchange.request_id)
        finally:
            if span is not INVALID_SPAN:
                span.end()

    def _publish(
        self,
        span: Span,
        recording: bool,
        exchange: Exchange,
        report: RequestReport,
        outcome: str,
        error: BaseException | None,
        answered: float,
        ended: float,
    ) -> None:
        context = report.context
        tokens_in = report.tokens_received()
        tokens_out = report.tokens_sent(tokens_in)
        done = actions(report)
        # per stage outcome: policy → (tokens before, tokens after, items)
        compressed: list[dict[str, list[int]]] = []
        removed: dict[str, int] = {}
        if report.outcome is not None or report.retry_outcomes:  # cut or compressed
            compressed = [_by_policy(stage_outcome) for stage_outcome in report.outcomes]
            for by_policy in compressed:
                for policy, (before, after, _) in by_policy.items():
                    removed[policy] = removed.get(policy, 0) + max(0, before - after)
        # the model's brim_restore calls brim answered (`middleware.stages.restore`)
        restores: list[tuple[str, bool]] = []
        if report.restored or report.restore_missing:
            restores += [(restore_label(key), True) for key in report.restored]
            restores += [(restore_label(key), False) for key in report.restore_missing]
        if recording:  # a tracing exporter, and this request sampled
            self._describe(span, exchange, report, outcome, error, done, compressed, restores)

        # Model ids are client input: bounded labels, so a flood of names cannot grow metrics.
        fits = context is None or context.fits
        known = context is not None and context.limits.source is not LimitSource.DEFAULT
        prevented = bool(report.outcome is not None and report.outcome.records and not fits)
        survived = bool(report.retries) and error is None
        overflows = [] if outcome == "ok" else _overflows(prevented, survived, outcome)
        label = self.status.record(
            exchange.model,
            outcome,
            tokens_in or 0,
            tokens_out or 0,
            known=known,
            client=(context.client if context else None) or client_product(exchange.user_agent),
            window=context.limits.limits.context_window if context else None,
            overflows=overflows,
            removed=removed,
        )
        series = self._bound.get((exchange.api, label, outcome))
        if series is None:
            series = self._bind(exchange.api, label, outcome)
        count_request, record_upstream, record_added = series
        count_request(1)
        added_s = max(0.0, answered - report.started - report.upstream_seconds)
        record_upstream(report.upstream_seconds)
        record_added(added_s)
        added_ms = added_s * 1000
        self._record_genai(exchange, report, label, error, ended)
        if prevented or report.retries or removed or report.restore_offered or restores:
            self._count_changes(report, label, prevented, survived, removed, restores)

        changed = done != "none" or report.retries or report.restored
        refused = outcome in ("refused", "blocked", "rate_limited")  # brim's own answers
        level = logging.INFO if changed or refused else logging.DEBUG
        if request_log.isEnabledFor(level):  # nothing below is done when the level is off
            log_request(level, exchange, outcome, added_ms, done)

        eventful = (
            not fits
            or bool(report.fallbacks)
            or outcome in ("compressed", "repaired", "retried", "refused")
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
                "budget": context.budget.effective if context else None,
                "actions": done,
                "retries": report.retries,
                "fallbacks": list(report.fallbacks),
                "archive_keys": list(report.archive_keys),
                "restored": [key for key, found in restores if found],
                "restore_missing": [key for key, found in restores if not found],
            }
            self.status.event(event)
            if self.audit is not None:
                self.audit.write(event)

    def _bind(self, route: str, label: str, outcome: str) -> BoundSeries:
        """The metric series a request of `route`, model `label` and `outcome` counts in."""
        telemetry = self.telemetry
        if len(self._bound) >= BOUND_SERIES:
            self._bound.clear()
        model = {"model": label}
        series = self._bound[(route, label, outcome)] = (
            telemetry.requests.bind({"route": route, "model": label, "outcome": outcome}),
            bind(telemetry.upstream_latency, model),
            bind(telemetry.added_latency, model),
        )
        return series

    def _record_genai(
        self,
        exchange: Exchange,
        report: RequestReport,
        label: str,
        error: BaseException | None,
        ended: float,
    ) -> None:
        """The GenAI conventions' client metrics of a request: how long it took, to its reply's
        last byte, and the input and output tokens its provider reported. Model names are
        labelled as in every metric: `label` is the request's; the reply's own, a provider's
        text, has labels of its own (`StatusBoard.response_labels`)."""
        context = report.context
        provider = provider_name(
            context.limits.limits.provider if context is not None else "unknown",
            self.upstreams.get(exchange.upstream),
        )
        answered_by = report.response_model
        response = (
            None
            if answered_by is None
            else label
            if answered_by == exchange.model
            else self.status.response_labels(answered_by)
        )
        key = (
            exchange.wire.operation,
            provider,
            label,
            response,
            None if error is None else error_type(error),
        )
        series = self._genai.get(key)
        if series is None:
            series = self._bind_genai(key)
        record_duration, record_input, record_output = series
        record_duration(max(0.0, ended - report.started))
        usage = report.usage
        if usage.input is not None:
            record_input(usage.input)
        if usage.output is not None:
            record_output(usage.output)

    def _bind_genai(self, key: GenAiKey) -> BoundSeries:
        telemetry = self.telemetry
        if len(self._genai) >= BOUND_SERIES:
            self._genai.clear()
        operation, provider, label, response, failure = key
        attributes = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: provider,
            GEN_AI_REQUEST_MODEL: label,
        }
        if response is not None:
            attributes[GEN_AI_RESPONSE_MODEL] = response
        usage = dict(attributes)  # the token metric has no error.type
        if failure is not None:
            attributes[ERROR_TYPE] = failure
        input_type = GenAiTokenTypeValues.INPUT.value
        output_type = GenAiTokenTypeValues.COMPLETION.value  # "output"
        series = self._genai[key] = (
            bind(telemetry.operation_duration, attributes),
            bind(telemetry.token_usage, {**usage, GEN_AI_TOKEN_TYPE: input_type}),
            bind(telemetry.token_usage, {**usage, GEN_AI_TOKEN_TYPE: output_type}),
        )
        return series

    def _count_changes(
        self,
        report: RequestReport,
        label: str,
        prevented: bool,
        survived: bool,
        removed: Mapping[str, int],
        restores: list[tuple[str, bool]],
    ) -> None:
        """The counters of what brim did to a request it changed: overflows prevented and
        survived, retries, tokens removed by policy, brim_restore offered and answered."""
        telemetry = self.telemetry
        model = {"model": label}
        if prevented:
            telemetry.prevented.add(1, model)
        if report.retries:
            telemetry.retries.add(report.retries, model)
            if survived:
                telemetry.survived.add(1, model)
        for policy, tokens in removed.items():
            telemetry.tokens_removed.add(tokens, {"policy": policy, "model": label})
        if report.restore_offered:
            telemetry.restores_offered.add(1, model)
        if restores:
            for found in (True, False):
                if count := sum(1 for _, was in restores if was is found):
                    telemetry.restores.add(count, {"model": label, "found": str(found).lower()})
        self.status.record_restores(
            label,
            offered=report.restore_offered,
            found=len(report.restored),
            missing=len(report.restore_missing),
        )

    def _describe(
        self,
        span: Span,
        exchange: Exchange,
        report: RequestReport,
        outcome: str,
        error: BaseException | None,
        done: str,
        compressed: list[dict[str, list[int]]],
        restores: list[tuple[str, bool]],
    ) -> None:
        """The span's attributes and events (of a span that records: with a tracing exporter)."""
        context = report.context
        tokens_in = report.tokens_received()
        tokens_out = report.tokens_sent(tokens_in)
        attributes: dict[str, Any] = {
            "brim.outcome": outcome,
            "brim.retries": report.retries,
            "brim.upstream_calls": report.upstream_calls,
        }
        if context is not None:
            attributes["brim.budget"] = context.budget.effective
            attributes["brim.context_window"] = context.limits.limits.context_window
            if not context.fits:
                span.add_event(
                    "brim.overflow.predicted",
                    {"brim.tokens": tokens_in or 0, "brim.budget": context.budget.effective},
                )
        if tokens_in is not None:
            attributes["brim.tokens.in"] = tokens_in
        if tokens_out is not None:
            attributes["brim.tokens.out"] = tokens_out
        attributes["brim.actions"] = done
        if report.outcome is not None and report.outcome.carried:
            # the previous turn's compressed request, then what is new (`policies.carry`)
            attributes["brim.carried_forward"] = True
        attributes["brim.restore_offered"] = report.restore_offered
        for stage_outcome, by_policy in zip(report.outcomes, compressed, strict=True):
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
        for key, found in restores:
            span.add_event("brim.restore", {"brim.restore.key": key, "brim.restore.found": found})
        for model in report.fallbacks:
            span.add_event("brim.fallback", {GEN_AI_REQUEST_MODEL: model})
        if report.withheld:  # steps not taken: the client's credential may not go there
            attributes["brim.credentials_withheld"] = [
                f"{w.step}:{w.model}@{w.upstream}" for w in report.withheld
            ]
            for withheld in report.withheld:
                span.add_event(
                    "brim.credential.withheld",
                    {
                        "brim.step": withheld.step,
                        GEN_AI_REQUEST_MODEL: withheld.model,
                        "brim.upstream": withheld.upstream,
                    },
                )
        if context is not None:
            upstream = self.upstreams.get(exchange.upstream)
            attributes[GEN_AI_PROVIDER_NAME] = provider_name(
                context.limits.limits.provider, upstream
            )
        usage = report.usage
        for name, value in (
            (GEN_AI_USAGE_INPUT_TOKENS, usage.input),
            (GEN_AI_USAGE_OUTPUT_TOKENS, usage.output),
            (GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, usage.cached_input),
        ):
            if value is not None:
                attributes[name] = value
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.set_attribute(ERROR_TYPE, error_type(error))


def _overflows(prevented: bool, survived: bool, outcome: str) -> list[str]:
    """What a request counts as (`middleware.services.status_board.OVERFLOWS`)."""
    return [
        name
        for name, happened in (
            ("prevented", prevented),
            ("survived", survived),
            ("refused", outcome == "refused"),
            ("blocked", outcome == "blocked"),
        )
        if happened
    ]


def _by_policy(stage_outcome: Outcome) -> dict[str, list[int]]:
    """What each policy did in one stage outcome: tokens before, tokens after, items."""
    by_policy: dict[str, list[int]] = {}
    for record in stage_outcome.records:
        totals = by_policy.get(record.policy)
        if totals is None:
            totals = by_policy[record.policy] = [0, 0, 0]
        totals[0] += record.tokens_before
        totals[1] += record.tokens_after
        totals[2] += 1
    return by_policy


def log_request(level: int, exchange: Exchange, outcome: str, added_ms: float, done: str) -> None:
    """The request's one line on `brim.request`: model, client, tokens in → out / budget, what
    was done, retries, restored originals, the time brim added and the request id — counts and
    names only, never a body, a header or a key. Client input (the model id, the User-Agent) is
    cleaned to one printable word, so no request can forge a line of its own."""
    report = exchange.report
    context = report.context
    tokens_in = report.tokens_received()
    tokens_out = report.tokens_sent(tokens_in)
    budget = context.budget.effective if context is not None else None
    client = context.client if context is not None and context.client else None
    fields: dict[str, Any] = {
        "model": log_word(exchange.model),
        "client": client or log_word(exchange.user_agent.partition(" ")[0], 64),
        "route": exchange.api,
        "upstream": exchange.upstream,
        "outcome": outcome,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "budget": budget,
        "actions": done,
        "retries": report.retries,
        "restored": len(report.restored),
        "added_ms": round(added_ms, 1),
        "request_id": log_word(exchange.request_id, 128),  # the client's x-request-id, if any
    }
    line = REQUEST_LINE if outcome in PLAIN_OUTCOMES else REQUEST_LINE + " outcome=%s"
    args = [
        fields["model"],
        fields["client"],
        *(f"{n:,}" if n is not None else "?" for n in (tokens_in, tokens_out, budget)),
        done,
        report.retries,
        fields["restored"],
        added_ms,
        fields["request_id"],
    ]
    if outcome not in PLAIN_OUTCOMES:
        args.append(outcome)
    request_log.log(level, line, *args, extra=fields)


def log_word(text: str, limit: int = 200) -> str:
    """Client input as one printable word for a log line: `-` when there is none."""
    word = "".join(c if c.isprintable() and not c.isspace() else "?" for c in text[:limit])
    return word or "-"
