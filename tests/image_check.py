"""brim's container image, started as its own configuration says and asked what a user asks:
`/healthz`, the image's HEALTHCHECK, and one request proxied to a fake provider on 127.0.0.1.

    python -m tests.image_check brim:0.1.0     # what .ci/run does after deploy/build-image.sh

The image runs from its root file system (`podman image mount`) under chroot, as the image's user,
with the image's environment, working directory and command: where this runs (a sandbox without
CAP_SYS_RESOURCE), `podman run` cannot start a container (crun fails to set its rlimits). brim
gets two variables more, as compose or Kubernetes would set them: the port to listen on and the
fake provider as its OpenAI upstream. Needs root (podman's store, chroot).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.fakes import FakeProvider, LoopThread, free_port, start_app

START_TIMEOUT_S = 60.0


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True).stdout


def inspect(tag: str) -> dict[str, Any]:
    """What podman knows of the image: its `Config` (environment, command, user, working
    directory) and its `Healthcheck`."""
    inspected: dict[str, Any] = json.loads(podman("image", "inspect", tag))[0]
    return inspected


def probe(healthcheck: dict[str, Any], port: int) -> list[str]:
    """The HEALTHCHECK's command (exec or shell form), asking `port` rather than 8787."""
    kind, *test = healthcheck.get("Test") or ["NONE"]
    test = [part.replace(":8787/", f":{port}/") for part in test]
    if kind == "CMD":
        return test
    if kind == "CMD-SHELL":
        return ["/bin/sh", "-c", *test]
    raise SystemExit(f"image_check: the image has no HEALTHCHECK ({kind})")


def user_ids(root: Path, user: str) -> str:
    """`uid:gid` of the image's user, from its own /etc/passwd."""
    if user.replace(":", "").isdigit():
        return user if ":" in user else f"{user}:{user}"
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return f"{fields[2]}:{fields[3]}"
    raise SystemExit(f"image_check: the image has no user {user!r}")


def in_image(
    root: Path, config: dict[str, Any], argv: list[str], extra: dict[str, str]
) -> list[str]:
    """`argv` run inside the image's file system as the image would run it."""
    env = [*config.get("Env", []), *(f"{k}={v}" for k, v in extra.items())]
    workdir = config.get("WorkingDir") or "/"
    user = user_ids(root, config.get("User") or "0")
    script = 'cd "$0" && exec "$@"'
    chroot = ["chroot", f"--userspec={user}", str(root), "/usr/bin/env", "-i", *env]
    return [*chroot, "/bin/sh", "-c", script, workdir, *argv]


def check(tag: str) -> None:
    inspected = inspect(tag)
    config = inspected["Config"]
    loop = LoopThread()
    provider = FakeProvider()
    runner, provider.url = loop.run(start_app(provider.app()))
    root = Path(podman("image", "mount", tag).strip())
    port = free_port()
    extra = {
        "BRIM_SERVER__PORT": str(port),
        "BRIM_UPSTREAMS__OPENAI__BASE_URL": f"{provider.url}/v1",
    }
    version = subprocess.run(
        in_image(root, config, ["brim", "--version"], extra), capture_output=True, text=True
    )
    print(f"image_check: {tag}: {version.stdout.strip() or version.stderr.strip()}")
    assert version.returncode == 0, version.stderr
    brim = subprocess.Popen(
        in_image(root, config, config["Cmd"], extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert brim.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        lines = []
        while time.monotonic() < deadline:
            line = brim.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "listening on" in line:
                break
        assert lines and "listening on" in lines[-1], "".join(lines)
        base = f"http://127.0.0.1:{port}"
        health = httpx.get(f"{base}/healthz", timeout=10)
        assert health.status_code == 200, health.text
        print(f"image_check: GET /healthz: {health.status_code} {health.text.strip()}")

        asked = probe(inspected.get("Healthcheck") or {}, port)
        healthy = subprocess.run(in_image(root, config, asked, extra), capture_output=True)
        assert healthy.returncode == 0, healthy.stderr
        print("image_check: the image's HEALTHCHECK passes")

        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-image-check", max_retries=0)
        reply = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "ping"}]
        )
        answer = reply.parse().choices[0].message.content
        assert answer == "pong", answer
        assert reply.headers.get("x-brim-budget"), dict(reply.headers)
        assert len(provider.requests) == 1
        print(
            f"image_check: a chat request through brim: {answer!r}, budget {reply.headers['x-brim-budget']}"
        )
    finally:
        if brim.poll() is None:
            os.killpg(brim.pid, signal.SIGTERM)
        try:
            brim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(brim.pid, signal.SIGKILL)
            brim.wait()
        podman("image", "unmount", tag)
        loop.run(runner.cleanup())
        loop.stop()
    print(f"image_check: {tag}: brim stopped with exit status {brim.returncode}")
    assert brim.returncode == 0, brim.returncode


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.image_check IMAGE")
    check(sys.argv[1])
