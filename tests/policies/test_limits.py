"""The limits registry: every built-in id, every normalisation form, the resolution order."""

from __future__ import annotations

import pytest

from brim.policies import limits as limits_module
from brim.policies.limits import (
    Learned,
    LimitSource,
    LimitsRegistry,
    ModelFacts,
    normalize_model_id,
    wants_long_context,
)
from brim.policies.model_map import ModelMap
from brim.proxy.resources import litellm_model_map

TABLE = [
    (
        ["codex:gpt-5.2-codex", "cursor-agent:gpt-5.2-codex", "opencode:openai/gpt-5.2-codex"],
        400_000,
        128_000,
    ),
    (["codex:gpt-4.1", "cursor-agent:gpt-4.1", "opencode:openai/gpt-4.1"], 1_000_000, 32_000),
    (
        ["codex:o3", "codex:o4-mini", "opencode:openai/o3", "opencode:openai/o4-mini"],
        200_000,
        100_000,
    ),
    (["claude:opus", "claude:sonnet", "claude:haiku"], 200_000, 64_000),
    (["gemini:flash"], 1_000_000, 32_000),
    (["gemini:pro"], 1_000_000, 64_000),
]
OVERHEAD = {
    "claude": 60_000,
    "gemini": 40_000,
    "cursor-agent": 40_000,
    "codex": 40_000,
    "opencode": 40_000,
}


@pytest.fixture(scope="module")
def registry() -> LimitsRegistry:
    return LimitsRegistry(model_map=litellm_model_map())


@pytest.mark.parametrize(
    ("model", "window", "max_output"),
    [(model, window, out) for ids, window, out in TABLE for model in ids],
)
def test_every_builtin_cli_id_resolves_with_its_overhead(
    registry: LimitsRegistry, model: str, window: int, max_output: int
) -> None:
    resolved = registry.resolve(model)
    assert (resolved.limits.context_window, resolved.limits.max_output) == (window, max_output)
    assert resolved.sources["context_window"] is LimitSource.BUILTIN
    assert resolved.sources["max_output"] is LimitSource.BUILTIN
    assert resolved.cli_overhead == OVERHEAD[model.split(":")[0]]


def test_cli_marker_is_understood(registry: LimitsRegistry) -> None:
    resolved = registry.resolve("[cli]gemini:flash")
    assert resolved.model.cli == "gemini"
    assert resolved.limits.context_window == 1_000_000
    assert resolved.cli_overhead == 40_000
    assert registry.resolve("[cli]mytool:some-model").cli_overhead == 40_000  # _default overhead


@pytest.mark.parametrize(
    ("model", "window", "max_output", "provider", "tokenizer"),
    [
        ("openai/gpt-4.1", 1_047_576, 32_768, "openai", "o200k_base"),
        ("anthropic/claude-sonnet-4-5", 200_000, 64_000, "anthropic", "claude"),
        ("gemini/gemini-2.5-flash", 1_048_576, 65_535, "gemini", "o200k_base"),
        ("gpt-4o-mini", 128_000, 16_384, "openai", "o200k_base"),
        ("gpt-4o-2024-08-06", 128_000, 16_384, "openai", "o200k_base"),
        ("GPT-4o", 128_000, 16_384, "openai", "o200k_base"),
        ("gpt-4", 8_192, 4_096, "openai", "cl100k_base"),
        ("gpt-3.5-turbo", 16_385, 4_096, "openai", "cl100k_base"),
    ],
)
def test_provider_prefixed_bare_and_dated_ids_come_from_litellms_map(
    registry: LimitsRegistry,
    model: str,
    window: int,
    max_output: int,
    provider: str,
    tokenizer: str,
) -> None:
    resolved = registry.resolve(model)
    assert (resolved.limits.context_window, resolved.limits.max_output) == (window, max_output)
    assert resolved.source is LimitSource.LITELLM
    assert (resolved.limits.provider, resolved.limits.tokenizer) == (provider, tokenizer)
    assert resolved.cli_overhead == 0


