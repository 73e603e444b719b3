"""The context-overflow classifier, table-tested with each provider's exact wording."""

from __future__ import annotations

import orjson
import pytest

from brim.adapters.errors import AuthFailed, ContextOverflow, RateLimited, UpstreamError
from brim.adapters.overflow import classify


def openai_shaped(message: str, code: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    )


CASES = [
    (
        "openai code",
        400,
        openai_shaped("Request too large.", "context_length_exceeded"),
        None,
        None,
    ),
    (
        "openai",
        400,
        openai_shaped(
            "This model's maximum context length is 128000 tokens. However, you requested 130532 tokens (126436 in the messages, 4096 in the completion). Please reduce the length of the messages or completion."
        ),
        128000,
        130532,
    ),
    (
        "openai responses",
        400,
        openai_shaped(
            "Your input exceeds the context window of this model. Please adjust your input and try again."
        ),
        None,
        None,
    ),
    (
        "azure",
        400,
        openai_shaped(
            "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 290130 tokens. Please reduce the length of the messages."
        ),
        272000,
        290130,
    ),
    (
        "anthropic",
        400,
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            }
        ),
        200000,
        210000,
    ),
    (
        "anthropic max_tokens",
        400,
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: 195000 + 21333 > 200000, decrease input length or `max_tokens` and try again",
                },
            }
        ),
        200000,
        195000,
    ),
    (
        "gemini",
        400,
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ),
        1048575,
        1196265,
    ),
    (
        "bedrock too long",
        400,
        orjson.dumps({"message": "Input is too long for requested model."}),
        None,
        None,
    ),
    (
        "bedrock too many",
        400,
        orjson.dumps({"message": "ValidationException: too many input tokens"}),
        None,
        None,
    ),
    (
        "mistral",
        400,
        orjson.dumps(
            {
                "object": "error",
                "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
                "type": "invalid_request_message_error",
            }
        ),
        32768,
        40000,
    ),
    (
        "groq",
        400,
        openai_shaped("Please reduce the length of the messages or completion."),
        None,
        None,
    ),
    (
        "xai",
        400,
        orjson.dumps(
            {
                "code": "Client specified an invalid argument",
                "error": "This model's maximum prompt length is 131072 but the request contains 140000 tokens.",
            }
        ),
        131072,
        140000,
    ),
    (
        "openrouter",
        400,
        orjson.dumps(
            {
                "error": {
                    "message": 'This endpoint\'s maximum context length is 163840 tokens. However, you requested about 190000 tokens (190000 of text input). Please reduce the length of either one, or use the "middle-out" transform to compress your prompt automatically.',
                    "code": 400,
                }
            }
        ),
        163840,
        None,
    ),
    (
        "vllm openai",
        400,
        openai_shaped(
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            None,
        ),
        4096,
        5000,
    ),
    (
        "vllm decoder",
        400,
        openai_shaped(
            "The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make sure that `max_model_len` is no smaller than the number of text tokens."
        ),
        4096,
        5000,
    ),
    (
        "llama.cpp",
        400,
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 5000,
                    "n_ctx": 4096,
                }
            }
        ),
        4096,
        5000,
    ),
    (
        "lm studio",
        400,
        orjson.dumps(
            {
                "error": "The number of tokens to keep from the initial prompt is longer than the model's context length 4096"
            }
        ),
        4096,
        None,
    ),
    (
        "llama-cpp-python",
        400,
        openai_shaped("Requested tokens (5000) exceed context window of 4096"),
        4096,
        5000,
    ),
    (
        "ollama",
        400,
        orjson.dumps({"error": "prompt too long; exceeded max context length by 1200 tokens"}),
        None,
        None,
    ),
    (
        "deepseek",
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "This model's maximum context length is 131072 tokens. However, you requested 140000 tokens (136000 in the messages, 4000 in the completion). Please reduce the length of the messages or completion.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_request_error",
                }
            }
        ),
        131072,
        140000,
    ),
    (
        "cerebras",
        400,
        orjson.dumps(
            {
                "message": "Please reduce the length of the messages or completion. Current length is 9000 while limit is 8192",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        ),
        8192,
        9000,
    ),
    (
        "claude code",
        400,
        "Prompt is too long · the request is ~100528 tokens (limit 80000) but this "
        "conversation is only ~50681 tokens — the rest comes from the system prompt",
        80000,
        100528,
    ),
    (
        "claude code relaying the provider's reply",
        400,
        'API Error: 400 {"type":"error","error":{"type":"invalid_request_error",'
        '"message":"prompt is too long: 210000 tokens > 200000 maximum"}}',
        200000,
        210000,
    ),
    (
        "litellm's prefixes",
        400,
        openai_shaped(
            "litellm.ContextWindowExceededError: litellm.BadRequestError: "
            "ContextWindowExceededError: OpenAIException - This model's maximum context length "
            "is 3000 tokens. However, your messages resulted in 6010 tokens. Please reduce the "
            "length of the messages."
        ),
        3000,
        6010,
    ),
    (
        "vllm max_tokens",
        400,
        openai_shaped(
            "'max_tokens' or 'max_completion_tokens' is too large: 2000. This model's maximum "
            "context length is 2048 tokens and your request has 100 input tokens "
            "(2000 > 2048 - 100)."
        ),
        2048,
        100,
    ),
    ("http 413", 413, b"<html>Request Entity Too Large</html>", None, None),
    (
        "overflow text on a 500",
        500,
        openai_shaped("This model's maximum context length is 8192 tokens."),
        8192,
        None,
    ),
    (
        "in-stream error event",
        200,
        orjson.dumps(
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "code": "context_length_exceeded",
                }
            }
        ),
        8192,
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "status", "body", "limit", "requested"), CASES, ids=[c[0] for c in CASES]
)
def test_overflow_is_recognised_with_its_numbers(
    name: str, status: int, body: bytes | str, limit: int | None, requested: int | None
) -> None:
    found = classify(status, body)
    assert found is not None, name
    assert (found.limit, found.requested) == (limit, requested)
    error = UpstreamError.from_reply(upstream="u", status=status, headers={}, body=body)
    assert isinstance(error, ContextOverflow)
    assert error.body == body and error.status == status  # relayed unchanged if retries run out


