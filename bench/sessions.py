"""Long, realistic coding-agent sessions with planted facts, for the fidelity benchmark.

A session is written once, in a neutral form (`Session`: a system prompt, tool definitions and
turns), and rendered in each wire API brim serves, tool calls paired as each API wants them:
Chat Completions `tool_calls` and `tool` messages, Anthropic Messages `tool_use` /
`tool_result` blocks, Responses `function_call` / `function_call_output` items, Gemini
`functionCall` / `functionResponse` parts.

What a session holds, in the proportions of a real agent run: file reads (the same file read again
later, sometimes after an edit), JSON API results (arrays of objects with ids, urls and nulls),
build logs (noise with one warning or error line), test output, grep hits, plain assistant
chatter, and user corrections mid-session. Facts — unique sentences such as "FACT-0042 the staging
deploy key rotates on tuesdays" — are planted inside JSON values, log lines, file contents and
user messages, all along the session and in its last messages too. Everything is deterministic
given the seed.

About a third of the tool steps are followed by a step that acts on what an earlier result said
(`Generator.follow_up`: the file of a grep hit or a build error, an item's URL from an API
listing, the failing test alone, the callers of a function a file defines), so that the
session's assistant turns use ids, numbers and paths first seen in tool results — its
next-action evidence (`bench.evidence`). They come from a random stream of their own.

Those facts are easy to keep for a compressor that keeps a result's rare lines (brim's digest
scores a line by how rare its words are within the result, `policies.information`): "fact" is a
word no other line of the result has. So a session also holds look-alike facts, planted where
nothing tells them from their neighbours: an ops-registry listing (`run_command` running
`opsctl facts list`), 20 to 80 lines of one template, every line a sentence from the facts' own
vocabulary after an id of the registry's, newest first:

    2024-11-11  dmitri   stale   FACT-11E5 the redis cluster runs at 1440 utc
    2024-11-11  freya    active  FACT-5001 the billing cron expires after 3128 minutes
    2024-11-08  omar     review  FACT-CE57 the billing cron retries 3 times before paging

The registry's ids are four hex digits, a decoy's with at least one letter A-F; one line
(sometimes two) has an id of four decimal digits, and only it matches `FACT_PATTERN` (four
decimal digits): that line is the planted fact, the others are decoys, never counted. Every line
has the word "fact" (hex and decimal ids alike are dropped from the words a rarity measure sees:
`policies.information.words` drops numbers and hex strings), and the planted line is chosen among
the lines with no word of their own (each of its words is on another line too), so by its words
it is an ordinary line of its listing: over 756 listings, its `line_scores` score beat 44% of its
listing's other entries on average, spread evenly (deciles 7% … 82%), the best of them 5 times.
Look-alike facts are numbered from `LOOKALIKE_FIRST` up and recorded in `Session.lookalikes`.
They are drawn from a random stream of their own, and their listings are left out of the length
a session is steered to, so a seed's other turns are exactly those of a session without them
(`generate(..., lookalikes=False)`); a session is that much longer (about 9%).
"""

from __future__ import annotations

import datetime
import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from brim.policies.information import words

FACT_PATTERN = re.compile(r"FACT-\d{4}[a-z0-9 \-]*[a-z0-9]")
# A planted fact or a look-alike listing's decoy (whose id has a hex letter): what a summarizer
# that cannot know which lines the bench tracks would see as equally worth keeping.
STATEMENT_PATTERN = re.compile(r"FACT-[0-9A-F]{4}[a-z0-9 \-]*[a-z0-9]")
LOOKALIKE_FIRST = 5_000  # look-alike facts are FACT-5000 up, apart from the others' ids

MODELS = {
    "openai.chat": "gpt-bench",
    "anthropic.messages": "claude-bench",
    "openai.responses": "gpt-bench",
    "gemini.generate": "gemini-bench",
}
API_LABELS = {
    "openai.chat": "Chat",
    "anthropic.messages": "Messages",
    "openai.responses": "Responses",
    "gemini.generate": "Gemini",
}
ANTHROPIC_MAX_TOKENS = 4_096


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]
    result: str


@dataclass(frozen=True, slots=True)
class Turn:
    """A user message, or an assistant message (text, tool calls, or both); an assistant turn's
    calls carry their results, which every API renders right after it."""

    role: Literal["user", "assistant"]
    text: str | None
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class Session:
    seed: int
    system: str
    tools: list[Tool]
    turns: list[Turn] = field(default_factory=list)
    lookalikes: set[str] = field(default_factory=set)  # the look-alike facts' ids ("FACT-5003")

    def request_points(self) -> list[int]:
        """Where a client would send a request: after each user turn and after each tool step's
        results (the number of turns the request carries)."""
        return [
            n + 1
            for n, turn in enumerate(self.turns)
            if turn.role == "user" or (turn.role == "assistant" and turn.calls)
        ]

    def facts(self) -> list[str]:
        """Every fact planted (look-alike facts too: `is_lookalike`), in order of first
        appearance."""
        found: dict[str, None] = {}
        for turn in self.turns:
            for text in (turn.text or "", *(c.result for c in turn.calls)):
                for fact in FACT_PATTERN.findall(text):
                    found[fact] = None
        return list(found)

    def is_lookalike(self, fact: str) -> bool:
        """Whether `fact` was planted among look-alike lines (a registry listing's)."""
        return fact.split()[0] in self.lookalikes