def test_snapshots_unknown_to_the_map_fall_back_to_their_family(registry: LimitsRegistry) -> None:
    resolved = registry.resolve("gpt-4o-2099-01-01")
    assert resolved.limits.context_window == 128_000
    assert registry.resolve("claude-3-5-sonnet-20241022").limits.max_output == 8_192


def test_builtin_families_serve_when_the_map_is_missing() -> None:
    offline = LimitsRegistry(model_map=ModelMap.empty())
    cases = {
        "gpt-4.1-mini": (1_047_576, 32_768),
        "gpt-4o": (128_000, 16_384),
        "o3-pro": (200_000, 100_000),
        "claude-sonnet-4-5-20250929": (200_000, 64_000),
        "gemini-2.5-pro": (1_048_576, 65_536),
        "gpt-5.2": (400_000, 128_000),
    }
    for model, figures in cases.items():
        resolved = offline.resolve(model)
        assert (resolved.limits.context_window, resolved.limits.max_output) == figures, model
        assert resolved.source is LimitSource.BUILTIN


def test_unknown_model_gets_the_conservative_default(registry: LimitsRegistry) -> None:
    resolved = registry.resolve("acme-llm-7")
    assert (resolved.limits.context_window, resolved.limits.max_output) == (128_000, 8_192)
    assert resolved.source is LimitSource.DEFAULT


def test_colons_that_are_not_cli_prefixes_stay_in_the_name() -> None:
    for model in ("llama3:8b", "anthropic.claude-3-5-sonnet-20241022-v2:0", "ft:gpt-4o-2024-08-06"):
        assert normalize_model_id(model).cli is None, model


def test_config_beats_the_map_figure_by_figure(registry: LimitsRegistry) -> None:
    configured = LimitsRegistry({"gpt-4o": ModelFacts(context_window=50_000)}, litellm_model_map())
    resolved = configured.resolve("openai/gpt-4o-2024-08-06")
    assert resolved.limits.context_window == 50_000
    assert resolved.sources["context_window"] is LimitSource.CONFIG
    assert resolved.limits.max_output == 16_384  # not configured: still litellm's
    assert resolved.sources["max_output"] is LimitSource.LITELLM


def test_aliases_and_tokenizer_override() -> None:
    registry = LimitsRegistry(
        {
            "local-llama": ModelFacts(
                context_window=8_192,
                max_output=1_024,
                aliases=("llama", "Team-Model"),
                tokenizer="cl100k_base",
            )
        }
    )
    for name in ("llama", "team-model", "[cli]llama"):
        resolved = registry.resolve(name)
        assert resolved.limits.model == "local-llama"
        assert (resolved.limits.context_window, resolved.limits.max_output) == (8_192, 1_024)
        assert resolved.limits.tokenizer == "cl100k_base"
        assert resolved.sources["tokenizer"] is LimitSource.CONFIG


def test_learned_limits_win_over_everything() -> None:
    registry = LimitsRegistry({"gpt-4o": ModelFacts(context_window=50_000)}, litellm_model_map())
    registry.learn("gpt-4o", 100_000)
    resolved = registry.resolve("gpt-4o")
    assert resolved.limits.context_window == 100_000
    assert resolved.source is LimitSource.LEARNED


def test_a_provider_saying_max_tokens_shares_the_window_is_learned() -> None:
    registry = LimitsRegistry(model_map=litellm_model_map())
    assert registry.resolve("claude-sonnet-4-5").limits.output_counts is False  # the table
    assert registry.learn_output_counts("anthropic/claude-sonnet-4-5") is True
    assert registry.learn_output_counts("anthropic/claude-sonnet-4-5") is False  # not news
    resolved = registry.resolve("anthropic/claude-sonnet-4-5")
    assert resolved.limits.output_counts is True
    assert resolved.sources["output_counts"] is LimitSource.LEARNED
    assert resolved.sources["context_window"] is not LimitSource.LEARNED  # the window stays
    assert registry.resolve("claude-opus-4-1").limits.output_counts is False  # per model


