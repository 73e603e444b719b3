"""Token counts: the API's own figures, direct tiktoken counts, the cache, the free bound."""

from __future__ import annotations

import base64
import math
import os
import struct
import subprocess
import sys
from typing import Any

import orjson
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from brim.policies.tokens import TokenCounter
from brim.policies.wires.chat import CHAT
from brim.proxy.resources import use_bundled_tiktoken_files

use_bundled_tiktoken_files()
O200K = tiktoken.get_encoding("o200k_base")

# OpenAI's cookbook sent these to the API and printed usage.prompt_tokens: 124 on gpt-4o and
# gpt-4o-mini, 129 on gpt-4 and gpt-3.5-turbo; with TOOLS, 101 and 105.
JARGON = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]
WEATHER = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]


@pytest.fixture
def counter() -> TokenCounter:
    return TokenCounter()


def n(text: str) -> int:
    return len(O200K.encode_ordinary(text))


@pytest.mark.parametrize(("tokenizer", "api_figure"), [("o200k_base", 124), ("cl100k_base", 129)])
def test_chat_messages_match_the_apis_prompt_tokens(
    counter: TokenCounter, tokenizer: str, api_figure: int
) -> None:
    assert counter.request(CHAT, {"messages": JARGON}, tokenizer).total == api_figure


@pytest.mark.parametrize(("tokenizer", "api_figure"), [("o200k_base", 101), ("cl100k_base", 105)])
def test_tool_definitions_match_the_apis_prompt_tokens(
    counter: TokenCounter, tokenizer: str, api_figure: int
) -> None:
    assert (
        counter.request(CHAT, {"messages": WEATHER, "tools": TOOLS}, tokenizer).total == api_figure
    )


def test_tool_calls_tool_results_and_reasoning_are_counted(counter: TokenCounter) -> None:
    arguments = '{"path": "src/app.py", "lines": [1, 200]}'
    assistant = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "The user wants the file; read it first.",
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "read_file", "arguments": arguments},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "call_abc", "content": "def main():\n    return 42\n"}
    expected_assistant = (
        3
        + n("assistant")
        + n("The user wants the file; read it first.")
        + 3
        + n("call_abc")
        + n("read_file")
        + n(arguments)
    )
    expected_result = 3 + n("tool") + n("def main():\n    return 42\n") + n("call_abc")
    count = counter.request(CHAT, {"messages": [assistant, result]}, "o200k_base")
    assert count.messages == (expected_assistant, expected_result)
    assert count.total == expected_assistant + expected_result + 3


def png_data_url(width: int, height: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return (
        "data:image/png;base64,"
        + base64.b64encode(header + b"\x08\x02\x00\x00\x00" + b"\x00" * 64).decode()
    )


def test_multipart_content_with_images(counter: TokenCounter) -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in these pictures?"},
            {"type": "image_url", "image_url": {"url": png_data_url(1024, 1024), "detail": "high"}},
            {"type": "image_url", "image_url": {"url": png_data_url(2048, 4096)}},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.test/cat.jpg", "detail": "low"},
            },
        ],
    }
    # OpenAI's worked examples: 1024² high = 765; 2048×4096 (auto counted as high) = 1105; low = 85.
    expected = 3 + n("user") + n("What is in these pictures?") + 765 + 1105 + 85
    assert counter.request(CHAT, {"messages": [message]}, "o200k_base").messages == (expected,)


