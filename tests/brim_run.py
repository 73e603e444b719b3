"""Running `brim run` as a user does, in its own process (this checkout's code, as
`python -m brim.proxy run …`), for tests/proxy/test_launcher.py and tests/test_real_clis.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(
    r"^brim: (\d+) requests, (\d+) overflows prevented, (\d+) survived, "
    r"([\d,]+) tokens removed, (\d+) restores$",
    re.M,
)
STARTED = re.compile(r"^brim run: brim at http://127\.0\.0\.1:(\d+) ", re.M)


@dataclass(frozen=True)
class Summary:
    requests: int
    prevented: int
    survived: int
    tokens_removed: int
    restores: int


@dataclass
class Launched:
    """A finished `brim run`."""

    returncode: int
    stdout: str
    stderr: str
    pid: int

    @property
    def summary(self) -> Summary | None:
        """brim run's summary line, or None when it printed none."""
        found = SUMMARY.search(self.stderr)
        if found is None:
            return None
        return Summary(*(int(n.replace(",", "")) for n in found.groups()))

    @property
    def port(self) -> int | None:
        """The port of the brim it started, as its first line names it."""
        found = STARTED.search(self.stderr)
        return int(found.group(1)) if found else None

    def report(self) -> str:
        return f"exit {self.returncode}\nstdout {self.stdout[-2000:]}\nstderr {self.stderr[-3000:]}"


def brim_run_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` plus what a `python -m brim.proxy` of this checkout needs."""
    return {**env, "PYTHONPATH": str(ROOT / ".pythonpath"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def start(
    args: Sequence[str], env: Mapping[str, str], cwd: Path | None = None, **popen: object
) -> subprocess.Popen[bytes]:
    """`brim run ARGS` in its own session (killed whole by `finish`)."""
    options: dict[str, object] = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
        "start_new_session": True,
        **popen,
    }
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "brim.proxy", "run", *args],
        cwd=cwd,
        env=brim_run_env(env),
        **options,
    )


def finish(process: subprocess.Popen[bytes], timeout: float) -> Launched:
    """Wait for `brim run` (killed, with all its session, after `timeout` seconds)."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    return Launched(
        process.returncode,
        (stdout or b"").decode(errors="replace"),
        (stderr or b"").decode(errors="replace"),
        process.pid,
    )


def launch(
    args: Sequence[str], env: Mapping[str, str], cwd: Path | None = None, timeout: float = 60
) -> Launched:
    """Run `brim run ARGS` to its end."""
    return finish(start(args, env, cwd), timeout)


def _session_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def listening(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def gone(launched: Launched) -> bool:
    """brim run started a brim that no longer listens, and left no process of its session
    behind (one that is still there after 2 s is killed: it is a leak)."""
    deadline = time.monotonic() + 2  # the last of them may take a moment to be reaped
    while _session_alive(launched.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _session_alive(launched.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launched.pid, signal.SIGKILL)
        return False
    return launched.port is not None and not listening(launched.port)