@pytest.mark.parametrize(
    ("values", "wanted"),
    [
        (["context-1m-2025-08-07"], True),
        (["interleaved-thinking-2025-05-14, Context-1M-2025-08-07"], True),
        (["fine-grained-tool-streaming-2025-05-14", "context-1m-2026-01-01"], True),
        (["interleaved-thinking-2025-05-14,token-efficient-tools-2025-02-19"], False),
        (["x-context-1m"], False),
        ([], False),
    ],
)
def test_the_context_1m_beta_is_found_among_several(values: list[str], wanted: bool) -> None:
    assert wants_long_context(values) is wanted


def test_the_context_1m_beta_gives_anthropic_models_a_million_tokens(
    registry: LimitsRegistry,
) -> None:
    for model in ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "claude:sonnet"):
        plain = registry.resolve(model)
        long = registry.resolve(model, long_context=True)
        assert plain.limits.context_window == 200_000
        assert long.limits.context_window == 1_000_000
        assert long.source is LimitSource.HEADER
        assert long.limits.max_output == plain.limits.max_output
        assert long.cli_overhead == plain.cli_overhead
    # Not an Anthropic model: the beta means nothing to it.
    for model in ("gpt-4o", "acme-llm-7"):
        assert registry.resolve(model, long_context=True) == registry.resolve(model)
    # What was learned without the beta (Anthropic's standard window) does not cap it.
    learning = LimitsRegistry(model_map=litellm_model_map())
    learning.learn("claude-sonnet-4-5", 200_000)
    assert learning.resolve("claude-sonnet-4-5").source is LimitSource.LEARNED
    assert learning.resolve("claude-sonnet-4-5", long_context=True).limits.context_window == (
        1_000_000
    )


@pytest.mark.parametrize(
    "model",
    [
        "claude-sonnet-4-20250514",
        "anthropic/claude-sonnet-4-20250514",
        "claude-4-sonnet-20250514",
        "vertex_ai/claude-sonnet-4@20250514",
        "us.anthropic.claude-sonnet-4-20250514-v1:0",
    ],
)
def test_a_dated_claude_id_gets_its_long_window_only_with_the_beta(
    registry: LimitsRegistry, model: str
) -> None:
    """litellm's map lists Sonnet 4's dated ids with the 1 M window the context-1m beta opens,
    and prices input above 200 K higher: without the beta the window is 200 K."""
    plain = registry.resolve(model)
    assert plain.limits.context_window == 200_000
    assert plain.source is LimitSource.LITELLM
    long = registry.resolve(model, long_context=True)
    assert long.limits.context_window == 1_000_000
    assert long.source is LimitSource.HEADER


def test_native_long_windows_and_configured_ones_stay(registry: LimitsRegistry) -> None:
    """A long window that is the model's own (no cheaper tier below it, or not an opt-in
    family) is not cut to a tier; nor is one the config sets."""
    assert registry.resolve("claude-opus-4-6").limits.context_window == 1_000_000
    assert registry.resolve("claude-sonnet-4-6").limits.context_window == 1_000_000
    assert registry.resolve("gemini-2.5-pro").limits.context_window == 1_048_576  # 200 K tier
    assert registry.resolve("gpt-5.4").limits.context_window == 1_050_000  # 272 K tier
    configured = LimitsRegistry(
        {"claude-sonnet-4-20250514": ModelFacts(context_window=1_000_000)},
        litellm_model_map(),
    )
    assert configured.resolve("claude-sonnet-4-20250514").limits.context_window == 1_000_000


def test_the_map_keeps_the_cheaper_tier_below_the_window() -> None:
    entries = ModelMap.from_json(
        b'{"m": {"max_input_tokens": 1000000, "input_cost_per_token_above_200k_tokens": 1,'
        b' "input_cost_per_token_above_500k_tokens": 2, "output_cost_per_token_above_9k_tokens":'
        b' 3}, "n": {"max_input_tokens": 100000, "input_cost_per_token_above_200k_tokens": 1}}'
    )
    assert entries.get("m").price_tier == 200_000  # type: ignore[union-attr]
    assert entries.get("n").price_tier is None  # type: ignore[union-attr]  # above its window


