"""Built-in model facts: what brim knows when neither the config nor litellm's map does.

Figures are the providers' published limits. Windows are totals; `output_counts` says whether the
provider counts the reply's tokens against them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Facts:
    context_window: int
    max_output: int


# Coding CLIs, by the ids their wrappers use (`cli:model`). Exact ids only.
CLI_MODELS: dict[str, Facts] = {
    **dict.fromkeys(
        ["codex:gpt-5.2-codex", "cursor-agent:gpt-5.2-codex", "opencode:openai/gpt-5.2-codex"],
        Facts(400_000, 128_000),
    ),
    **dict.fromkeys(
        ["codex:gpt-4.1", "cursor-agent:gpt-4.1", "opencode:openai/gpt-4.1"],
        Facts(1_000_000, 32_000),
    ),
    **dict.fromkeys(
        ["codex:o3", "codex:o4-mini", "opencode:openai/o3", "opencode:openai/o4-mini"],
        Facts(200_000, 100_000),
    ),
    **dict.fromkeys(["claude:opus", "claude:sonnet", "claude:haiku"], Facts(200_000, 64_000)),
    "gemini:flash": Facts(1_000_000, 32_000),
    "gemini:pro": Facts(1_000_000, 64_000),
}

# Tokens a CLI-backed provider spends on its own system prompt and tools before the user's input.
CLI_OVERHEAD: dict[str, int] = {
    "claude": 60_000,
    "gemini": 40_000,
    "cursor-agent": 40_000,
    "codex": 40_000,
    "opencode": 40_000,
}
DEFAULT_CLI_OVERHEAD = 40_000
CLI_PROVIDER = {"claude": "anthropic", "gemini": "gemini", "codex": "openai"}

# Model families by glob over the bare model name; first match wins, so specific before general.
FAMILIES: list[tuple[str, Facts]] = [
    ("gpt-5*", Facts(400_000, 128_000)),
    ("gpt-4.1*", Facts(1_047_576, 32_768)),
    ("gpt-4o*", Facts(128_000, 16_384)),
    ("chatgpt-4o*", Facts(128_000, 16_384)),
    ("o1-mini*", Facts(128_000, 65_536)),
    ("o1*", Facts(200_000, 100_000)),
    ("o3*", Facts(200_000, 100_000)),
    ("o4*", Facts(200_000, 100_000)),
    ("codex-mini*", Facts(200_000, 100_000)),
    ("gpt-4-turbo*", Facts(128_000, 4_096)),
    ("gpt-4-1106*", Facts(128_000, 4_096)),
    ("gpt-4-0125*", Facts(128_000, 4_096)),
    ("gpt-4-32k*", Facts(32_768, 4_096)),
    ("gpt-4*", Facts(8_192, 4_096)),
    ("gpt-3.5-turbo*", Facts(16_385, 4_096)),
    ("claude-opus-4-1*", Facts(200_000, 32_000)),
    ("claude-opus-4-2025*", Facts(200_000, 32_000)),
    ("claude-opus-4-0*", Facts(200_000, 32_000)),
    ("claude-opus-4*", Facts(200_000, 64_000)),
    ("claude-sonnet-4*", Facts(200_000, 64_000)),
    ("claude-haiku-4*", Facts(200_000, 64_000)),
    ("claude-3-7-sonnet*", Facts(200_000, 64_000)),
    ("claude-3-5*", Facts(200_000, 8_192)),
    ("claude-3*", Facts(200_000, 4_096)),
    ("claude*", Facts(200_000, 64_000)),
    ("gemini-3*", Facts(1_048_576, 65_536)),
    ("gemini-2.5*", Facts(1_048_576, 65_536)),
    ("gemini-2.0*", Facts(1_048_576, 8_192)),
    ("gemini-1.5-pro*", Facts(2_097_152, 8_192)),
    ("gemini*", Facts(1_048_576, 8_192)),
]

DEFAULT = Facts(128_000, 8_192)

# Families whose published "max input" is a limit on the prompt alone (the reply has its own).
INPUT_ONLY_LIMIT = ("gpt-5*",)
# Families whose longer window is opt-in per request: Anthropic gives Claude Sonnet 4 and 4.5
# 1 000 000 tokens only with the `context-1m` beta, 200 000 without. Where litellm's map lists
# the longer window for such a model and prices input above a tier (200 000) higher, the tier
# is the model's window unless the request asks for the beta (`LimitsRegistry.resolve`).
OPT_IN_LONG_CONTEXT = ("*claude*",)
# Providers that limit input and output separately. Anthropic counts the prompt against the
# window and `max_tokens` apart from it — except on models whose error says "input length and
# `max_tokens` exceed context limit", which the retry stage then honours.
SEPARATE_OUTPUT_PROVIDERS = frozenset({"gemini", "vertex_ai", "google", "anthropic"})
