"""Which limits apply to a model: normalisation of model ids and the resolution chain.

Resolution, per figure (window, max output, tokenizer), first hit wins:

1. learned from the provider's own overflow errors (`LimitsRegistry.learn`; and
   `learn_output_counts` when the error says the output limit shares the window);
2. `[models."ID"]` in proxy.toml (by id or alias);
3. litellm's model map, then the built-in exact ids (CLI ids such as `claude:sonnet`), trying the
   most specific spelling of the id first: `codex:gpt-4.1`, then `gpt-4.1`;
4. the built-in model families (`gpt-4o*`, `claude-sonnet-4*`, …);
5. `_default` (128 000 / 8 192), reported with source `default` so the caller can warn.

What is learned is kept per normalised model id, each fact until its own expiry (wall-clock
seconds, a day after it was learned), so that a fact learned in another process or on another
machine (`adopt`, by `middleware.services.shared`) expires there when it expires here. Listeners
hear of each fact learned in this process; `adopt` keeps a fact from elsewhere if it is newer. A
window, learned here or adopted, must lie within bounds of what the registry knows without it
(`implausible`: at least `LEARNED_FLOOR` tokens, at least 1/`LEARNED_SPAN` of the known window
and at most `LEARNED_SPAN` times it); `forget` drops facts, as an operator asks.

One request can ask for more: an Anthropic model called with the `context-1m-…` beta
(`anthropic-beta: context-1m-2025-08-07`) has a 1 000 000-token window for that request, whatever
the chain says (source `header`). The caller reads the header; `wants_long_context` parses it.
Without it, a Claude model whose litellm entry is the long window and prices input above a tier
(`claude-sonnet-4-20250514`: 1 000 000, dearer above 200 000) has the tier as its window
(`model_table.OPT_IN_LONG_CONTEXT`): the long window is the beta's, not the model's.
"""

from __future__ import annotations

import fnmatch
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Literal

from cachetools import TLRUCache
from pydantic import BaseModel, ConfigDict, Field

from brim.policies import model_table
from brim.policies.model_map import MapEntry, ModelMap
from brim.policies.remembered import Remembered

CLI_MARKER = "[cli]"
_DATE_SUFFIX = re.compile(r"(-\d{4}-\d{2}-\d{2}|-\d{8}|@\d{8}|-v\d+:\d+)$")
LONG_CONTEXT_BETA = "context-1m"  # Anthropic's beta token prefix: context-1m-2025-08-07
LONG_CONTEXT_WINDOW = 1_000_000
LEARNED_TTL_S = 24 * 3600.0
LEARNED_MAX = 4_096  # facts of each kind kept (the soonest to expire go first)
LEARNED_FLOOR = 1_024  # no window below this is learned: no real model has one
LEARNED_SPAN = 8  # a learned window lies within this factor of the one known without it
CLOCK_SKEW_S = 300.0  # how far another machine's clock may run ahead of this one's
MEMO_MAX = 4_096  # model ids (client input) whose normalisation and limits are remembered


class LimitSource(StrEnum):
    LEARNED = "learned"
    CONFIG = "config"
    LITELLM = "litellm"
    BUILTIN = "built-in"
    DEFAULT = "default"
    HEADER = "header"  # this request asked for a larger window (Anthropic's context-1m beta)


def wants_long_context(betas: Iterable[str]) -> bool:
    """Whether `anthropic-beta` header values turn on the 1M-token window. Each value may list
    several betas, comma-separated: `context-1m-2025-08-07,interleaved-thinking-2025-05-14`."""
    return any(
        token.strip().lower().startswith(LONG_CONTEXT_BETA)
        for value in betas
        for token in value.split(",")
    )


@dataclass(frozen=True, slots=True)
class ModelId:
    """A model id taken apart: `[cli]opencode:openai/gpt-4.1` → cli opencode, provider openai,
    name gpt-4.1. `candidates` are the spellings to look up, most specific first."""

    raw: str
    cli: str | None
    provider: str | None
    name: str
    candidates: tuple[str, ...]