def test_output_counting_rules(registry: LimitsRegistry) -> None:
    assert registry.resolve("gpt-4o").limits.output_counts is True
    assert registry.resolve("claude-sonnet-4-5").limits.output_counts is False  # max_tokens apart
    assert registry.resolve("gemini/gemini-2.5-flash").limits.output_counts is False
    # litellm states gpt-5's 272k as a limit on the prompt alone; its reply has its own.
    gpt5 = registry.resolve("gpt-5.2")
    assert (gpt5.limits.context_window, gpt5.limits.output_counts) == (272_000, False)


def test_max_output_never_exceeds_the_window() -> None:
    registry = LimitsRegistry({"tiny": ModelFacts(context_window=1_000, max_output=4_000)})
    assert registry.resolve("tiny").limits.max_output == 1_000


def test_known_ids_lists_configured_builtin_and_map_ids(registry: LimitsRegistry) -> None:
    ids = LimitsRegistry({"mine": ModelFacts(context_window=10)}, litellm_model_map()).known_ids()
    assert ids[0] == "mine"
    assert "claude:sonnet" in ids and "gpt-4o" in ids
    assert len(ids) == len(set(ids))


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_resolution_is_remembered_until_a_fact_is_learned_adopted_or_expires() -> None:
    clock = _Clock()
    configured = {"gpt-4o": ModelFacts(context_window=50_000, max_output=4_000)}
    registry = LimitsRegistry(configured, litellm_model_map(), timer=clock)
    first = registry.resolve("gpt-4o")
    assert registry.resolve("gpt-4o") is first  # remembered: nothing was learned since
    assert registry.resolve("GPT-4o") is not first  # per id as sent (normalised the same)
    assert registry.resolve("gpt-4o", long_context=True) is not first

    registry.learn("GPT-4o", 40_000)  # learned under another spelling of the id
    learned = registry.resolve("gpt-4o")
    assert (learned.limits.context_window, learned.source) == (40_000, LimitSource.LEARNED)
    assert registry.resolve("gpt-4o") is learned

    # A fact adopted from elsewhere (another process, through Redis) is seen at once.
    later = Learned("window", "gpt-4o", 30_000, clock.now + 24 * 3600 + 60)
    assert registry.adopt(later) is True
    assert registry.resolve("gpt-4o").limits.context_window == 30_000
    # ... and one it refuses (older than what it holds) changes nothing.
    assert registry.adopt(Learned("window", "gpt-4o", 20_000, clock.now + 5)) is False
    assert registry.resolve("gpt-4o").limits.context_window == 30_000

    # When the fact expires, the configured window is back, with no new learning to say so.
    clock.now += 24 * 3600 + 59
    assert registry.resolve("gpt-4o").limits.context_window == 30_000
    clock.now += 1
    expired = registry.resolve("gpt-4o")
    assert (expired.limits.context_window, expired.source) == (50_000, LimitSource.CONFIG)


def test_a_remembered_output_count_fact_expires_too() -> None:
    clock = _Clock()
    registry = LimitsRegistry(model_map=litellm_model_map(), timer=clock)
    assert registry.resolve("claude-sonnet-4-5").limits.output_counts is False
    registry.learn_output_counts("claude-sonnet-4-5")
    counted = registry.resolve("claude-sonnet-4-5")
    assert counted.limits.output_counts is True
    clock.now += 24 * 3600 - 1
    assert registry.resolve("claude-sonnet-4-5") is counted  # remembered while the fact holds
    clock.now += 1
    resolved = registry.resolve("claude-sonnet-4-5")
    assert resolved.limits.output_counts is False and "output_counts" not in resolved.sources


def test_a_remembered_resolution_cannot_be_changed_by_its_reader() -> None:
    registry = LimitsRegistry(model_map=litellm_model_map())
    with pytest.raises(TypeError):
        registry.resolve("gpt-4o").sources["context_window"] = LimitSource.LEARNED  # type: ignore[index]
    assert registry.resolve("gpt-4o").source is LimitSource.LITELLM