def test_response_format_schema_is_counted(counter: TokenCounter) -> None:
    schema = {
        "name": "answer",
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    body = {"messages": WEATHER, "response_format": {"type": "json_schema", "json_schema": schema}}
    count = counter.request(CHAT, body, "o200k_base")
    assert count.response_format == n(orjson.dumps(schema).decode())
    assert (
        count.total
        == counter.request(CHAT, {"messages": WEATHER}, "o200k_base").total + count.response_format
    )


def test_claude_counts_are_o200k_times_the_calibration_factor() -> None:
    counter = TokenCounter(claude_factor=1.2)
    text = "Claude counts with its own tokenizer; brim estimates it from o200k_base."
    assert counter.text(text, "claude") == math.ceil(n(text) * 1.2)
    message = {"role": "user", "content": text}
    assert counter.message(message, "claude", "", CHAT) == math.ceil(
        (3 + n("user") + n(text)) * 1.2
    )
    with pytest.raises(ValueError):
        TokenCounter(claude_factor=0.9)


def test_a_text_counted_for_claude_and_for_o200k_is_tokenized_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = TokenCounter(claude_factor=1.2)
    encoded: list[str] = []
    real = TokenCounter.encoding

    class Counting:
        def __init__(self, tokenizer: str) -> None:
            self.inner = real(tokenizer)

        def encode_ordinary(self, text: str) -> list[int]:
            encoded.append(text)
            return self.inner.encode_ordinary(text)

    monkeypatch.setattr(TokenCounter, "encoding", staticmethod(Counting))
    text = "A tool result the guard measures for Claude and a summarizer for o200k_base."
    assert counter.raw_text(text, "claude") == counter.raw_text(text, "o200k_base") == n(text)
    assert counter.text(text, "claude") == math.ceil(n(text) * 1.2)  # the factor still applies
    assert counter.text(text, "o200k_base") == n(text)
    assert encoded == [text, text]  # once for raw counts, once for the fixed cost: not 4 times


def test_unknown_tokenizer_is_refused(counter: TokenCounter) -> None:
    with pytest.raises(ValueError, match="p99k"):
        counter.text("x", "p99k")


def session(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: " + "refactor the module " * 20})
        messages.append({"role": "assistant", "content": f"done with step {turn}"})
    return messages


def test_the_cache_makes_turn_n_plus_1_count_only_new_messages(counter: TokenCounter) -> None:
    first = counter.request(CHAT, {"messages": session(50)}, "o200k_base")
    assert (counter.cache_hits, counter.cache_misses) == (0, 101)
    again = counter.request(CHAT, {"messages": session(50)}, "o200k_base")
    assert again == first
    assert (counter.cache_hits, counter.cache_misses) == (101, 101)
    counter.request(CHAT, {"messages": session(51)}, "o200k_base")
    assert (counter.cache_hits, counter.cache_misses) == (202, 103)  # two new messages


def test_a_request_counts_its_messages_as_one_by_one_and_repeats_hit_the_cache(
    counter: TokenCounter,
) -> None:
    twice = {"role": "user", "content": "the same words"}
    messages = [twice, {"role": "assistant", "content": "ok"}, dict(twice), "not an object"]
    counted = counter.request(CHAT, {"messages": messages}, "o200k_base").messages
    assert counted == tuple(TokenCounter().message(m, "o200k_base", "", CHAT) for m in messages[:3])
    assert (counter.cache_hits, counter.cache_misses) == (1, 2)  # the repeat: counted once


def test_the_cache_separates_tokenizers(counter: TokenCounter) -> None:
    message = {"role": "user", "content": "naïve café ☕ 東京"}
    assert counter.message(message, "o200k_base", "", CHAT) != counter.message(
        message, "cl100k_base", "", CHAT
    )
    assert counter.cache_misses == 2


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)


@settings(max_examples=150, deadline=None)
@given(
    contents=st.lists(texts, min_size=1, max_size=6),
    names=st.lists(
        st.one_of(st.none(), st.from_regex(r"[a-z_]{1,12}", fullmatch=True)), min_size=6, max_size=6
    ),
    tokenizer=st.sampled_from(["o200k_base", "cl100k_base", "claude"]),
    with_tools=st.booleans(),
)
def test_the_free_upper_bound_is_never_below_the_exact_count(
    contents: list[str], names: list[str | None], tokenizer: str, with_tools: bool
) -> None:
    counter = TokenCounter()
    messages: list[dict[str, Any]] = []
    for index, content in enumerate(contents):
        message: dict[str, Any] = {
            "role": "user" if index % 2 == 0 else "assistant",
            "content": content,
        }
        if names[index]:
            message["name"] = names[index]
        messages.append(message)
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if with_tools:
        body["tools"] = TOOLS
    raw = orjson.dumps(body)
    assert (
        counter.upper_bound(raw, body, tokenizer, CHAT)
        >= counter.request(CHAT, body, tokenizer).total
    )


def test_counting_never_touches_the_network(tmp_path: Any) -> None:
    """tiktoken downloads encodings it cannot find; brim must find them in litellm's folder."""
    code = (
        "from brim.proxy.resources import use_bundled_tiktoken_files; import os;"
        "folder = use_bundled_tiktoken_files();"
        "from brim.policies.tokens import TokenCounter; c = TokenCounter(); c.warm(['o200k_base', 'cl100k_base']);"
        "print(c.text('hello world', 'o200k_base'), c.text('hello world', 'cl100k_base'), folder)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    env.update(
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        http_proxy="http://127.0.0.1:9",
        XDG_CACHE_HOME=str(tmp_path),
        TMPDIR=str(tmp_path),
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    first, second, folder = result.stdout.split()
    assert (first, second) == ("2", "2")
    assert folder.endswith("litellm/litellm_core_utils/tokenizers")


# The free bound on every wire API, over every content kind each one carries: images (read
# from a data URL's header, or remote and counted at their largest), PDF pages, images inside
# Anthropic tool results, Responses `input_image`, Gemini inline and file data, tool calls and
# definitions (numeric enums cost more tokens than bytes).
def _pdf(pages: int) -> str:
    return base64.b64encode(b"%PDF-1.4\n" + b"1 0 obj << /Type /Page >>\n" * pages).decode()


sizes = st.tuples(st.integers(1, 8000), st.integers(1, 8000))
short = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
image_urls = st.one_of(
    sizes.map(lambda s: png_data_url(*s)), st.just("https://example.com/cat.png")
)
chat_parts = st.one_of(
    short.map(lambda t: {"type": "text", "text": t}),
    st.tuples(image_urls, st.sampled_from([None, "low", "high", "auto"])).map(
        lambda u: {"type": "image_url", "image_url": {"url": u[0], "detail": u[1]}}
    ),
)
chat_messages = st.one_of(
    st.lists(chat_parts, max_size=4).map(lambda c: {"role": "user", "content": c}),
    st.lists(short, min_size=1, max_size=3).map(
        lambda names: {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
                for i, n in enumerate(names)
            ],
        }
    ),
    short.map(lambda t: {"role": "tool", "tool_call_id": "c0", "content": t}),
)
anthropic_images = st.one_of(
    sizes.map(
        lambda s: {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": png_data_url(*s).split(",")[1],
            },
        }
    ),
    st.just({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}),
)
anthropic_blocks = st.one_of(
    short.map(lambda t: {"type": "text", "text": t}),
    anthropic_images,
    st.integers(1, 30).map(
        lambda n: {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": _pdf(n)},
        }
    ),
    st.just({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}),
    st.lists(st.one_of(short.map(lambda t: {"type": "text", "text": t}), anthropic_images)).map(
        lambda inner: {"type": "tool_result", "tool_use_id": "t", "content": inner}
    ),
    short.map(lambda n: {"type": "tool_use", "id": "t", "name": n, "input": {}}),
)
anthropic_messages = st.tuples(
    st.sampled_from(["user", "assistant"]), st.lists(anthropic_blocks, max_size=4)
).map(lambda m: {"role": m[0], "content": m[1]})
responses_items = st.one_of(
    st.lists(
        st.one_of(
            short.map(lambda t: {"type": "input_text", "text": t}),
            st.tuples(image_urls, st.sampled_from(["low", "high", "auto"])).map(
                lambda u: {"type": "input_image", "image_url": u[0], "detail": u[1]}
            ),
            st.just({"type": "input_image", "file_id": "file-1", "detail": "auto"}),
        ),
        max_size=4,
    ).map(lambda c: {"type": "message", "role": "user", "content": c}),
    short.map(lambda n: {"type": "function_call", "call_id": "c", "name": n, "arguments": "{}"}),
    short.map(lambda t: {"type": "function_call_output", "call_id": "c", "output": t}),
)
gemini_parts = st.one_of(
    short.map(lambda t: {"text": t}),
    st.just({"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}),
    st.just({"fileData": {"mimeType": "image/png", "fileUri": "gs://b/a.png"}}),
    short.map(lambda n: {"functionCall": {"name": n, "args": {}}}),
    short.map(lambda n: {"functionResponse": {"name": n, "response": {}}}),
)
gemini_contents = st.tuples(
    st.sampled_from(["user", "model"]), st.lists(gemini_parts, min_size=1, max_size=4)
).map(lambda c: {"role": c[0], "parts": c[1]})
numeric_enum_tools = st.lists(st.integers(0, 9), max_size=30).map(
    lambda values: [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "enum": values}},
                },
            },
        }
    ]
)
bodies = st.one_of(
    st.tuples(st.lists(chat_messages, max_size=6), numeric_enum_tools).map(
        lambda b: ("openai.chat", {"model": "m", "messages": b[0], "tools": b[1]})
    ),
    st.lists(anthropic_messages, max_size=6).map(
        lambda m: ("anthropic.messages", {"model": "m", "max_tokens": 10, "messages": m})
    ),
    st.tuples(st.lists(responses_items, max_size=6), numeric_enum_tools).map(
        lambda b: (
            "openai.responses",
            {"model": "m", "input": b[0], "tools": [t["function"] for t in b[1]]},
        )
    ),
    st.lists(gemini_contents, max_size=6).map(lambda c: ("gemini.generate", {"contents": c})),
)