# ---------------------------------------------------------------- rendering, one API each

Item = dict[str, Any]


def _args(call: Call) -> str:
    return orjson.dumps(call.arguments).decode()


def _anthropic_id(call: Call) -> str:
    return "toolu_" + call.id.removeprefix("call_")


class Renderer(ABC):
    """One wire API's rendering of a session. The walk is shared: each user turn is one item,
    each assistant turn its items then, if it made calls, their results' items. Each API only
    says how it writes those, a tool definition, and the body around them."""

    def __call__(self, session: Session, turns: int | None = None) -> dict[str, Any]:
        conversation: list[Item] = []
        for turn in session.turns[:turns]:
            if turn.role == "user":
                conversation.append(self.user(turn.text))
                continue
            conversation += self.assistant(turn)
            if turn.calls:
                conversation += self.results(turn.calls)
        return self.body(session, conversation, [self.tool(tool) for tool in session.tools])

    @abstractmethod
    def user(self, text: str | None) -> Item: ...

    @abstractmethod
    def assistant(self, turn: Turn) -> list[Item]: ...

    @abstractmethod
    def results(self, calls: tuple[Call, ...]) -> list[Item]: ...

    @abstractmethod
    def tool(self, tool: Tool) -> Item: ...

    @abstractmethod
    def body(self, session: Session, conversation: list[Item], tools: list[Item]) -> Item: ...


class ChatRenderer(Renderer):
    def user(self, text: str | None) -> Item:
        return {"role": "user", "content": text}

    def assistant(self, turn: Turn) -> list[Item]:
        message: Item = {"role": "assistant", "content": turn.text}
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _args(call)},
                }
                for call in turn.calls
            ]
        return [message]

    def results(self, calls: tuple[Call, ...]) -> list[Item]:
        return [{"role": "tool", "tool_call_id": call.id, "content": call.result} for call in calls]

    def tool(self, tool: Tool) -> Item:
        return {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }

    def body(self, session: Session, conversation: list[Item], tools: list[Item]) -> Item:
        return {
            "model": MODELS["openai.chat"],
            "messages": [{"role": "system", "content": session.system}, *conversation],
            "tools": tools,
        }


class MessagesRenderer(Renderer):
    def user(self, text: str | None) -> Item:
        return {"role": "user", "content": text}

    def assistant(self, turn: Turn) -> list[Item]:
        blocks: list[Item] = [{"type": "text", "text": turn.text}] if turn.text else []
        blocks += [
            {
                "type": "tool_use",
                "id": _anthropic_id(call),
                "name": call.name,
                "input": call.arguments,
            }
            for call in turn.calls
        ]
        return [{"role": "assistant", "content": blocks}]

    def results(self, calls: tuple[Call, ...]) -> list[Item]:
        return [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": _anthropic_id(call),
                        "content": call.result,
                    }
                    for call in calls
                ],
            }
        ]

    def tool(self, tool: Tool) -> Item:
        return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}

    def body(self, session: Session, conversation: list[Item], tools: list[Item]) -> Item:
        return {
            "model": MODELS["anthropic.messages"],
            "max_tokens": ANTHROPIC_MAX_TOKENS,
            "system": session.system,
            "tools": tools,
            "messages": conversation,
        }


class ResponsesRenderer(Renderer):
    def user(self, text: str | None) -> Item:
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    def assistant(self, turn: Turn) -> list[Item]:
        items: list[Item] = []
        if turn.text:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.text}],
                }
            )
        items += [
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": _args(call),
            }
            for call in turn.calls
        ]
        return items

    def results(self, calls: tuple[Call, ...]) -> list[Item]:
        return [
            {"type": "function_call_output", "call_id": call.id, "output": call.result}
            for call in calls
        ]

    def tool(self, tool: Tool) -> Item:
        return {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }

    def body(self, session: Session, conversation: list[Item], tools: list[Item]) -> Item:
        return {
            "model": MODELS["openai.responses"],
            "instructions": session.system,
            "tools": tools,
            "input": conversation,
        }


class GeminiRenderer(Renderer):
    def user(self, text: str | None) -> Item:
        return {"role": "user", "parts": [{"text": text}]}

    def assistant(self, turn: Turn) -> list[Item]:
        parts: list[Item] = [{"text": turn.text}] if turn.text else []
        parts += [
            {"functionCall": {"id": call.id, "name": call.name, "args": call.arguments}}
            for call in turn.calls
        ]
        return [{"role": "model", "parts": parts}]

    def results(self, calls: tuple[Call, ...]) -> list[Item]:
        responses = [
            {"functionResponse": {"id": c.id, "name": c.name, "response": {"output": c.result}}}
            for c in calls
        ]
        return [{"role": "user", "parts": responses}]

    def tool(self, tool: Tool) -> Item:
        return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}

    def body(self, session: Session, conversation: list[Item], tools: list[Item]) -> Item:
        return {
            "systemInstruction": {"parts": [{"text": session.system}]},
            "tools": [{"functionDeclarations": tools}],
            "contents": conversation,
        }