def normalize_model_id(raw: str, aliases: Mapping[str, str] | None = None) -> ModelId:
    text = raw.strip().lower()
    marked = text.startswith(CLI_MARKER)
    text = text.removeprefix(CLI_MARKER)
    if aliases and text in aliases:
        return normalize_model_id(aliases[text])

    cli: str | None = None
    rest = text
    head, colon, tail = text.partition(":")
    if colon and tail and "/" not in head and (marked or head in model_table.CLI_OVERHEAD):
        cli, rest = head, tail

    candidates: list[str] = [f"{cli}:{rest}"] if cli else []
    provider: str | None = None
    spelling = rest
    while True:
        candidates.append(spelling)
        prefix, slash, remainder = spelling.partition("/")
        if not slash or not remainder:
            break
        provider = provider or prefix
        spelling = remainder
    name = spelling
    undated = _DATE_SUFFIX.sub("", name)
    if undated and undated != name:
        candidates.append(undated)
    if aliases:
        for candidate in list(candidates):
            if candidate in aliases:
                return normalize_model_id(aliases[candidate])
    return ModelId(
        raw=raw,
        cli=cli,
        provider=provider or (model_table.CLI_PROVIDER.get(cli) if cli else None),
        name=name,
        candidates=tuple(dict.fromkeys(candidates)),
    )