@settings(max_examples=300, deadline=None)
@given(
    case=bodies,
    tokenizer=st.sampled_from(["o200k_base", "cl100k_base", "claude"]),
    model=st.sampled_from(["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-5"]),
)
def test_the_free_bound_holds_on_every_wire_api_and_content_kind(
    case: tuple[str, dict[str, Any]], tokenizer: str, model: str
) -> None:
    from brim.policies.wires import WIRES

    api, body = case
    wire = WIRES[api]
    counter = TokenCounter()
    exact = counter.request(wire, body, tokenizer, model).total
    assert counter.upper_bound(orjson.dumps(body), body, tokenizer, wire) >= exact


@pytest.mark.parametrize(
    ("api", "body"),
    [
        (  # a remote image in a Responses message: 8 tiles by OpenAI's rule, a few bytes
            "openai.responses",
            {
                "model": "m",
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://e.com/a.png"}]
                        * 20,
                    }
                ],
            },
        ),
        (  # images by URL inside Anthropic tool results
            "anthropic.messages",
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [
                                    {
                                        "type": "image",
                                        "source": {"type": "url", "url": "https://e.com/a"},
                                    }
                                ]
                                * 30,
                            }
                        ],
                    }
                ],
            },
        ),
    ],
)
def test_the_bound_counts_images_where_the_old_bound_missed_them(
    api: str, body: dict[str, Any]
) -> None:
    from brim.policies.wires import WIRES

    counter = TokenCounter()
    wire = WIRES[api]
    exact = counter.request(wire, body, "o200k_base", "gpt-4o-mini").total
    assert exact > 10 * len(orjson.dumps(body))  # images cost far more than their bytes
    assert counter.upper_bound(orjson.dumps(body), body, "o200k_base", wire) >= exact