chat_body = ChatRenderer()
messages_body = MessagesRenderer()
responses_body = ResponsesRenderer()
gemini_body = GeminiRenderer()
RENDER: dict[str, Renderer] = {
    "openai.chat": chat_body,
    "anthropic.messages": messages_body,
    "openai.responses": responses_body,
    "gemini.generate": gemini_body,
}


def system_of(api: str, body: dict[str, Any]) -> Any:
    """Where each API keeps the system prompt (for Chat: the first message)."""
    if api == "openai.chat":
        messages = body.get("messages") or []
        return messages[0] if messages and messages[0].get("role") == "system" else None
    if api == "anthropic.messages":
        return body.get("system")
    if api == "openai.responses":
        return body.get("instructions")
    return body.get("systemInstruction")


# ---------------------------------------------------------------- the generator

SYSTEM_PARAGRAPHS = [
    "You are an autonomous coding agent working in the user's repository. You can read and edit "
    "files, search the code, call the team's internal HTTP APIs, run the build and run the tests. "
    "Work in small, verifiable steps and explain briefly what you are doing and why.",
    "Rules: never commit, push or rewrite history. Never print secrets, tokens or keys even when "
    "a file or an API result contains them. Prefer the smallest change that fixes the problem; do "
    "not reformat code you did not otherwise change; keep public interfaces stable unless the "
    "user asks you to change them.",
    "When you read a file, read it whole unless it is very large. When a command fails, read the "
    "whole error before acting. When the user corrects you, follow the correction from then on "
    "and say what you will do differently. When you are unsure which of two approaches the user "
    "wants, ask instead of guessing.",
    "Tool use: call tools with exact arguments; paths are relative to the repository root. "
    "run_build and run_tests stream their whole output back; http_get returns the raw JSON the "
    "service answered with. Several independent tool calls may be made in one step.",
    "Style: Python 3.11, type hints everywhere, ruff's default rules, docstrings on public "
    "functions, tests with pytest next to the code they test under tests/. Logging goes through "
    "the module's own logger, never print().",
    "Environment: Linux, the repository is checked out at /workspace/app, Python is at "
    ".venv/bin/python, the internal APIs are reachable at https://api.internal.example with the "
    "credentials already configured. Today's date is 2025-03-14.",
]

TOOLS = [
    Tool(
        "read_file",
        "Read a file of the repository and return its content.",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "path from the repo root"}},
            "required": ["path"],
        },
    ),
    Tool(
        "edit_file",
        "Replace one exact occurrence of old with new in a file.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "path from the repo root"},
                "old": {"type": "string", "description": "the exact text to replace"},
                "new": {"type": "string", "description": "the replacement"},
            },
            "required": ["path", "old", "new"],
        },
    ),
    Tool(
        "grep",
        "Search the repository for a regular expression; returns path:line: text hits.",
        {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern"],
        },
    ),
    Tool(
        "http_get",
        "GET a URL of the internal APIs and return the JSON body.",
        {
            "type": "object",
            "properties": {"url": {"type": "string", "description": "an absolute URL"}},
            "required": ["url"],
        },
    ),
    Tool(
        "run_build",
        "Run the build for a target and return its full log.",
        {
            "type": "object",
            "properties": {
                "target": {"type": "string", "enum": ["all", "api", "worker", "export"]},
            },
            "required": ["target"],
        },
    ),
    Tool(
        "run_tests",
        "Run pytest on a selector and return its output.",
        {
            "type": "object",
            "properties": {"selector": {"type": "string", "description": "pytest node or path"}},
            "required": ["selector"],
        },
    ),
]

COMMAND_TOOL = Tool(  # in sessions with look-alike facts: how their listings come
    "run_command",
    "Run a shell command in the repository root and return its output (stdout and stderr).",
    {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the command line"}},
        "required": ["command"],
    },
)

SUBJECTS = [
    "the staging deploy key",
    "the billing cron",
    "the nightly export",
    "the payments webhook",
    "the ci runner pool",
    "the feature flag checkout-v2",
    "the redis cluster",
    "the auth token ttl",
    "the on-call rotation",
    "the search index rebuild",
    "the invoice pdf renderer",
    "the eu customer data",
    "the legacy orders table",
    "the rate limiter",
    "the s3 archive bucket",
    "the grafana alert for queue depth",
]
PREDICATES = [
    "rotates on {day}",
    "runs at {hh}{mm} utc",
    "is owned by {person}",
    "lives in region {region}",
    "must stay below {n} mb",
    "was last migrated in build {n}",
    "expires after {n} minutes",
    "listens on port {port}",
    "is paused until ticket ops-{n} closes",
    "retries {small} times before paging",
]
DAYS = ["mondays", "tuesdays", "wednesdays", "thursdays", "fridays", "saturdays", "sundays"]
PEOPLE = ["priya", "tomasz", "ngozi", "kenji", "lucia", "omar", "freya", "dmitri", "amara"]
REGIONS = ["eu-west-2", "us-east-1", "ap-south-1", "eu-central-1", "us-west-2", "sa-east-1"]