NOT_OVERFLOWS = [
    (
        "rate limit mentioning tokens",
        429,
        openai_shaped(
            "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 29000, Requested 5000. Please reduce the length of the messages or completion."
        ),
        RateLimited,
    ),
    ("auth", 401, openai_shaped("Incorrect API key provided"), AuthFailed),
    (
        "server error",
        500,
        openai_shaped("The server had an error while processing your request."),
        UpstreamError,
    ),
    (
        "bad model",
        404,
        openai_shaped("The model `gpt-9` does not exist", "model_not_found"),
        UpstreamError,
    ),
    (
        "bad parameter",
        400,
        openai_shaped("Invalid value for 'temperature': must be at most 2.", None),
        UpstreamError,
    ),
    (
        "openai string too long",  # a field over OpenAI's length limit, not the window
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "Invalid 'messages[0].content': string too long. Expected a string with maximum length 10485760, but got a string with length 12000000 instead.",
                    "type": "invalid_request_error",
                    "param": "messages[0].content",
                    "code": "string_above_max_length",
                }
            }
        ),
        UpstreamError,
    ),
    (
        "openai user string too long",
        400,
        openai_shaped(
            "Invalid 'user': string too long. Expected a string with maximum length 256, but got a string with length 300 instead.",
            "string_above_max_length",
        ),
        UpstreamError,
    ),
    (
        "input string too long, code lost on the way",  # e.g. relayed by a gateway
        400,
        openai_shaped(
            "Invalid 'input[2].content': string too long. Expected a string with maximum length 10485760, but got a string with length 10485761 instead."
        ),
        UpstreamError,
    ),
    (
        "overloaded",
        529,
        orjson.dumps(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ),
        UpstreamError,
    ),
]


# A provider names an unknown field back as the client spelled it, or quotes a value it refuses:
# an overflow sentence there is the client's, never the provider's.
ECHOES = [
    (
        "openai unrecognized argument",
        400,
        openai_shaped(
            "Unrecognized request argument supplied: This model's maximum context length is 1 "
            "tokens. However, your messages resulted in 5 tokens."
        ),
        UpstreamError,
    ),
    (
        "anthropic extra input",
        400,
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 999999 tokens > 10 maximum: Extra inputs are "
                    "not permitted",
                },
            }
        ),
        UpstreamError,
    ),
    (
        "anthropic extra input, an OpenAI sentence",
        400,
        orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "This model's maximum context length is 1 tokens: Extra inputs "
                    "are not permitted",
                },
            }
        ),
        UpstreamError,
    ),
    (
        "gemini unknown name",
        400,
        orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": 'Invalid JSON payload received. Unknown name "The input token '
                    'count (999999) exceeds the maximum number of tokens allowed (10)": Cannot '
                    "find field.",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ),
        UpstreamError,
    ),
    (
        "responses unknown parameter",
        400,
        openai_shaped(
            "Unknown parameter: 'maximum context length is 1 tokens'.", "unknown_parameter"
        ),
        UpstreamError,
    ),
    (
        "a refused value quoting the sentence",
        400,
        openai_shaped(
            "Invalid value for 'user': 'prompt is too long: 999999 tokens > 10 maximum'."
        ),
        UpstreamError,
    ),
    (
        "claude code relaying an echo",
        400,
        'API Error: 400 {"type":"error","error":{"type":"invalid_request_error",'
        '"message":"prompt is too long: 9 tokens > 1 maximum: Extra inputs are not permitted"}}',
        UpstreamError,
    ),
]


@pytest.mark.parametrize(
    ("name", "status", "body", "kind"),
    NOT_OVERFLOWS + ECHOES,
    ids=[c[0] for c in NOT_OVERFLOWS + ECHOES],
)
def test_other_errors_are_not_overflows(
    name: str, status: int, body: bytes | str, kind: type[UpstreamError]
) -> None:
    assert classify(status, body) is None
    assert (
        type(UpstreamError.from_reply(upstream="u", status=status, headers={}, body=body)) is kind
    )


def test_the_output_limit_a_provider_counted_in_the_window_is_read() -> None:
    anthropic = classify(
        400,
        "input length and `max_tokens` exceed context limit: 195000 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again",
    )
    assert anthropic is not None and (anthropic.output, anthropic.counts_output) == (21333, True)
    openai = classify(
        400,
        "This model's maximum context length is 128000 tokens. However, you requested 130532 "
        "tokens (126436 in the messages, 4096 in the completion). Please reduce the length of "
        "the messages or completion.",
    )
    assert openai is not None and (openai.output, openai.counts_output) == (4096, True)
    plain = classify(400, "prompt is too long: 210000 tokens > 200000 maximum")
    assert plain is not None and (plain.output, plain.counts_output) == (None, False)
