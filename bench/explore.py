"""An agent that explores a real checkout, each step built from what its tools said before.

`Explorer` plays the model's side of a coding session on a real folder (a clone of a real
repository, with the Python packages installed beside it): it starts with the commands an agent
starts with (`ls -la`, `git log`, the test suite) and then, step after step, acts on a token an
earlier tool result printed — reads the file at the `path:line` of a traceback or a grep hit,
shows the commit whose hash `git log` printed, greps for a function a file defines, runs the
test that failed alone, lists a folder `ls -la` showed, asks pip about a package `pip list`
named. The result it acts on is the latest one half the time, else any earlier one, so the next
step needs what an older result said, as a real agent's often does. Its words before each call
quote what it acts on. Nothing here knows how brim compresses: the choices are uniform draws
among what the results offer.

It speaks in three abstract tools (`Step.kind`): "read" a file (a path, optionally a first line
and a count), "grep" a pattern under a path, and "shell" a command. `bench.realtext` runs them
itself; `bench.capture` has the real Claude Code and Codex CLIs run them with their own tools.

`prepare` makes the checkout: a clone of the repository, its files' times set to its last
commit's, a small real change that makes some of its tests fail (`MUTATIONS`), and planted
facts (`plant`): in some of its files, a copy of one of the file's own lines (a comment, a
docstring line, a line of prose or a JSON description) inserted after it with one number
changed to a fresh one. The fresh number is the fact: a line that looks like its neighbours.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PACKAGES = sysconfig.get_paths()["purelib"]  # this Python's installed packages
# The pytest run an agent starts with, and the one with the plugins of this environment that
# the checkout's own warning filters turn into errors switched off.
PYTEST = "python -m pytest -q -p no:cacheprovider"
PYTEST_PLAIN = f"{PYTEST} -p no:asyncio -p no:aiohttp"
OPENERS = (
    "ls -la",
    "git log --oneline -n 40",
    f"{PYTEST} 2>&1 | tail -n 40",
    f"{PYTEST_PLAIN} 2>&1 | tail -n 60",
    "git log --stat -n 6",
    "pip list 2>/dev/null | head -n 70",
    "find . -name '*.py' -not -path './.git/*' | sort | head -n 80",
    # Real JSON documents: the installed packages' own (schemas, data, metadata), and a slice
    # of the model map litellm ships.
    f"find {PACKAGES} -maxdepth 4 -name '*.json' -size -60k -not -path '*/botocore/*' "
    "-not -path '*/boto3/*' | sort | head -n 40",
    f"grep -n -A 16 '\"claude-sonnet-4' {PACKAGES}/litellm/model_prices_and_context_window_backup.json"
    " | head -n 150",
    "wc -l $(git ls-files '*.py' '*.rst' '*.md' '*.json') | sort -n | tail -n 30",
)
MAX_LINES = 400  # a tool result's lines at most (a longer one says how many more there were)
MAX_CHARS = 30_000
LINES_PER_FACT = 30  # a planted fact per this many lines of a file
# Small real changes that make some of a repository's tests fail: (file, text, replacement).
MUTATIONS = (
    ("src/itsdangerous/signer.py", "for s in secret_key]", "for s in secret_key[:1]]"),
    ("jmespath/functions.py", "return len(arg)\n", "return len(arg) - 1\n"),
)
TEXT_SUFFIXES = {".py", ".rst", ".md", ".txt", ".json", ".toml", ".cfg", ".ini", ".yml", ".yaml"}
PROSE_SUFFIXES = TEXT_SUFFIXES - {".py", ".json"}
NUMBER = re.compile(r"(?<![\w.])\d{2,}(?![\w])")
JSON_DESCRIPTION = re.compile(r'^\s*"(comment|description|title|summary|note)"\s*:\s*"')


@dataclass(frozen=True)
class Step:
    kind: Literal["read", "grep", "shell"]
    arguments: dict[str, Any]  # read: path, start, count; grep: pattern, path; shell: command
    said: str | None  # the words before the call
    uses: tuple[str, ...] = ()  # the tokens of earlier results it acts on
    key: str = ""  # what makes it the same step as another (default: kind and arguments)

    @property
    def signature(self) -> str:
        return self.key or f"{self.kind}:{sorted(self.arguments.items())}"


@dataclass(frozen=True)
class Seen:
    step: Step
    result: str


@dataclass(frozen=True)
class Planted:
    path: str
    line: int
    text: str
    needle: str  # the fresh number: the fact


# ---------------------------------------------------------------- the checkout


def environment(root: Path) -> dict[str, str]:
    """The environment commands run in: this Python's bin folder first (python, pytest, pip),
    the checkout's packages importable, no colours."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"])
    return {
        "PATH": path,
        "HOME": str(root.parent / "home"),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "TERM": "dumb",
        "PYTHONPATH": os.pathsep.join(str(root / p) for p in ("src", ".")),
        "PYTHONDONTWRITEBYTECODE": "1",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
    }