MODULES = ["billing", "export", "orders", "auth", "search", "payments", "notify", "reports"]
FILES = [
    f"src/{module}/{name}.py"
    for module in MODULES
    for name in ("client", "models", "service", "tasks", "utils")
]
NAMES = [
    "invoice",
    "customer",
    "order",
    "line_item",
    "total",
    "currency",
    "region",
    "batch",
    "cursor",
    "payload",
    "status",
    "retry",
    "window",
    "record",
    "account",
    "export_job",
]
LOG_SOURCES = ["compiler", "resolver", "bundler", "cache", "linker", "typecheck", "assets", "deps"]
CHATTER = [
    "The log shows the failure comes from {path}, not from the API layer as I first thought.",
    "So the {name} field can be null when the upstream service times out; the code assumes it "
    "never is. That matches the KeyError in the report.",
    "The tests that fail all touch {name}; the rest of the suite passes, so the change is "
    "contained.",
    "I checked the API result: every record has an id and a url, and some have a null {name}. "
    "I will handle the null case explicitly rather than defaulting it silently.",
    "Before changing {path} I want to see how {name} is used elsewhere, so I'll grep for it.",
    "The build is clean apart from one deprecation warning that is unrelated to this change.",
    "I have a fix in mind: guard the lookup of {name} in {path} and add a regression test for "
    "the null case. Does that match what you want?",
    "Summary so far: the export reads {name} from the cached batch, the cache entry expires "
    "early under load, and the retry path skips the refresh. I'll fix the retry path first.",
]
CORRECTIONS = [
    "Actually, don't touch {path}; it is generated from the schema. Change the template instead.",
    "Wait — use the v3 endpoint, not v2. The v2 one is being decommissioned.",
    "Please don't add a new dependency for this, the standard library is enough.",
    "Also run the slow tests for {module}, CI runs them too.",
    "That's not what I meant: keep the old behaviour for existing customers behind the flag.",
    "Good. Now make sure the same bug is not in the {module} worker as well.",
    "Stop — the null {name} is legitimate for draft invoices, don't raise on it.",
]

TODAY = datetime.date(2025, 3, 14)  # as the system prompt says
TEAMS = ["platform", "payments", "data", "growth", "billing"]
FACT_STATES = ["active", "active", "active", "review", "stale"]
LISTING_CHATTER = [
    "Before I change the schedule, let me check what the ops registry records for the {team} team.",
    "The registry may say who owns this; listing the {team} team's entries.",
    "Checking the {team} team's ops facts for anything about the export or its cron.",
]


def _statement(rng: random.Random) -> str:
    """A fact's sentence without its id: "the billing cron runs at 0930 utc"."""
    predicate = rng.choice(PREDICATES).format(
        day=rng.choice(DAYS),
        hh=f"{rng.randrange(24):02d}",
        mm=f"{rng.randrange(0, 60, 5):02d}",
        person=rng.choice(PEOPLE),
        region=rng.choice(REGIONS),
        n=rng.randrange(10, 9_000),
        port=rng.randrange(1_024, 65_000),
        small=rng.randrange(2, 9),
    )
    return f"{rng.choice(SUBJECTS)} {predicate}"


def _registry_id(rng: random.Random) -> str:
    """A decoy's id: four hex digits, at least one a letter (so `FACT_PATTERN`, which wants four
    decimal digits, does not match it) and one a digit (so it is a hex string, not a word)."""
    while True:
        ident = f"{rng.getrandbits(16):04X}"
        if any(c.isalpha() for c in ident) and any(c.isdigit() for c in ident):
            return ident


