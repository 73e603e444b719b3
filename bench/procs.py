"""Starting the processes under test and reading what they cost (from /proc)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]  # this checkout: what every process here runs


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

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

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


def _path_with(root: Path) -> str:
    return os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)


def start(
    name: str,
    argv: list[str],
    ready_url: str,
    url: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    root: Path | None = ROOT,
) -> Process:
    """Start `argv` with `root` (this checkout unless told; None: nothing) first on its import
    path, so that the code measured is that tree's, not the copy of brim the venv installed."""
    started = time.perf_counter()
    paths = {} if root is None else {"PYTHONPATH": _path_with(root)}
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **paths, **(env or {})},
    )
    wait_ready(ready_url, popen, timeout)
    return Process(name, popen, url, time.perf_counter() - started)


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
    fake_url: str, folder: Path, litellm_upstream: bool = False, root: Path = ROOT
) -> Process:
    """brim on the fake provider, running the code in `root` (this checkout unless told)."""
    port = free_port()
    config = folder / f"brim-{port}.toml"
    text = f'[upstreams.fake]\napi = "openai"\nbase_url = "{fake_url}"\n[routes]\n"*" = "fake"\n'
    text += '[models."fake-model"]\ncontext_window = 128000\nmax_output = 4096\n'
    if litellm_upstream:
        text += '[upstreams.other]\napi = "litellm"\nmodel_prefix = "openai/"\n'
    config.write_text(text)
    brim = str(Path(sys.executable).with_name("brim"))
    base = f"http://127.0.0.1:{port}"
    argv = [brim, "serve", "--config", str(config), "--port", str(port), "--log-level", "warning"]
    return start("brim", argv, f"{base}/readyz", f"{base}/v1", root=root)


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