def test_remembered_ids_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module, "MEMO_MAX", 8)
    registry = LimitsRegistry(model_map=litellm_model_map())
    for n in range(50):
        registry.resolve(f"made-up-{n}")
    assert len(registry._resolved) <= 8 and len(registry._normalized) <= 8
    assert registry.resolve("made-up-49").source is LimitSource.DEFAULT


# --- what may be learned, adopted and forgotten --------------------------------------------------


def test_a_learned_window_stays_within_bounds_of_what_the_registry_knows() -> None:
    registry = LimitsRegistry({"house": ModelFacts(context_window=64_000)})
    assert registry.known_window("house") == (64_000, LimitSource.CONFIG)
    assert registry.implausible("window", "house", 8_000) is None  # 1/8 of it
    assert "under 1/8" in (registry.implausible("window", "house", 7_999) or "")
    assert "over 8 times" in (registry.implausible("window", "house", 512_001) or "")
    assert "floor" in (registry.implausible("window", "unknown-model", 1_023) or "")
    # A model known only by the `_default` has no 1/8 bound: a local server's 4 096 is real.
    assert registry.implausible("window", "unknown-model", 4_096) is None
    assert registry.learn("house", 1) is False and registry.learned == {}
    assert registry.learn("house", 10_000) is True and registry.learned == {"house": 10_000}
    # what it knows without the learned fact stays what it was
    assert registry.known_window("house") == (64_000, LimitSource.CONFIG)
    assert registry.implausible("output_counts", "house", 1) is None
    assert registry.implausible("output_counts", "house", 7) is not None


def test_a_fact_from_elsewhere_is_rejected_unless_brim_could_have_learned_it() -> None:
    registry = LimitsRegistry({"house": ModelFacts(context_window=64_000)}, timer=lambda: 1_000.0)
    day = 1_000.0 + registry.learned_ttl_s
    assert registry.rejects(Learned("window", "house", 32_000, day)) is None
    assert registry.rejects(Learned("window", "house", 10, day)) is not None
    assert registry.rejects(Learned("window", "HOUSE", 32_000, day)) is not None
    assert registry.rejects(Learned("window", "[cli]gemini:flash", 32_000, day)) is not None
    assert registry.rejects(Learned("window", "house", 32_000, day + 3_600)) is not None


def test_forgetting_takes_any_spelling_or_every_model_and_spares_what_came_later() -> None:
    clock = [1_000.0]
    registry = LimitsRegistry(timer=lambda: clock[0])
    registry.learn("openai/gpt-4o", 64_000)
    registry.learn_output_counts("claude-haiku-4-5")
    clock[0] += 10
    registry.learn("gemini-2.5-flash", 500_000)
    assert registry.resolve("OpenAI/GPT-4o").source is LimitSource.LEARNED
    dropped = registry.forget("OpenAI/GPT-4o")
    assert [(f.kind, f.model, f.value) for f in dropped] == [("window", "openai/gpt-4o", 64_000)]
    assert registry.resolve("openai/gpt-4o").source is not LimitSource.LEARNED
    # Every model learned by 1 005 (not what was learned at 1 010)
    dropped = registry.forget(None, learned_by=1_005.0)
    assert [f.model for f in dropped] == ["claude-haiku-4-5"]
    assert registry.learned == {"gemini-2.5-flash": 500_000}
    assert registry.forget(None) and registry.learned_facts() == []


def test_the_registry_of_a_new_configuration_keeps_what_was_learned() -> None:
    running = LimitsRegistry({"m": ModelFacts(context_window=60_000)})
    assert running.learn("other", 9_000)
    reloaded = running.reconfigured({"m": ModelFacts(context_window=30_000)})
    assert reloaded.resolve("m").limits.context_window == 30_000
    assert running.resolve("m").limits.context_window == 60_000  # a request in flight's
    assert reloaded.resolve("other").limits.context_window == 9_000
    assert reloaded.learn("m", 20_000)  # learned through the new one: known to both
    assert running.resolve("m").limits.context_window == 20_000
    assert [fact.model for fact in running.forget("m")] == ["m"]  # forgotten in both, too
    assert reloaded.resolve("m").limits.context_window == 30_000
    assert running.resolve("m").limits.context_window == 60_000
