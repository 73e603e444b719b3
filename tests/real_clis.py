"""The real coding CLIs that tests/test_real_clis.py drives through brim: pinned here, and only
here, and installed once with npm into a cache folder.

    python3 -m tests.real_clis install     # what .ci/run does before the suite; prints the folder

The folder is $REAL_CLIS_DIR, or ~/.cache/brim-clis/<hash of the pins> (so a new pin installs
beside the old one instead of over it); not a BRIM_ variable, which tests/conftest.py clears.
Standard library only: CI runs this before brim's virtualenv exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# name -> (npm package, version, executable). Newer versions may change flags, tools or wire
# details; bump them here and run `./dev.sh test tests/test_real_clis.py`.
PINS: dict[str, tuple[str, str, str]] = {
    "claude": ("@anthropic-ai/claude-code", "2.1.197", "claude"),
    "codex": ("@openai/codex", "0.169.0", "codex"),
    "gemini": ("@google/gemini-cli", "0.61.0", "gemini"),
    "opencode": ("opencode-ai", "1.18.33", "opencode"),
}

INSTALL_TIMEOUT_S = 900
# What npm prints when it cannot reach the registry (as opposed to a bad package or version).
OFFLINE_SIGNS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ENETUNREACH",
    "EHOSTUNREACH",
    "ERR_SOCKET_TIMEOUT",
    "network request",
    "request to https://",
)


def cli_dir() -> Path:
    configured = os.environ.get("REAL_CLIS_DIR")
    if configured:
        return Path(configured).expanduser()
    digest = hashlib.sha256(json.dumps(PINS, sort_keys=True).encode()).hexdigest()[:12]
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "brim-clis" / digest


def executable(name: str, prefix: Path | None = None) -> Path:
    return (prefix or cli_dir()) / "bin" / PINS[name][2]


def missing(prefix: Path | None = None) -> list[str]:
    """The pinned CLIs not installed in `prefix`, by name."""
    prefix = prefix or cli_dir()
    return [
        name
        for name in PINS
        if not os.access(executable(name, prefix), os.X_OK)
        or not (prefix / "lib" / "node_modules" / PINS[name][0] / "package.json").is_file()
        or _installed_version(prefix, name) != PINS[name][1]
    ]


def _installed_version(prefix: Path, name: str) -> str | None:
    manifest = prefix / "lib" / "node_modules" / PINS[name][0] / "package.json"
    try:
        version = json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


class InstallError(RuntimeError):
    """The CLIs could not be installed. `offline`: for want of node, npm or the registry, not
    because of a bad package or version."""

    def __init__(self, message: str, *, offline: bool) -> None:
        super().__init__(message)
        self.offline = offline


def install(prefix: Path | None = None) -> Path:
    """Install the pinned CLIs that `prefix` (default `cli_dir()`) lacks; returns `prefix`."""
    prefix = prefix or cli_dir()
    if not missing(prefix):
        return prefix
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".install-lock", "w") as lock:  # one npm at a time into one folder
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install(prefix, missing(prefix))


def _install(prefix: Path, wanted: list[str]) -> Path:
    if not wanted:
        return prefix
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise InstallError("node and npm are needed to install the real CLIs", offline=True)
    packages = [f"{PINS[name][0]}@{PINS[name][1]}" for name in wanted]
    command = [npm, "install", "--global", "--prefix", str(prefix), "--no-fund", "--no-audit"]
    try:
        done = subprocess.run(
            [*command, *packages],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"npm install {' '.join(packages)} timed out", offline=True) from exc
    still = missing(prefix)
    if done.returncode != 0 or still:
        output = (done.stdout + done.stderr)[-4000:]
        raise InstallError(
            f"npm install {' '.join(packages)} exited {done.returncode}, "
            f"still missing {still}:\n{output}",
            offline=any(sign in output for sign in OFFLINE_SIGNS),
        )
    return prefix


def main(argv: list[str]) -> int:
    if argv != ["install"]:
        print("usage: python3 -m tests.real_clis install", file=sys.stderr)
        return 2
    try:
        print(install())
    except InstallError as exc:
        print(f"real CLIs not installed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