class ModelFacts(BaseModel):
    """Per-model facts from `[models."ID"]`; any may be left unset."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    context_window: int | None = Field(None, gt=0)
    max_output: int | None = Field(None, gt=0)
    tokenizer: Literal["o200k_base", "cl100k_base", "claude"] | None = None
    aliases: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()  # larger-window models to try when this one overflows


@dataclass(frozen=True, slots=True)
class ModelContextLimits:
    provider: str
    model: str
    context_window: int
    max_output: int
    output_counts: bool  # the reply's tokens count against context_window
    tokenizer: str  # "o200k_base", "cl100k_base", or "claude" (o200k_base × a calibration factor)


@dataclass(frozen=True, slots=True)
class ResolvedLimits:
    model: ModelId
    limits: ModelContextLimits
    sources: Mapping[str, LimitSource] = field(default_factory=dict)
    cli_overhead: int = 0

    @property
    def source(self) -> LimitSource:
        return self.sources["context_window"]


LearnedKind = Literal["window", "output_counts"]
LEARNED_KINDS: tuple[LearnedKind, ...] = ("window", "output_counts")


@dataclass(frozen=True, slots=True)
class Learned:
    """One fact a provider told brim about a model: its context window (`kind` "window",
    `value` the window), or that it counts the request's output limit against the window
    (`kind` "output_counts", `value` 1). `model` is the normalised id; `until` the wall-clock
    time (`time.time()`) it is forgotten at."""

    kind: LearnedKind
    model: str
    value: int
    until: float

    def learned_at(self, ttl_s: float) -> float:
        """When it was learned, for a registry that keeps facts `ttl_s`."""
        return self.until - ttl_s


def provider_of(model: ModelId, entry: MapEntry | None) -> str:
    if model.provider:
        return model.provider
    if entry is not None and entry.provider:
        return entry.provider.split("-")[0]
    name = model.name
    if name.startswith(("gpt-", "o1", "o3", "o4", "chatgpt", "codex", "text-")):
        return "openai"
    if name.startswith("claude"):
        return "anthropic"
    if name.startswith("gemini"):
        return "gemini"
    return "unknown"


def tokenizer_for(model: ModelId, provider: str) -> str:
    name = model.name
    if provider == "anthropic" or "claude" in name or model.cli == "claude":
        return "claude"
    legacy = name.startswith(("gpt-4", "gpt-3.5", "text-embedding")) and not name.startswith(
        ("gpt-4o", "gpt-4.1", "gpt-4.5")
    )
    return "cl100k_base" if legacy else "o200k_base"


def _until(key: str, value: tuple[int, float], now: float) -> float:
    return value[1]


class Learning:
    """What providers told brim, shared by every request, and by the registries of successive
    configurations (`LimitsRegistry.reconfigured`): bounded, and forgotten after a day in case
    the provider raised the limit since. By kind: model → (value, until). Windows; and models
    whose provider said the request's output limit shares the window (Anthropic's "input length
    and `max_tokens` exceed context limit")."""

    def __init__(self, ttl_s: float, timer: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.timer = timer
        self.facts: dict[LearnedKind, TLRUCache[str, tuple[int, float]]] = {
            kind: TLRUCache(maxsize=LEARNED_MAX, ttu=_until, timer=timer) for kind in LEARNED_KINDS
        }
        self.generation = 0  # moves on with every fact learned or adopted
        # Told of every fact learned here (not of those adopted from elsewhere).
        self.listeners: list[Callable[[Learned], None]] = []


class LimitsRegistry:
    """Resolves a model id to its limits. Holds the config's facts, litellm's map and what was
    learned from provider errors; looking up does no I/O."""

    def __init__(
        self,
        configured: Mapping[str, ModelFacts] | None = None,
        model_map: ModelMap | None = None,
        *,
        learned_ttl_s: float = LEARNED_TTL_S,
        timer: Callable[[], float] = time.time,
        learning: Learning | None = None,
    ) -> None:
        # `[models."[cli]gemini:flash"]` is the id without its marker, as ids are looked up.
        self.configured = {
            key.lower().removeprefix(CLI_MARKER): facts for key, facts in (configured or {}).items()
        }
        self.aliases = {
            alias.lower(): key for key, facts in self.configured.items() for alias in facts.aliases
        }
        self.model_map = model_map if model_map is not None else ModelMap.empty()
        self.learning = learning or Learning(learned_ttl_s, timer)
        self.learned_ttl_s = self.learning.ttl_s
        self._timer = self.learning.timer
        self._learned = self.learning.facts
        self.listeners = self.learning.listeners
        # Resolutions remembered per (raw id, long_context): the config and the model map never
        # change, so an entry holds until a fact is learned or adopted (the learning's
        # `generation` moves on) or a learned fact it rests on expires (its `until`). Ids are
        # client input: bounded.
        self._normalized: Remembered[str, ModelId] = Remembered(MEMO_MAX)
        self._resolved: Remembered[tuple[str, bool], tuple[int, float, ResolvedLimits]] = (
            Remembered(MEMO_MAX)
        )

    def reconfigured(self, configured: Mapping[str, ModelFacts]) -> LimitsRegistry:
        """A registry of other `[models]`, with the same model map and the same learning: a
        fact learned through either is in force in both (a reload's new configuration takes
        over what the running one learned)."""
        return LimitsRegistry(configured, self.model_map, learning=self.learning)

    @property
    def learned(self) -> dict[str, int]:
        """The windows learned and not yet forgotten, by normalised model id."""
        return {model: value for model, (value, _) in list(self._learned["window"].items())}

    def learned_facts(self) -> list[Learned]:
        """Every fact learned (here or adopted) and not yet forgotten."""
        return [
            Learned(kind, model, value, until)
            for kind, cache in self._learned.items()
            for model, (value, until) in list(cache.items())
        ]

    def normalize(self, raw: str) -> ModelId:
        model = self._normalized.get(raw)
        if model is None:
            model = normalize_model_id(raw, self.aliases)
            self._normalized[raw] = model
        return model

    def known_window(self, raw: str) -> tuple[int, LimitSource]:
        """The model's window as the registry knows it without anything learned, and whence."""
        sources: dict[str, LimitSource] = {}
        window = self._first(self.normalize(raw), "context_window", sources, learned=False)
        return window, sources["context_window"]

    def implausible(self, kind: LearnedKind, raw: str, value: int) -> str | None:
        """Why `value` cannot be a fact of `kind` about this model, or None if it can: a window
        below `LEARNED_FLOOR`, or beyond `LEARNED_SPAN` times the known window either way (only
        the floor and the ceiling for a model known only by the `_default`); an output_counts
        fact that is not 1."""
        if kind == "output_counts":
            return None if value == 1 else f"output_counts must be 1, not {value}"
        known, source = self.known_window(raw)
        if value < LEARNED_FLOOR:
            return f"a {value}-token window is below the floor of {LEARNED_FLOOR}"
        if value > known * LEARNED_SPAN:
            return f"a {value}-token window is over {LEARNED_SPAN} times the known {known}"
        if source is not LimitSource.DEFAULT and value * LEARNED_SPAN < known:
            return (
                f"a {value}-token window is under 1/{LEARNED_SPAN} of the known {known} "
                f"({source.value})"
            )
        return None

    def _learn(self, kind: LearnedKind, raw: str, value: int) -> bool:
        if self.implausible(kind, raw, value) is not None:
            return False
        key = self.normalize(raw).candidates[0]
        cache = self._learned[kind]
        before = cache.get(key)
        fact = Learned(kind, key, value, self._timer() + self.learned_ttl_s)
        cache[key] = (value, fact.until)
        self.learning.generation += 1
        for listener in self.listeners:
            listener(fact)
        return before is None or before[0] != value

    def learn(self, raw: str, context_window: int) -> bool:
        """Remember the window a provider reported for this model; it wins from now on.
        Returns whether this was news (so the caller logs it once). A window outside the
        bounds (`implausible`) is not learned: False. The caller checks the evidence first
        (`policies.evidence`)."""
        return self._learn("window", raw, context_window)

    def learn_output_counts(self, raw: str) -> bool:
        """Remember that this model's provider counts the request's output limit against the
        window; `resolve` reports `output_counts` (source learned) from now on. Returns whether
        this was news."""
        return self._learn("output_counts", raw, 1)

    def adopt(self, fact: Learned) -> bool:
        """Keep a fact learned elsewhere (another process, another instance) if it is newer
        than what this registry holds of its kind for its model — the later learning wins —
        and not forgotten yet. Returns whether the value in force changed."""
        cache = self._learned[fact.kind]
        held = cache.get(fact.model)
        if fact.until <= self._timer() or (held is not None and held[1] >= fact.until):
            return False
        cache[fact.model] = (fact.value, fact.until)
        self.learning.generation += 1
        return held is None or held[0] != fact.value

    def rejects(self, fact: Learned) -> str | None:
        """Why a fact read from elsewhere (another process's record) cannot be adopted, or None:
        its model id is not one the registry would learn under (not normalised), it expires
        more than a learning's span from now, or its value is `implausible`."""
        if self.normalize(fact.model).candidates[0] != fact.model:
            return f"{fact.model!r} is not a normalised model id"
        if fact.until > self._timer() + self.learned_ttl_s + CLOCK_SKEW_S:
            return "it expires later than anything learned now would"
        return self.implausible(fact.kind, fact.model, fact.value)

    def forget(self, raw: str | None = None, *, learned_by: float | None = None) -> list[Learned]:
        """Drop what was learned about one model (any spelling of its id), or about every model
        (`raw` None); with `learned_by` (wall-clock), only what was learned at that time or
        before. Returns the facts dropped."""
        keys = None if raw is None else {raw, self.normalize(raw).candidates[0]}
        dropped = []
        for kind, cache in self._learned.items():
            for model, (value, until) in list(cache.items()):
                fact = Learned(kind, model, value, until)
                if keys is not None and model not in keys:
                    continue
                if learned_by is not None and fact.learned_at(self.learned_ttl_s) > learned_by:
                    continue
                cache.pop(model, None)
                dropped.append(fact)
        if dropped:
            self.learning.generation += 1
        return dropped

    def fallbacks(self, raw: str) -> tuple[str, ...]:
        model = self.normalize(raw)
        return next(
            (self.configured[c].fallbacks for c in model.candidates if c in self.configured), ()
        )

    def resolve(self, raw: str, *, long_context: bool = False) -> ResolvedLimits:
        """`long_context`: the request carries Anthropic's context-1m beta
        (`wants_long_context`); an Anthropic model then gets a window of at least 1 000 000.
        Remembered until something is learned or adopted, or a learned fact it used expires."""
        key = (raw, long_context)
        memo = self._resolved.get(key)
        if (
            memo is not None
            and memo[0] == self.learning.generation
            and (memo[1] == math.inf or self._timer() < memo[1])
        ):
            return memo[2]
        generation = self.learning.generation
        resolved, until = self._resolve(raw, long_context)
        self._resolved[key] = (generation, until, resolved)
        return resolved

    def _resolve(self, raw: str, long_context: bool) -> tuple[ResolvedLimits, float]:
        """The limits, and until when they hold: the soonest expiry of the learned facts they
        rest on (infinity: none)."""
        model = self.normalize(raw)
        sources: dict[str, LimitSource] = {}
        until = math.inf
        learned_windows = self._learned["window"]
        for candidate in model.candidates:
            if (fact := learned_windows.get(candidate)) is not None:
                until = fact[1]
                break
        window = self._first(model, "context_window", sources)
        max_output = self._first(model, "max_output", sources)
        entry = next(
            (e for c in model.candidates if (e := self.model_map.get(c)) is not None), None
        )
        provider = provider_of(model, entry)
        if (
            sources["context_window"] is LimitSource.LITELLM
            and entry is not None
            and entry.price_tier is not None
            and any(
                fnmatch.fnmatchcase(model.name, pattern)
                for pattern in model_table.OPT_IN_LONG_CONTEXT
            )
        ):  # the map's window is the beta's: the model's own is the tier
            if long_context:
                sources["context_window"] = LimitSource.HEADER
            else:
                window = min(window, entry.price_tier)

        configured = [
            self.configured[c].tokenizer for c in model.candidates if c in self.configured
        ]
        chosen = next((t for t in configured if t), None)
        sources["tokenizer"] = LimitSource.CONFIG if chosen else LimitSource.BUILTIN
        tokenizer: str = chosen or tokenizer_for(model, provider)

        output_counts = provider not in model_table.SEPARATE_OUTPUT_PROVIDERS
        if sources["context_window"] is LimitSource.LITELLM and any(
            fnmatch.fnmatchcase(model.name, pattern) for pattern in model_table.INPUT_ONLY_LIMIT
        ):
            output_counts = False
        counted = [
            fact for c in model.candidates if (fact := self._learned["output_counts"].get(c))
        ]
        if counted:
            output_counts = True
            sources["output_counts"] = LimitSource.LEARNED
            until = min(until, *(fact[1] for fact in counted))
        if long_context and provider == "anthropic" and window < LONG_CONTEXT_WINDOW:
            # Wins over a learned window too: learning is per model, and what Anthropic
            # reports when a request overflows without the beta is the standard window.
            window = LONG_CONTEXT_WINDOW
            sources["context_window"] = LimitSource.HEADER

        overhead = 0
        if model.cli is not None:
            overhead = model_table.CLI_OVERHEAD.get(model.cli, model_table.DEFAULT_CLI_OVERHEAD)
        limits = ModelContextLimits(
            provider=provider,
            model=model.candidates[0],
            context_window=window,
            max_output=min(max_output, window),
            output_counts=output_counts,
            tokenizer=tokenizer,
        )
        # Shared by every caller of a remembered resolution: read-only.
        frozen = MappingProxyType(sources)
        return ResolvedLimits(
            model=model, limits=limits, sources=frozen, cli_overhead=overhead
        ), until

    def _first(
        self,
        model: ModelId,
        figure: str,
        sources: dict[str, LimitSource],
        *,
        learned: bool = True,
    ) -> int:
        if figure == "context_window" and learned:
            windows = self._learned["window"]
            for candidate in model.candidates:
                if (fact := windows.get(candidate)) is not None:
                    sources[figure] = LimitSource.LEARNED
                    return fact[0]
        for candidate in model.candidates:
            configured = self.configured.get(candidate)
            value = getattr(configured, figure) if configured else None
            if value is not None:
                sources[figure] = LimitSource.CONFIG
                return int(value)
        for candidate in model.candidates:
            entry = self.model_map.get(candidate)
            value = getattr(entry, figure) if entry else None
            if value is not None:
                sources[figure] = LimitSource.LITELLM
                return int(value)
            cli_facts = model_table.CLI_MODELS.get(candidate)
            if cli_facts is not None:
                sources[figure] = LimitSource.BUILTIN
                return int(getattr(cli_facts, figure))
        for pattern, facts in model_table.FAMILIES:
            if any(fnmatch.fnmatchcase(c, pattern) for c in model.candidates):
                sources[figure] = LimitSource.BUILTIN
                return int(getattr(facts, figure))
        sources[figure] = LimitSource.DEFAULT
        return int(getattr(model_table.DEFAULT, figure))

    def known_ids(self) -> list[str]:
        """Configured ids, then the built-in exact ids, then litellm's chat models."""
        ids = [*self.configured, *model_table.CLI_MODELS, *self.model_map.ids()]
        return list(dict.fromkeys(ids))