class Generator:
    """Builds one session; every choice comes from its own seeded random stream, the look-alike
    listings' from another one (`lookalike_rng`), so they shift none of the others."""

    def __init__(self, seed: int, fact_start: int = 1) -> None:
        self.rng = random.Random(seed)
        self.lookalike_rng = random.Random(seed * 7919 + 1)
        self.follow_rng = random.Random(seed * 104_729 + 7)  # follow-up steps: `follow_up`
        self.observed: list[Call] = []  # the tool calls made so far (listings aside)
        self.seed = seed
        self.next_fact = fact_start
        self.next_lookalike = LOOKALIKE_FIRST
        self.lookalikes: list[str] = []  # the look-alike facts' ids, as planted
        self.next_call = 0
        self.files: dict[str, list[str]] = {}
        self.read: list[str] = []

    # -- pieces

    def fact(self) -> str:
        text = f"FACT-{self.next_fact:04d} {_statement(self.rng)}"
        self.next_fact += 1
        return text

    def maybe_fact(self, chance: float) -> str | None:
        return self.fact() if self.rng.random() < chance else None

    def call_id(self) -> str:
        self.next_call += 1
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        return "call_" + "".join(self.rng.choice(alphabet) for _ in range(22))

    def words(self, template: str) -> str:
        rng = self.rng
        return template.format(
            path=rng.choice(FILES),
            name=rng.choice(NAMES),
            module=rng.choice(MODULES),
        )

    # -- tool results

    def source_file(self, path: str, fact: str | None) -> list[str]:
        rng = self.rng
        module = path.split("/")[1]
        lines = [
            f'"""{module.title()} {path.rsplit("/", 1)[1][:-3]}: part of the {module} service."""',
            "",
            "from __future__ import annotations",
            "",
            "import logging",
            "from dataclasses import dataclass",
            "from typing import Any",
            "",
            f"from src.{module} import models",
            "",
            "log = logging.getLogger(__name__)",
            "",
        ]
        for _ in range(rng.randrange(3, 12)):
            name = rng.choice(NAMES)
            other = rng.choice(NAMES)
            body = [
                f"def {rng.choice(['load', 'build', 'sync', 'resolve', 'apply'])}_{name}(",
                f"    {other}: models.{other.title().replace('_', '')}, *, retries: int = 3",
                ") -> dict[str, Any] | None:",
                f'    """Return the {name} for a {other}, or None when it is not ready yet."""',
                f"    if {other} is None:",
                "        return None",
                f"    result = {{'id': {other}.id, '{name}': {other}.{name}}}",
                "    for attempt in range(retries):",
                f"        if result['{name}'] is not None:",
                "            break",
                f"        log.debug('waiting for {name} of %s (attempt %d)', {other}.id, attempt)",
                "    return result",
                "",
                "",
            ]
            lines += [*body[: rng.randrange(6, len(body) + 1)], ""]
        if fact:
            at = rng.randrange(10, len(lines))
            lines.insert(at, f"# NOTE: {fact}.")
        return lines

    def read_file(self, path: str, fact_chance: float) -> str:
        if path not in self.files:
            self.files[path] = self.source_file(path, self.maybe_fact(fact_chance))
        self.read.append(path)
        return "\n".join(self.files[path]) + "\n"

    def edit_file(self, path: str) -> tuple[dict[str, Any], str]:
        lines = self.files[path]
        candidates = [i for i, line in enumerate(lines) if "return None" in line] or [
            len(lines) - 1
        ]
        at = self.rng.choice(candidates)
        old = lines[at]
        new = old.replace("return None", "return {}") if "return None" in old else old + "  # ok"
        lines[at] = new
        arguments = {"path": path, "old": old.strip(), "new": new.strip()}
        return arguments, f"Edited {path}: replaced 1 occurrence (line {at + 1})."

    def api_result(self, fact: str | None) -> tuple[dict[str, Any], str]:
        rng = self.rng
        kind = rng.choice(["orders", "customers", "invoices", "jobs", "deployments"])
        page = rng.randrange(1, 9)
        url = f"https://api.internal.example/v2/{kind}?page={page}&per_page=50"
        count = rng.randrange(6, 45)
        items = []
        for n in range(count):
            ident = rng.randrange(10_000, 99_999)
            items.append(
                {
                    "id": ident,
                    "name": f"{kind[:-1]}-{ident}",
                    "status": rng.choice(["active", "pending", "failed", "archived"]),
                    "url": f"https://api.internal.example/v2/{kind}/{ident}",
                    "html_url": f"https://console.internal.example/{kind}/{ident}",
                    "owner": None
                    if rng.random() < 0.4
                    else {"id": rng.randrange(100, 999), "login": rng.choice(PEOPLE)},
                    "region": rng.choice(REGIONS),
                    "amount": round(rng.uniform(1, 5_000), 2),
                    "tags": rng.sample(["eu", "vip", "trial", "legacy", "beta", "internal"], 2),
                    "description": None,
                    "updated_at": f"2025-03-{rng.randrange(1, 14):02d}T{rng.randrange(24):02d}:00:00Z",
                    "n": n,
                }
            )
        if fact:
            items[rng.randrange(count)]["description"] = f"{fact}."
        payload = {"data": items, "page": page, "total": count + rng.randrange(0, 400)}
        option = orjson.OPT_INDENT_2 if rng.random() < 0.5 else 0
        return {"url": url}, orjson.dumps(payload, option=option).decode()

    def build_log(self, fact: str | None) -> tuple[dict[str, Any], str]:
        rng = self.rng
        target = rng.choice(["all", "api", "worker", "export"])
        total = rng.randrange(40, 220)
        lines = [f"$ make build TARGET={target}", f"[00:00:00] INFO  starting build of {target}"]
        for n in range(total):
            stamp = f"[00:{n // 60:02d}:{n % 60:02d}]"
            source = rng.choice(LOG_SOURCES)
            if rng.random() < 0.6:
                lines.append(
                    f"{stamp} INFO  {source}: compiling {rng.choice(FILES)} ({n + 1}/{total})"
                )
            else:
                lines.append(
                    f"{stamp} DEBUG {source}: cache hit for {rng.choice(NAMES)} "
                    f"({rng.randrange(100, 9_999)} bytes, key {rng.getrandbits(48):012x})"
                )
        notable = [
            f"[00:01:07] WARNING typecheck: {rng.choice(FILES)}:{rng.randrange(10, 200)}: "
            "implicit Optional is deprecated",
        ]
        if rng.random() < 0.5:
            notable.append(
                f"[00:02:13] ERROR linker: {rng.choice(FILES)}:{rng.randrange(10, 200)}: "
                f"name '{rng.choice(NAMES)}' is not defined"
            )
        if fact:
            notable.append(f"[00:01:30] INFO  deploy-config: {fact}.")
        for line in notable:
            lines.insert(rng.randrange(2, len(lines)), line)
        failed = any("ERROR" in line for line in notable)
        lines.append(f"[00:05:59] {'FAILED' if failed else 'OK'}  build of {target}")
        return {"target": target}, "\n".join(lines)

    def test_output(self, fact: str | None) -> tuple[dict[str, Any], str]:
        rng = self.rng
        module = rng.choice(MODULES)
        selector = f"tests/{module}"
        names = [f"test_{rng.choice(NAMES)}_{n}" for n in range(rng.randrange(20, 90))]
        failing = rng.choice(names)
        lines = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0",
            f"collected {len(names)} items",
            "",
        ]
        for n, name in enumerate(names):
            outcome = "FAILED" if name == failing else "PASSED"
            lines.append(
                f"{selector}/test_{module}.py::{name} {outcome} [{100 * (n + 1) // len(names):3d}%]"
            )
        lines += [
            "",
            "=================================== FAILURES ===================================",
            f"___________________________ {failing} ___________________________",
            "",
            f"    def {failing}():",
            f"        record = make_{rng.choice(NAMES)}(status='draft')",
            f">       assert export(record)['{rng.choice(NAMES)}'] is not None",
            "E       KeyError: 'total'",
            "",
            f"src/{module}/service.py:{rng.randrange(20, 200)}: KeyError",
        ]
        if fact:
            lines += [
                "----------------------------- Captured stdout call -----------------------------",
                f"{fact}.",
            ]
        lines.append(
            f"========================= 1 failed, {len(names) - 1} passed in "
            f"{rng.uniform(1, 30):.2f}s ========================="
        )
        return {"selector": selector}, "\n".join(lines)

    def grep(self, fact: str | None) -> tuple[dict[str, Any], str]:
        rng = self.rng
        name = rng.choice(NAMES)
        hits = [
            f"{rng.choice(FILES)}:{rng.randrange(1, 300)}:    result = lookup_{name}(record, "
            f"retries={rng.randrange(1, 5)})"
            for _ in range(rng.randrange(3, 25))
        ]
        if fact:
            hits.insert(
                rng.randrange(len(hits) + 1),
                f"{rng.choice(FILES)}:{rng.randrange(1, 300)}:    # lookup_{name}: {fact}.",
            )
        return {"pattern": f"lookup_{name}\\(", "path": "src"}, "\n".join(hits)

    def registry_listing(self, team: str) -> tuple[dict[str, Any], str]:
        """`opsctl facts list`: 20 to 80 registry entries of one template, newest first, each a
        fact-like sentence; one (sometimes two) of them a planted look-alike fact."""
        rng = self.lookalike_rng
        rows = [
            [
                (TODAY - datetime.timedelta(days=rng.randrange(150))).isoformat(),
                rng.choice(PEOPLE),
                rng.choice(FACT_STATES),
                _registry_id(rng),
                _statement(rng),
            ]
            for _ in range(rng.randrange(20, 81))
        ]

        def line(row: list[str]) -> str:
            updated, owner, state, ident, statement = row
            return f"{updated}  {owner:<7}  {state:<6}  FACT-{ident} {statement}"

        # The planted line has no word of its own: each of its words is on another line too,
        # words as a rarity measure sees them (numbers and hex ids dropped).
        seen = [set(words(line(row))) for row in rows]
        counts: dict[str, int] = {}
        for found in seen:
            for word in found:
                counts[word] = counts.get(word, 0) + 1
        ordinary = [n for n, found in enumerate(seen) if all(counts[w] > 1 for w in found)]
        # Possible, if rare: every line with a word of its own. Of 200,000 listings of 20 lines
        # drawn, none was, but 6 had one line without a word of its own.
        ordinary = ordinary or list(range(len(rows)))
        planted = min(len(ordinary), 1 if rng.random() < 0.75 else 2)
        for n in rng.sample(ordinary, planted):
            rows[n][3] = f"{self.next_lookalike:04d}"
            self.lookalikes.append(f"FACT-{self.next_lookalike:04d}")
            self.next_lookalike += 1
        rows.sort(key=lambda row: row[0], reverse=True)
        command = f"opsctl facts list --team {team} --sort=-updated"
        lines = [
            f"$ {command}",
            "UPDATED     OWNER    STATE   FACT",
            *map(line, rows),
            f"{len(rows)} entries, team {team}",
        ]
        return {"command": command}, "\n".join(lines)

    def lookalike_step(self) -> Turn:
        """An assistant step listing the ops registry (`registry_listing`), all of it from the
        look-alike stream."""
        rng = self.lookalike_rng
        team = rng.choice(TEAMS)
        arguments, result = self.registry_listing(team)
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        call_id = "call_" + "".join(rng.choice(alphabet) for _ in range(22))
        said = None
        if rng.random() < 0.5:
            said = rng.choice(LISTING_CHATTER).format(team=team)
        return Turn("assistant", said, (Call(call_id, "run_command", arguments, result),))

    # -- follow-up steps: the next call built from what an earlier result said

    def follow_up(self) -> Turn | None:
        """Now and then (a third of the tool steps), a step that acts on what an earlier result
        said: the file of a grep hit or of a build error, the URL of an item an API listed, the
        test that failed, a function a file defines. Its source is the latest result half the
        time, else any earlier one. All from `follow_rng`, with no fact of its own, so that the
        session's other turns draw the same choices whatever follows them."""
        rng = self.follow_rng
        if not self.observed or rng.random() >= 0.35:
            return None
        source = self.observed[-1] if rng.random() < 0.5 else rng.choice(self.observed)
        made = self._follow(source)
        if made is None:
            return None
        said, name, arguments, result = made
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        call_id = "call_" + "".join(rng.choice(alphabet) for _ in range(22))
        call = Call(call_id, name, arguments, result)
        self.observed.append(call)
        return Turn("assistant", said if rng.random() < 0.7 else None, (call,))

    def _follow(self, source: Call) -> tuple[str, str, dict[str, Any], str] | None:
        rng = self.follow_rng
        if source.name in ("grep", "run_build"):
            hits = re.findall(r"(src/[\w/]+\.py):(\d+)", source.result)
            if not hits:
                return None
            path, line = rng.choice(hits)
            said = f"{path}:{line} is the spot; reading {path}."
            return said, "read_file", {"path": path}, self._file_text(path)
        if source.name == "http_get":
            urls = re.findall(
                r'"url":"(https://[^"]+/(\d+))"', source.result.replace('": "', '":"')
            )
            if not urls:
                return None
            url, ident = rng.choice(urls)
            status = rng.choice(["active", "pending", "failed", "archived"])
            record = {
                "id": int(ident),
                "status": status,
                "url": url,
                "events": rng.randrange(1, 40),
            }
            return (
                f"Fetching item {ident} on its own.",
                "http_get",
                {"url": url},
                orjson.dumps(record).decode(),
            )
        if source.name == "run_tests":
            failing = re.search(r"^(\S+::\S+) FAILED", source.result, re.MULTILINE)
            if failing is None:
                return None
            node = failing.group(1)
            tail = source.result.split("= FAILURES =", 1)[-1].strip("= \n")
            result = f"{node} FAILED\n{tail}"
            return f"Running {node} alone.", "run_tests", {"selector": node}, result
        if source.name == "read_file":
            names = re.findall(r"^def (\w+)\(", source.result, re.MULTILINE)
            if not names:
                return None
            name = rng.choice(names)
            hits = [
                f"{path}:{n + 1}:{line}"
                for path, lines in sorted(self.files.items())
                for n, line in enumerate(lines)
                if name in line
            ][:30]
            said = f"{source.arguments['path']} defines {name}; looking for its callers."
            return said, "grep", {"pattern": name, "path": "src"}, "\n".join(hits)
        return None

    def _file_text(self, path: str) -> str:
        """A file's text for a follow-up read: as last read, or made now from `follow_rng` (with
        no fact), without drawing from the session's own stream."""
        if path not in self.files:
            own, self.rng = self.rng, self.follow_rng
            try:
                self.files[path] = self.source_file(path, None)
            finally:
                self.rng = own
        self.read.append(path)
        return "\n".join(self.files[path]) + "\n"

    # -- turns

    def tool_call(self, fact_chance: float, small: bool = False) -> Call:
        rng = self.rng
        kinds = ["read", "read", "api", "build", "tests", "grep", "grep", "reread", "edit", "edit"]
        if small:
            kinds = ["read", "api", "grep", "edit", "tests"]
        kind = rng.choice(kinds)
        if kind in ("reread", "edit") and not self.read:
            kind = "read"
        fact = self.maybe_fact(fact_chance)
        if kind in ("read", "reread"):
            path = rng.choice(self.read) if kind == "reread" else rng.choice(FILES)
            if fact and path not in self.files:
                self.files[path] = self.source_file(path, fact)
            return Call(self.call_id(), "read_file", {"path": path}, self.read_file(path, 0))
        if kind == "edit":
            arguments, result = self.edit_file(rng.choice(self.read))
            return Call(self.call_id(), "edit_file", arguments, result)
        if kind == "api":
            arguments, result = self.api_result(fact)
            return Call(self.call_id(), "http_get", arguments, result)
        if kind == "build":
            arguments, result = self.build_log(fact)
            return Call(self.call_id(), "run_build", arguments, result)
        if kind == "tests":
            arguments, result = self.test_output(fact)
            if small:
                result = "\n".join(result.splitlines()[-14:])
            return Call(self.call_id(), "run_tests", arguments, result)
        arguments, result = self.grep(fact)
        return Call(self.call_id(), "grep", arguments, result)

    def tool_step(self, fact_chance: float, small: bool = False) -> Turn:
        rng = self.rng
        calls = tuple(
            self.tool_call(fact_chance, small)
            for _ in range(1 if rng.random() < 0.8 else rng.randrange(2, 4))
        )
        said = None
        if rng.random() < 0.35:
            said = self.words(rng.choice(CHATTER))
        self.observed += calls
        return Turn("assistant", said, calls)

    def user_message(self, fact_chance: float) -> str:
        text = self.words(self.rng.choice(CORRECTIONS))
        fact = self.maybe_fact(fact_chance)
        if fact:
            text += f" For context: {fact}."
        return text


