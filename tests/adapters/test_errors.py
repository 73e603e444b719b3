"""brim's own errors as each wire API words them."""

from __future__ import annotations

import orjson

from brim.adapters.errors import ContextTooLarge
from brim.policies.wires import WIRES
from brim.policies.wires.base import Refusal

REFUSAL = Refusal(tokens_in=250_000, limit=200_000, how="the newest message alone is too long")


def test_context_too_large_says_in_openais_words_what_openai_clients_are_told() -> None:
    error = ContextTooLarge(REFUSAL, param="messages")
    assert error.message == REFUSAL.openai_message()
    for api in ("openai.chat", "openai.responses"):
        body = orjson.loads(WIRES[api].error_body(error.info()))
        assert body["error"]["message"] == error.message
        assert body["error"]["code"] == "context_length_exceeded"


def test_the_other_apis_word_a_refusal_their_own_way() -> None:
    info = ContextTooLarge(REFUSAL).info()
    anthropic = orjson.loads(WIRES["anthropic.messages"].error_body(info))
    assert anthropic["error"]["message"].startswith("prompt is too long: 250000 tokens > 200000")
    gemini = orjson.loads(WIRES["gemini.generate"].error_body(info))
    assert gemini["error"]["message"].startswith("The input token count (250000) exceeds")
