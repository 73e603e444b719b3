"""Starting the processes under test and reading what they cost (from /proc)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]  # this checkout: what every process here runs


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc), such as brim's workers."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def machine_cpu_s() -> float:
    """CPU time the whole machine has spent busy (every core, anyone's work), in seconds."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


def cpu_s(pid: int) -> float:
    """The CPU time `pid` has used so far (user and system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_ns(pid: int) -> int:
    """The CPU time `pid` has run so far, in nanoseconds (`/proc/PID/schedstat`: the
    scheduler's own figure, where `/proc/PID/stat` counts in clock ticks of 10 ms)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    ready_s: float

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def rss_peak_mb(self) -> float:
        """The process's peak resident memory so far (VmHWM), in MB."""
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def fds(self) -> int:
        """How many file descriptors the process has open."""
        return len(os.listdir(f"/proc/{self.popen.pid}/fd"))

    def cpu_s(self) -> float:
        """CPU time of the process and its children (brim's workers), in seconds."""
        total = 0.0
        for pid in [self.popen.pid, *children(self.popen.pid)]:
            with contextlib.suppress(OSError):
                total += cpu_s(pid)
        return total

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()


def wait_ready(url: str, popen: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {popen.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError(f"{url} not ready within {timeout} s")


def import_path(root: Path) -> str:
    """`PYTHONPATH` for the code in checkout `root`: its `.pythonpath` (the package `brim` as
    links to its four folders) and `root` itself (`bench`, and the four folders of a checkout
    from before they were one package), ahead of whatever was there."""
    paths = (root / ".pythonpath", root, os.environ.get("PYTHONPATH", ""))
    return os.pathsep.join(str(p) for p in paths if p)


def brim_module(root: Path) -> str:
    """What `python -m` runs brim as in checkout `root`: `brim.proxy`, or `proxy` in a
    checkout from before the package `brim` (`bench.run --base` may compare with one)."""
    return "brim.proxy" if (root / ".pythonpath").is_dir() else "proxy"


def running_in(root: Path | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`subprocess` arguments for a process that runs the code in `root` (None: wherever it
    is started): `root` as its working directory, and first on its import path (`import_path`).
    Both: `python -m` puts the working directory ahead of `PYTHONPATH`, so a process started
    from another checkout would run that checkout's code."""
    paths = {} if root is None else {"PYTHONPATH": import_path(root)}
    return {"env": {**os.environ, **paths, **(env or {})}, "cwd": root}


def start(
    name: str,
    argv: list[str],
    ready_url: str,
    url: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    ready_line: str | None = None,
    root: Path | None = ROOT,
) -> Process:
    """Start `argv` and wait until `ready_url` answers (and, with `ready_line`, until the
    process has printed a line that starts so: brim's workers are all serving then). `root`
    (this checkout unless told; None: nothing) is the code it runs (`running_in`): that tree's,
    not the copy of brim the venv installed nor the tree the bench was started from."""
    started = time.perf_counter()
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE if ready_line else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **running_in(root, env),
    )
    if ready_line is not None:
        wait_line(ready_line, popen, timeout)
    wait_ready(ready_url, popen, timeout)
    return Process(name, popen, url, time.perf_counter() - started)


def wait_line(prefix: str, popen: subprocess.Popen[bytes], timeout: float) -> None:
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([popen.stdout], [], [], deadline - time.monotonic())
        line = popen.stdout.readline() if readable else b""
        if line.startswith(prefix.encode()):
            return
        if readable and not line:
            raise RuntimeError(f"{argv_name(popen)} exited with {popen.wait()}")
    raise RuntimeError(f"{argv_name(popen)} did not print {prefix!r} within {timeout} s")


def argv_name(popen: subprocess.Popen[bytes]) -> str:
    args = popen.args
    return " ".join(map(str, args[:4])) if isinstance(args, list) else str(args)


def start_fake() -> Process:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    return start(
        "fake",
        [sys.executable, "-m", "bench.fake", "--port", str(port)],
        f"{base}/v1/models",
        f"{base}/v1",
    )


def start_bare(fake_url: str) -> Process:
    """The bare pass-through proxy (`bench.bare`): the floor under brim."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.bare", "--port", str(port), "--upstream", fake_url]
    return start("bare", argv, f"{base}/readyz", f"{base}/v1")


def start_brim(
    fake_url: str,
    folder: Path,
    litellm_upstream: bool = False,
    workers: int = 1,
    root: Path = ROOT,
    server: Mapping[str, float] | None = None,
    extra: str = "",
) -> Process:
    """brim (`python -m brim.proxy serve`) running the code in `root` (this checkout unless told),
    with `workers` processes, `server` as its `[server]` settings and `extra` appended to its
    configuration (TOML)."""
    port = free_port()
    config = folder / f"brim-{port}.toml"
    text = "".join(f"{key} = {value}\n" for key, value in (server or {}).items())
    text = f"[server]\n{text}" if text else ""
    text += f'[upstreams.fake]\napi = "openai"\nbase_url = "{fake_url}"\n[routes]\n"*" = "fake"\n'
    text += '[models."fake-model"]\ncontext_window = 128000\nmax_output = 4096\n'
    if litellm_upstream:
        text += '[upstreams.other]\napi = "litellm"\nmodel_prefix = "openai/"\n'
    config.write_text(text + extra)
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", brim_module(root), "serve", "--config", str(config)]
    argv += ["--port", str(port)]
    argv += ["--log-level", "warning", "--workers", str(workers)]
    return start(
        "brim", argv, f"{base}/readyz", f"{base}/v1", ready_line="brim listening", root=root
    )


LITELLM_VERSION = "1.102.4"


def litellm_venv(folder: Path) -> Path | None:
    """A virtualenv with LiteLLM's proxy, made once and reused; None if it cannot be made."""
    venv = folder / "litellm-venv"
    binary = venv / "bin" / "litellm"
    if binary.exists():
        return binary
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    result = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
        capture_output=True,
        text=True,
    )
    return binary if result.returncode == 0 and binary.exists() else None


def start_litellm(binary: Path, fake_url: str, folder: Path) -> Process:
    port = free_port()
    config = folder / f"litellm-{port}.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fake-model\n"
        "    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: {fake_url}\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    base = f"http://127.0.0.1:{port}"
    argv = [str(binary), "--config", str(config), "--port", str(port), "--num_workers", "1"]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return start(
        "litellm", argv, f"{base}/health/liveliness", f"{base}/v1", timeout=180, env=env, root=None
    )