def _size(turn: Turn) -> int:
    """A rough token estimate (3 bytes a token: code, JSON and logs are dense) to steer a
    session's length."""
    return (len(turn.text or "") + sum(len(c.result) + 60 for c in turn.calls)) // 3 + 8


def generate(
    seed: int,
    tokens: int,
    *,
    ending: Literal["user", "tools"] | None = None,
    lookalikes: bool = True,
) -> Session:
    """A session of about `tokens` tokens (Chat, o200k): system prompt and task, then tool steps,
    chatter and user corrections, and a last stretch of smaller steps with a fact in each, so the
    last eight messages hold facts too. It ends on a user message or on tool results (`ending`;
    by default alternating with the seed). With `lookalikes`, a registry listing with look-alike
    facts about every 15,000 tokens (at least one), before the last stretch, on top of that
    length: the other turns are the same without them."""
    gen = Generator(seed)
    rng = gen.rng
    system = "\n\n".join(SYSTEM_PARAGRAPHS)
    task = (
        "The nightly export job fails intermittently with a KeyError in src/export/service.py. "
        "Find the cause, fix it, and make sure the test suite passes. Don't change the public "
        f"API of src/billing/client.py. One more thing: {gen.fact()}."
    )
    tools = [*TOOLS, COMMAND_TOOL] if lookalikes else list(TOOLS)
    session = Session(seed, system, tools, [Turn("user", task)])
    used = len(system) // 3 + 600 + _size(session.turns[0])
    tail = max(600, min(2_400, tokens // 12))
    # Where listings go: once `used` passes each mark (one in each of `listings` equal stretches).
    listings = max(1, round(tokens / 15_000)) if lookalikes else 0
    marks = [
        (n + gen.lookalike_rng.uniform(0.1, 0.9)) * (tokens - tail) / listings
        for n in range(listings)
    ]
    while used < tokens - tail:
        if marks and used >= marks[0]:
            marks.pop(0)
            session.turns.append(gen.lookalike_step())
        if rng.random() < 0.12:
            chatter = Turn("assistant", gen.words(rng.choice(CHATTER)))
            user = Turn("user", gen.user_message(0.5))
            session.turns += [chatter, user]
            used += _size(chatter) + _size(user)
            continue
        step = gen.tool_step(0.6)
        session.turns.append(step)
        used += _size(step)
        followed = gen.follow_up()
        if followed is not None:
            session.turns.append(followed)
            used += _size(followed)
    session.turns += [gen.lookalike_step() for _ in marks]  # any the loop ended before
    session.lookalikes.update(gen.lookalikes)
    # The last stretch: small steps, each with a fact, then the ending.
    end = ending or ("user" if seed % 2 == 0 else "tools")
    session.turns.append(gen.tool_step(1.0, small=True))
    session.turns += [
        Turn("assistant", gen.words(rng.choice(CHATTER))),
        Turn("user", gen.user_message(1.0)),
    ]
    session.turns.append(gen.tool_step(1.0, small=True))
    if end == "user":
        session.turns += [
            Turn("assistant", gen.words(rng.choice(CHATTER))),
            Turn("user", gen.user_message(1.0)),
        ]
    else:
        session.turns.append(gen.tool_step(1.0, small=True))
    return session


PLACES = {
    "read_file": "file",
    "http_get": "JSON value",
    "run_build": "log line",
    "run_tests": "test output",
    "grep": "grep hit",
    "run_command": "look-alike line",
}


def fact_places(session: Session) -> dict[str, str]:
    """Where each fact was planted (its first appearance): "user message", "file", "JSON value",
    "log line", "test output", "grep hit" or "look-alike line" (a registry listing's)."""
    places: dict[str, str] = {}
    for turn in session.turns:
        for fact in FACT_PATTERN.findall(turn.text or ""):
            places.setdefault(fact, "user message")
        for call in turn.calls:
            for fact in FACT_PATTERN.findall(call.result):
                places.setdefault(fact, PLACES.get(call.name, call.name))
    return places
