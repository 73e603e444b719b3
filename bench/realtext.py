"""Real-text sessions: an exploring agent (`bench.explore`) whose tools the bench runs itself.

Every tool result is what a real command printed at generation time on a real checkout (a clone
of a real repository, some of its tests failing, facts planted in its files) and on this
machine's installed packages: `ls -la`, `git log`, `git show`, `git blame`, `grep -rn`, pytest's
failures and tracebacks, `pip list`, `pip show`, and files read whole or around a line. Each
assistant turn acts on a token an earlier result printed (`bench.explore.Explorer`), so its
next-action evidence is real. Saved as Chat Completions session files (`bench.corpus`), made by
`python -m bench.capture --real-text`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.corpus import SessionFile
from bench.evidence import found, plain
from bench.explore import Explorer, Planted, Step, prepare, run_step
from bench.sessions import Call, Session, Tool, Turn, chat_body

SYSTEM = (
    "You are a coding agent working in the user's checkout, with three tools: read_file (a file, "
    "whole or from a line), grep (a pattern under a path) and run_command (a shell command in the "
    "checkout's root). Work step by step; say briefly what you look at and why. Do not edit "
    "files unless the user asks."
)
TASK = (
    "The test suite of this checkout fails since the last changes. Find out why: which tests "
    "fail, where in the code, and which commits touched that code. Don't change anything yet; "
    "tell me what you find."
)
TOOLS = [
    Tool(
        "read_file",
        "Read a file (path from the checkout's root, or absolute); its lines come numbered.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer", "description": "the first line to show"},
                "line_count": {"type": "integer", "description": "how many lines to show"},
            },
            "required": ["path"],
        },
    ),
    Tool(
        "grep",
        "Search files for a regular expression (grep -rn); returns path:line:text hits.",
        {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern"],
        },
    ),
    Tool(
        "run_command",
        "Run a shell command in the checkout's root; returns its output and exit code.",
        {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    ),
]
CHARS_PER_TOKEN = 3.6  # code, logs and listings: to steer a session's length


def call_of(step: Step, number: int, result: str) -> Call:
    """A step as a call of this session's tools."""
    arguments = step.arguments
    if step.kind == "read":
        name = "read_file"
        args: dict[str, Any] = {"path": arguments["path"]}
        if arguments.get("start"):
            args |= {"start_line": arguments["start"], "line_count": arguments["count"]}
    elif step.kind == "grep":
        name, args = "grep", {"pattern": arguments["pattern"], "path": arguments["path"]}
    else:
        name, args = "run_command", {"command": arguments["command"]}
    return Call(f"call_{number:03d}", name, args, result)


def explore(root: Path, seed: int, tokens: int) -> Session:
    """An exploring session on `root`, run until it is about `tokens` long."""
    agent = Explorer(root, seed)
    session = Session(seed, SYSTEM, TOOLS, [Turn("user", TASK)])
    size = len(SYSTEM) + len(TASK)
    number = 0
    while size < tokens * CHARS_PER_TOKEN:
        step = agent.next()
        if step is None:
            break
        result = run_step(step, root)
        agent.seen(step, result)
        number += 1
        call = call_of(step, number, result)
        session.turns.append(Turn("assistant", step.said, (call,)))
        size += len(result) + len(step.said or "") + 80
    return session


def kept_facts(session: Session, planted: list[Planted]) -> list[str]:
    """The planted facts the session read, each once (a needle in the tool results only)."""
    body = chat_body(session)
    text = plain(body["messages"])
    return sorted({p.needle for p in planted if found(p.needle, text)})


def build(
    repo: Path, work: Path, name: str, seed: int, tokens: int, origin: str = ""
) -> SessionFile:
    """One real-text session on a fresh checkout of `repo` (named `origin`) under `work`, as a
    session file."""
    root = work / name / "checkout"
    planted = prepare(repo, root, seed)
    session = explore(root, seed, tokens)
    return SessionFile(
        name=name,
        family="real-text",
        api="openai.chat",
        body=chat_body(session),
        facts=kept_facts(session, planted),
        source=f"bench.realtext on a clone of {origin or repo.name} (seed {seed}); "
        f"{len(planted)} facts planted in the checkout",
    )