class _CountedEncoding:
    """An encoding that counts how often it is asked to encode."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding
        self.calls = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: list[int]) -> str:
        return self._encoding.decode(tokens)


class _CountingCounter(TokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.counted = _CountedEncoding(O200K)

    def encoding(self, tokenizer: str) -> Any:  # type: ignore[override]
        return self.counted


SYSTEM = "You are a careful coding agent. " * 400
FIXED_COST_BODIES = {
    "openai.chat": {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": TOOLS,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
    },
    "openai.responses": {"instructions": SYSTEM, "input": "hi", "tools": TOOLS},
    "anthropic.messages": {
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "read", "description": "read a file", "input_schema": {}}],
    },
    "gemini.generate": {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "read"}]}],
    },
}


@pytest.mark.parametrize("api", FIXED_COST_BODIES)
def test_the_system_prompt_and_tools_are_tokenized_once_not_every_request_and_pass(
    api: str,
) -> None:
    from brim.policies.tokens import CounterMeter
    from brim.policies.wires import WIRES

    wire, body = WIRES[api], FIXED_COST_BODIES[api]
    counter = _CountingCounter()
    first = counter.request(wire, body, "o200k_base")
    encoded = counter.counted.calls
    assert encoded > 0
    meter = CounterMeter(counter, "o200k_base", "", wire)
    assert counter.request(wire, body, "o200k_base") == first
    assert meter.fixed(body) == first.total - sum(first.messages)
    assert meter.fixed(body) == first.total - sum(first.messages)
    assert counter.counted.calls == encoded  # every figure came from a cache


@pytest.mark.parametrize("api", FIXED_COST_BODIES)
def test_the_fixed_cost_is_the_request_without_its_conversation(api: str) -> None:
    from brim.policies.tokens import CounterMeter
    from brim.policies.wires import WIRES

    wire, body = WIRES[api], FIXED_COST_BODIES[api]
    counter = TokenCounter()
    bare = wire.with_conversation(body, [])
    meter = CounterMeter(counter, "claude", "", wire)
    assert meter.fixed(body) == counter.request(wire, bare, "claude").total
    assert counter.fixed(wire, body, "claude") == meter.fixed(body)


def test_tool_definitions_are_cached_by_content_and_tokenizer() -> None:
    counter = TokenCounter()
    assert counter.tools(TOOLS, "o200k_base") == counter.tools(
        orjson.loads(orjson.dumps(TOOLS)), "o200k_base"
    )
    assert counter.tools(TOOLS, "claude") == math.ceil(counter.tools(TOOLS, "o200k_base") * 1.15)
    changed = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "other_name"}}]
    assert counter.tools(changed, "o200k_base") != counter.tools(TOOLS, "o200k_base")


def test_texts_measured_for_one_request_are_not_tokenized_again_for_the_next() -> None:
    """A meter lives for one request; what it measures (tool results, evicted transcripts)
    comes back the next turn, through a new meter: the counter remembers it."""
    from brim.policies.tokens import CounterMeter

    counter = _CountingCounter()
    text = "an evicted transcript, summarized every turn " * 200
    first = CounterMeter(counter, "o200k_base", "m", CHAT).text_tokens(text)
    assert counter.counted.calls == 1
    assert CounterMeter(counter, "o200k_base", "m", CHAT).text_tokens(text) == first
    assert counter.counted.calls == 1


def test_a_meter_counts_many_messages_as_it_counts_each() -> None:
    from brim.policies.tokens import CounterMeter
    from brim.policies.wires import WIRES

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "count me " * 40},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "def f(): pass\n" * 30},
    ]
    counter = TokenCounter()
    meter = CounterMeter(counter, "o200k_base", "gpt-4o", WIRES["openai.chat"])
    each = tuple(
        CounterMeter(TokenCounter(), "o200k_base", "gpt-4o", CHAT).message(m) for m in messages
    )
    assert meter.messages(messages) == each  # counted, then…
    assert meter.messages(messages) == each  # …from the cache
    assert counter.cache_hits == len(messages)