def prepare(repo: Path, root: Path, seed: int, share: float = 0.9) -> list[Planted]:
    """Clone `repo` into `root` (a real checkout with its history), set every file's time to the
    last commit's, apply the `MUTATIONS` that fit, and plant facts in about `share` of its text
    files (`plant`)."""
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", str(repo), str(root)], check=True)
    (root.parent / "home").mkdir(exist_ok=True)
    stamp = int(
        subprocess.run(
            ["git", "log", "-1", "--format=%ct"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        or 0
    )
    mutated = set()
    for path, old, new in MUTATIONS:
        target = root / path
        if target.is_file() and old in target.read_text():
            target.write_text(target.read_text().replace(old, new, 1))
            mutated.add(path)
    planted = plant(root, random.Random(seed), share, skip=mutated)
    # The planted lines are not a change git shows (the mutation is): a CLI's system prompt
    # lists the modified files, and `git diff` would show every planted line at once.
    touched = sorted({p.path for p in planted})
    if touched:
        subprocess.run(
            ["git", "update-index", "--assume-unchanged", *touched], cwd=root, check=True
        )
    for each in files(root):
        os.utime(each, (stamp, stamp))
    return planted


def files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if ".git" not in path.relative_to(root).parts and path.is_file():
            yield path


def plant(
    root: Path, rng: random.Random, share: float, skip: set[str] | None = None
) -> list[Planted]:
    """In about `share` of the text files under `root` that have lines to copy (`copyable`),
    one fact per `LINES_PER_FACT` lines (at least one): a copy of such a line inserted after
    it, one of its numbers replaced by a fresh one of at least 5 digits that appears nowhere
    else in the checkout."""
    everything = "\n".join(p.read_text(errors="replace") for p in files(root))
    planted: list[Planted] = []
    for path in files(root):
        if path.suffix not in TEXT_SUFFIXES or path.stat().st_size > 200_000:
            continue
        if str(path.relative_to(root)) in (skip or set()):
            continue
        text = path.read_text(errors="replace")
        lines = text.split("\n")
        candidates = copyable(path.suffix, text)
        if not candidates or rng.random() >= share:
            continue
        count = min(len(candidates), max(1, len(lines) // LINES_PER_FACT))
        here: list[tuple[int, str, str]] = []
        for at in sorted(rng.sample(candidates, count), reverse=True):  # bottom up: lines stay put
            number = rng.choice(list(NUMBER.finditer(lines[at])))
            while True:
                needle = str(rng.randrange(10_000, 1_000_000))
                if needle not in everything:
                    break
            copy = lines[at][: number.start()] + needle + lines[at][number.end() :]
            lines.insert(at + 1, copy)
            everything += "\n" + copy
            here.append((at, copy, needle))
        path.write_text("\n".join(lines))
        # Where each copy ended up, once all are in (line numbers from 1).
        for n, (at, copy, needle) in enumerate(sorted(here)):
            planted.append(Planted(str(path.relative_to(root)), at + 2 + n, copy.strip(), needle))
    return planted


def copyable(suffix: str, text: str) -> list[int]:
    """The lines of a file that a copy of can go after unnoticed: in Python, comments and the
    inner lines of multi-line strings; in prose files, any line; in JSON, a description-like
    field's line. Only lines with a number of two digits or more."""
    lines = text.split("\n")
    if suffix == ".py":
        found: set[int] = set()
        try:
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
                    found.add(token.start[0] - 1)
                elif token.type == tokenize.STRING and token.end[0] - token.start[0] >= 2:
                    found.update(range(token.start[0], token.end[0] - 1))  # inner lines
        except (tokenize.TokenError, SyntaxError, IndentationError):
            return []
        chosen = sorted(found)
    elif suffix == ".json":
        chosen = [n for n, line in enumerate(lines) if JSON_DESCRIPTION.match(line)]
    elif suffix in PROSE_SUFFIXES:
        chosen = [n for n, line in enumerate(lines) if line.strip() and "```" not in line]
    else:
        chosen = []
    return [n for n in chosen if n < len(lines) and NUMBER.search(lines[n])]


# ---------------------------------------------------------------- running a step


def clip(text: str) -> str:
    """A tool result as a tool would return it: at most `MAX_LINES` lines and `MAX_CHARS`."""
    lines = text.split("\n")
    more = len(lines) - MAX_LINES
    if more > 0:
        text = "\n".join(lines[:MAX_LINES]) + f"\n... ({more} more lines)"
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + f"\n... ({len(text) - MAX_CHARS} more characters)"
    return text


def run_shell(command: str, root: Path, timeout: float = 120) -> str:
    """`command` run by bash in `root`: its output (stdout and stderr), and its exit code when
    it failed, as an agent's shell tool returns them."""
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=root,
            env=environment(root),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"(timed out after {timeout:.0f} s)"
    output = (done.stdout + done.stderr).rstrip("\n")
    if done.returncode:
        output += f"\n(exit code {done.returncode})"
    return clip(output)


def run_step(step: Step, root: Path) -> str:
    """What the bench's own tools answer (`bench.realtext`): a file's numbered lines, grep's
    hits, a command's output."""
    arguments = step.arguments
    if step.kind == "read":
        path = resolve(root, str(arguments["path"]))
        if path is None or not path.is_file():
            return f"error: no such file: {arguments['path']}"
        lines = path.read_text(errors="replace").split("\n")
        start = int(arguments.get("start") or 1)
        count = int(arguments.get("count") or MAX_LINES)
        shown = lines[start - 1 : start - 1 + count]
        text = "\n".join(f"{start + n:>6}\t{line}" for n, line in enumerate(shown))
        rest = len(lines) - (start - 1 + len(shown))
        return clip(text + (f"\n... ({rest} more lines)" if rest > 0 else ""))
    if step.kind == "grep":
        return run_shell(grep_command(arguments), root)
    return run_shell(str(arguments["command"]), root)


def grep_command(arguments: dict[str, Any]) -> str:
    pattern = str(arguments["pattern"]).replace("'", "'\\''")
    return f"grep -rn --exclude-dir=.git -e '{pattern}' {arguments.get('path') or '.'} | head -n 60"


def resolve(root: Path, name: str) -> Path | None:
    """A path a result named, if it is a file or folder here: relative to `root`, or absolute
    (inside the checkout or this Python's installed packages)."""
    name = name.strip().strip("'\"`,;()[]")
    if not name or "\x00" in name:
        return None
    path = Path(name)
    candidate = path if path.is_absolute() else root / path
    try:
        candidate = candidate.resolve()
    except (OSError, RuntimeError):
        return None
    inside = [root.resolve(), Path(sys.prefix).resolve()]
    if not any(candidate == base or base in candidate.parents for base in inside):
        return None
    return candidate if candidate.exists() else None


# ---------------------------------------------------------------- the agent


PATH_LINE = re.compile(r"([\w./\-]*[\w\-]+\.(?:py|pyi|rst|md|txt|json|toml|cfg|ini)):(\d+)")
TRACEBACK = re.compile(r'File "([^"]+)", line (\d+)')
PATH = re.compile(
    r"(?<![\w/.\-])((?:/|\./)?[\w.\-]+(?:/[\w.\-]+)*\.(?:py|rst|md|txt|json|toml|cfg|ini|yml|yaml|lock|in))\b"
)
HASH_LINE = re.compile(r"^(?:commit )?([0-9a-f]{7,40})\b", re.MULTILINE)
DEFINED = re.compile(r"\b(?:def|class) ([A-Za-z_]\w{3,})")
NODE = re.compile(r"([\w./\-]+\.py::[\w\[\]\-.:]+)")
COLLECTION_ERROR = re.compile(r"^ERROR ([\w./\-]+\.py)\b", re.MULTILINE)
PIP_ROW = re.compile(r"^([A-Za-z][\w.\-]+)\s+(\d[\w.]*)\s*$", re.MULTILINE)
LOCATION = re.compile(r"^Location: (\S+)", re.MULTILINE)
NAME = re.compile(r"^Name: (\S+)", re.MULTILINE)
LINE_PREFIX = re.compile(r"^\s*\d+(?:\t|→)", re.MULTILINE)  # numbered lines of a read tool


Move = Callable[[], Step]


@dataclass
class Explorer:
    """The model's side of one exploring session on `root`: `next()` gives the next step (None:
    nothing left to do), `seen(step, result)` tells it what the tool answered."""

    root: Path
    seed: int
    openers: tuple[str, ...] = OPENERS
    history: list[Seen] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    rng: random.Random = field(init=False)
    opened: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def seen(self, step: Step, result: str) -> None:
        self.history.append(Seen(step, result))

    def next(self) -> Step | None:
        rng = self.rng
        # The first two openers first; later, now and then, another one.
        if self.opened < 2 or (self.opened < len(self.openers) and rng.random() < 0.12):
            return self._opener()
        for _ in range(12):
            if not self.history:
                break
            source = self.history[-1] if rng.random() < 0.5 else rng.choice(self.history)
            moves = [(k, m) for k, m in self.moves(source) if m.signature not in self.done]
            if moves:
                # A kind of move first (read the file, show the commit, ...), then one of its
                # tokens: a result with forty commit hashes offers one kind of move, not forty.
                kind = rng.choice(sorted({k for k, _ in moves}))
                step = rng.choice([m for k, m in moves if k == kind])
                self.done.add(step.signature)
                return step
        return self._opener() if self.opened < len(self.openers) else None

    def _opener(self) -> Step:
        """The first two openers in order, then any one not used yet."""
        left = [c for c in self.openers if f"shell:{[('command', c)]}" not in self.done]
        command = left[0] if self.opened < 2 else self.rng.choice(left)
        self.opened += 1
        step = Step("shell", {"command": command}, None)
        self.done.add(step.signature)
        return step

    def _say(self, text: str) -> str | None:
        return text if self.rng.random() < 0.75 else None

    def relative(self, path: Path) -> str:
        """How the agent names a file: from the checkout's root, or absolute outside it."""
        try:
            return str(path.relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    def moves(self, seen: Seen) -> list[tuple[str, Step]]:
        """Every step this result offers, each acting on a token it printed, with its kind."""
        text = LINE_PREFIX.sub("", seen.result)
        command = str(seen.step.arguments.get("command", ""))
        found: list[tuple[str, Step]] = []
        where = self._folder(seen.step)

        def add(
            kind: str,
            step_kind: Literal["read", "grep", "shell"],
            arguments: dict[str, Any],
            said: str,
            *uses: str,
            key: str = "",
        ) -> None:
            found.append((kind, Step(step_kind, arguments, self._say(said), uses, key)))

        for name, line in [*PATH_LINE.findall(text), *TRACEBACK.findall(text)]:
            path = resolve(where, name) or resolve(self.root, name)
            if path is None or not path.is_file():
                continue
            shown, number = self.relative(path), int(line)
            start = max(1, number - 20)
            said = (
                f"{name}:{line} is where it happens; reading lines {start}-{start + 49} of {shown}."
            )
            add(
                "read around a line",
                "read",
                {"path": shown, "start": start, "count": 50},
                said,
                name,
                line,
            )
            if self._tracked(path):
                said = f"Who last changed {shown} around line {line}?"
                add(
                    "blame",
                    "shell",
                    {"command": f"git blame -L {max(1, number - 5)},+12 -- {shown}"},
                    said,
                    name,
                    line,
                )
        for name in dict.fromkeys(PATH.findall(text)):
            path = resolve(where, name) or resolve(self.root, name)
            if path is None or not path.is_file():
                continue
            shown = self.relative(path)
            add("read a file", "read", {"path": shown}, f"Opening {name}.", name)
            if self._tracked(path):
                command_log = f"git log --oneline -n 12 -- {shown}"
                add(
                    "file history",
                    "shell",
                    {"command": command_log},
                    f"The history of {shown}.",
                    name,
                )
            if path.suffix == ".py":
                command_defs = f"grep -n 'def \\|class ' {shown}"
                add(
                    "definitions",
                    "shell",
                    {"command": command_defs},
                    f"What {shown} defines.",
                    name,
                )
        found += self._listing_moves(seen, text)
        for commit in dict.fromkeys(HASH_LINE.findall(text)):
            full = self._commit(commit)
            if full is not None:
                said = f"Commit {commit} looks related; what did it change?"
                command_show = f"git show --stat {commit}"
                add("show a commit", "shell", {"command": command_show}, said, commit, key=full)
        for name in dict.fromkeys(DEFINED.findall(text)):
            add(
                "grep a name",
                "grep",
                {"pattern": name, "path": "."},
                f"Where else is {name} used?",
                name,
            )
        for node in dict.fromkeys(NODE.findall(text)):
            if resolve(self.root, node.split("::")[0]) is not None:
                said = f"Running {node} alone."
                add(
                    "run one test",
                    "shell",
                    {"command": f"{PYTEST_PLAIN} '{node}' 2>&1 | tail -n 50"},
                    said,
                    node,
                )
        for name in dict.fromkeys(COLLECTION_ERROR.findall(text)):
            said = f"{name} cannot even be collected; the rest of the suite without it."
            add(
                "run without",
                "shell",
                {"command": f"{PYTEST_PLAIN} --ignore={name} 2>&1 | tail -n 60"},
                said,
                name,
            )
        if command.startswith("pip list"):
            for name, version in PIP_ROW.findall(text):
                said = f"{name} {version} is installed; where is it?"
                add("pip show", "shell", {"command": f"pip show {name}"}, said, name, version)
        if command.startswith("pip show"):
            for location in LOCATION.findall(text):
                for name in NAME.findall(text):
                    package = Path(location) / name.lower().replace("-", "_")
                    if package.is_dir():
                        add(
                            "list a package",
                            "shell",
                            {"command": f"ls -la {package}"},
                            f"The files of {name}.",
                            location,
                        )
        return found

    def _folder(self, step: Step) -> Path:
        """The folder a result's relative names are relative to."""
        command = str(step.arguments.get("command", ""))
        if command.startswith("ls -la "):
            return Path(command.removeprefix("ls -la ").strip())
        if step.kind == "read":
            path = resolve(self.root, str(step.arguments["path"]))
            return path.parent if path is not None else self.root
        return self.root

    def _listing_moves(self, seen: Seen, text: str) -> list[tuple[str, Step]]:
        """From `ls -la`: a file to read, a folder to list."""
        command = str(seen.step.arguments.get("command", ""))
        if not command.startswith("ls -la"):
            return []
        where = self._folder(seen.step)
        where = where if where.is_absolute() else self.root / where
        found: list[tuple[str, Step]] = []
        for row in text.split("\n"):
            fields = row.split()
            if len(fields) < 9 or fields[-1] in (".", ".."):
                continue
            name = fields[-1]
            path = resolve(where, name)
            if path is None:
                continue
            shown = self.relative(path)
            if row.startswith("d") and name != ".git":
                step = Step(
                    "shell", {"command": f"ls -la {shown}"}, self._say(f"Inside {name}/."), (name,)
                )
                found.append(("list a folder", step))
            elif row.startswith("-") and path.suffix in TEXT_SUFFIXES | {".lock", ".in", ""}:
                step = Step("read", {"path": shown}, self._say(f"Reading {name}."), (name,))
                found.append(("read a listed file", step))
        return found

    def _commit(self, name: str) -> str | None:
        """The full hash of a commit a result named, or None if it names none."""
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
            cwd=self.root,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip() if done.returncode == 0 else None

    def _tracked(self, path: Path) -> bool:
        """Whether `path` is a file of the checkout (not of the installed packages)."""
        return path.is_relative_to(self.root.resolve())
