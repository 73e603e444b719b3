"""`python -m bench.capture`: make the session files of the fidelity bench's real families.

    python -m bench.capture                 # both families, into bench/corpus/
    python -m bench.capture --family real-text
    python -m bench.capture --family real-cli --repo ~/src/itsdangerous --repo ~/src/jmespath.py

- real-text (`bench.realtext`): an exploring agent (`bench.explore`) whose tools the bench runs
  itself on a fresh checkout of each repository: real command output, real files, real JSON.
- real-cli: the real Claude Code and Codex CLIs (pinned in tests/real_clis.py, run offline as
  tests/test_real_clis.py runs them) pointed at a scripted provider
  (tests/exploring_provider.py) whose every turn is the exploring agent's next step, made with
  the CLI's own tools — Claude Code's Read, Grep and Bash, Codex's exec_command — on a fresh
  checkout. The CLI runs the tools; the session is the last request it sent, in its own wire
  format (Messages, Responses), kept as it came.

The repositories default to the snapshots this machine keeps of pallets/itsdangerous and
jmespath/jmespath.py (any git repository works: a clone is taken, its history real). Each
checkout has facts planted and a small change that fails some tests (`bench.explore.prepare`).
The files are written gzipped, `NAME.json.gz` (`bench.corpus`); the bench reads them with
`python -m bench.fidelity` (the committed ones) or `--sessions DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import corpus, explore, realtext
from bench.corpus import SessionFile
from bench.evidence import found, plain

CORPUS = Path(__file__).parent / "corpus"
REPOS = (
    Path("/work/.mirror/pallets+itsdangerous/repo"),
    Path("/work/.mirror/jmespath+jmespath.py/repo"),
)
TASK = realtext.TASK
CLI_TIMEOUT_S = 900
WINDOW = 900_000  # the scripted provider's window (in the model's name): nothing overflows


@dataclass(frozen=True)
class Cli:
    """How the exploring agent's steps are made with one CLI's own tools."""

    name: str
    api: str  # the session's wire API
    tool: str  # the tool whose presence marks a main turn
    model: str

    def call(self, step: explore.Step, root: Path) -> tuple[str, dict[str, Any]]:
        """The CLI tool call (name, arguments) that makes `step` on the checkout at `root`."""
        arguments = step.arguments
        if self.name == "claude":
            if step.kind == "read":
                path = str(_absolute(root, str(arguments["path"])))
                read: dict[str, Any] = {"file_path": path}
                if arguments.get("start"):
                    read |= {"offset": arguments["start"], "limit": arguments["count"]}
                return "Read", read
            if step.kind == "grep":
                where = str(_absolute(root, str(arguments.get("path") or ".")))
                grep = {"pattern": arguments["pattern"], "path": where, "output_mode": "content"}
                return "Grep", grep | {"-n": True, "head_limit": 60}
            command = str(arguments["command"])
            return "Bash", {"command": command, "description": step.said or command[:60]}
        if step.kind == "read":
            path = str(arguments["path"])
            command = f"cat -n {path}"
            if arguments.get("start"):
                last = int(arguments["start"]) + int(arguments["count"]) - 1
                command += f" | sed -n '{arguments['start']},{last}p'"
        elif step.kind == "grep":
            command = explore.grep_command(arguments)
        else:
            command = str(arguments["command"])
        # Not a login shell: a login shell sets PATH anew, without this Python (pytest, pip).
        return "exec_command", {"cmd": command, "login": False, "yield_time_ms": 30_000}


def _absolute(root: Path, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() else (root / path).resolve()


CLAUDE = Cli("claude", "anthropic.messages", "Read", f"claude-sonnet-4-5-{WINDOW}")
CODEX = Cli("codex", "openai.responses", "exec_command", f"resp-{WINDOW}")


def _tests(name: str) -> Any:
    """A module of tests/ (the fakes and the real CLIs' runners), which bench/ does not type."""
    return importlib.import_module(name)


def command(cli: Cli, base: str, home: Path) -> tuple[list[str], dict[str, str]]:
    """The CLI's command line and environment, pointed at the provider at `base`, offline: as
    tests/test_real_clis.py runs it, with the task as its prompt, Claude Code with its Read,
    Grep and Bash tools allowed and turns enough."""
    runners = _tests("tests.test_real_clis")
    exe = _tests("tests.real_clis").cli_dir() / "bin" / cli.name
    if cli.name == "claude":
        _, env = runners.claude_command(exe, home, base, cli.model)
        tools = "Read,Grep,Bash"
        argv = [str(exe), "-p", TASK, "--model", cli.model, "--tools", tools]
        return [*argv, "--allowedTools", tools, "--max-turns", "500"], env
    argv, env = runners.codex_command(exe, home, base, cli.model)
    return [*argv[:-1], TASK], env  # its prompt last


class Driver:
    """The provider's main turns: the result of the last step, read from the CLI's request,
    shown to the explorer; its next step as this CLI's tool call, until the request is about
    `tokens` long (then None: the final answer)."""

    def __init__(self, cli: Cli, agent: explore.Explorer, tokens: int) -> None:
        self.cli = cli
        self.agent = agent
        self.tokens = tokens
        self.previous: explore.Step | None = None
        self.steps = 0

    def __call__(
        self, api: str, body: dict[str, Any]
    ) -> tuple[str | None, str, dict[str, Any]] | None:
        if self.previous is not None:
            turns = corpus.neutral(api, body).session.turns
            calls = [c for t in turns if t.role == "assistant" for c in t.calls]
            self.agent.seen(self.previous, calls[-1].result if calls else "")
        if len(orjson.dumps(body)) / realtext.CHARS_PER_TOKEN >= self.tokens:
            return None
        step = self.agent.next()
        if step is None:
            return None
        self.previous = step
        self.steps += 1
        name, arguments = self.cli.call(step, self.agent.root)
        return step.said, name, arguments


async def drive(cli: Cli, root: Path, home: Path, seed: int, tokens: int) -> dict[str, Any]:
    """One CLI session on the checkout at `root`: the last request the CLI sent."""
    provider = _tests("tests.exploring_provider")
    fakes = _tests("tests.fakes")
    driver = Driver(cli, explore.Explorer(root, seed), tokens)
    fake = provider.ExploringSession(
        cli.tool, lambda step: {}, 0, "That is what I found.", next_turn=driver
    )
    runner, url = await fakes.start_app(fake.app())
    try:
        argv, extra = command(cli, url, home)
        bin_dir = _tests("tests.real_clis").cli_dir() / "bin"
        env = {**_tests("tests.test_real_clis").offline_env(bin_dir, home), **extra}
        checkout = explore.environment(root)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        env["PYTHONPATH"] = checkout["PYTHONPATH"]
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    finally:
        await runner.cleanup()
    problems = fake.overflows + fake.rejections + fake.unknown_paths
    finals = [c for c in fake.calls if c.main and c.reply == "final"]
    if process.returncode != 0 or problems or not finals:
        raise RuntimeError(
            f"{cli.name} exited {process.returncode} after {driver.steps} steps; "
            f"problems {problems}\n{out.decode()[-2000:]}\n{err.decode()[-3000:]}"
        )
    body: dict[str, Any] = finals[-1].body
    return body


def facts_read(api: str, body: dict[str, Any], planted: list[explore.Planted]) -> list[str]:
    """The planted facts the session's conversation holds."""
    from brim.policies.wires import WIRES

    text = plain(WIRES[api].conversation(body))
    return sorted({p.needle for p in planted if found(p.needle, text)})


def capture_cli(cli: Cli, repo: Path, work: Path, name: str, seed: int, tokens: int) -> SessionFile:
    root = work / name / "checkout"
    home = work / name / "cli-home"
    planted = explore.prepare(repo, root, seed)
    home.mkdir(parents=True, exist_ok=True)
    body = asyncio.run(drive(cli, root, home, seed, tokens))
    return SessionFile(
        name=name,
        family="real-cli",
        api=cli.api,
        body=body,
        facts=facts_read(cli.api, body, planted),
        source=f"{cli.name} {_tests('tests.real_clis').PINS[cli.name][1]} on a clone of "
        f"{_origin(repo)} (seed {seed}), its tools run by the CLI; "
        f"{len(planted)} facts planted in the checkout",
    )


def _origin(repo: Path) -> str:
    """A repository's name as a snapshot's folder names it (`owner+name/repo`), or its own."""
    return repo.parent.name.replace("+", "/") if repo.name == "repo" else repo.name


Job = tuple[str, Callable[[Path], SessionFile]]


def jobs(families: set[str], repos: list[Path], tokens: int) -> list[Job]:
    """(session name, how to make it) for every session of the families asked for."""
    planned: list[Job] = []
    for n, repo in enumerate(repos):
        short = _origin(repo).rsplit("/", 1)[-1].split(".")[0]
        seed = 101 + n
        if "real-text" in families:
            for k in (0, 1):
                name = f"real-text-{short}-{k + 1}"

                def text_job(
                    work: Path, repo: Path = repo, name: str = name, seed: int = seed + 10 * k
                ) -> SessionFile:
                    return realtext.build(repo, work, name, seed, tokens, _origin(repo))

                planned.append((name, text_job))
        if "real-cli" in families:
            for k, cli in enumerate((CLAUDE, CODEX)):
                name = f"real-cli-{cli.name}-{short}"
                # Claude Code's own prompt and tools take 11K tokens of the session.
                size = int(tokens * 1.3) if cli is CLAUDE else tokens

                def cli_job(
                    work: Path,
                    cli: Cli = cli,
                    repo: Path = repo,
                    name: str = name,
                    seed: int = seed + 20 + 10 * k,
                    size: int = size,
                ) -> SessionFile:
                    return capture_cli(cli, repo, work, name, seed, size)

                planned.append((name, cli_job))
    return planned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.capture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--family", action="append", choices=["real-text", "real-cli"])
    parser.add_argument("--repo", action="append", type=Path, help="a git repository to clone")
    parser.add_argument("--out", type=Path, default=CORPUS)
    parser.add_argument("--tokens", type=int, default=60_000, help="each session's length, about")
    parser.add_argument("--only", help="make only the session of this name")
    args = parser.parse_args(argv)
    repos = args.repo or [repo for repo in REPOS if repo.exists()]
    if not repos:
        parser.error("no repository: pass --repo PATH (a git repository to clone)")
    families = set(args.family or ["real-text", "real-cli"])
    work = Path(tempfile.mkdtemp(prefix="brim-capture-"))
    try:
        for name, make in jobs(families, repos, args.tokens):
            if args.only and name != args.only:
                continue
            started = time.perf_counter()
            made = make(work)
            path = corpus.save(args.out, made)
            print(
                f"{path}: {len(made.facts)} facts, {path.stat().st_size // 1024} KB, "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
