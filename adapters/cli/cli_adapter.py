"""The adapter of a CLI upstream (`api = "cli"`): runs its coding CLI for each request (see the
package's docstring), at most `max_concurrency` runs at once; up to `max_queued` more wait at
most `queue_timeout_s`, any other request is answered 429 with `retry-after`. The answer is
Chat Completions — an SSE stream, or one `chat.completion` — with the usage the CLI reports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from multidict import CIMultiDict

from brim.adapters.adapter import UpstreamResponse
from brim.adapters.cli.command_line import BRIM_SETTINGS_ONLY, CLIS, ChildEnv, cli_model
from brim.adapters.cli.failures import JSON_HEADERS
from brim.adapters.cli.process import LINE_LIMIT, Run, kill_group
from brim.adapters.cli.prompt import render_prompt
from brim.adapters.cli.readers import Event, Text, Used
from brim.adapters.errors import (
    RateLimited,
    UpstreamProtocolError,
    UpstreamUnreachable,
)
from brim.adapters.exchange import Exchange
from brim.adapters.upstream_config import UpstreamConfig
from brim.policies.wires.base import ErrorInfo
from brim.policies.wires.chat import CHAT

log = logging.getLogger("brim.cli")
_SSE = CIMultiDict({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})


class CliAdapter:
    """Runs one configured CLI for each request (`api = "cli"`)."""

    def __init__(
        self, name: str, config: UpstreamConfig, child_env: ChildEnv = BRIM_SETTINGS_ONLY
    ) -> None:
        cli = config.cli_name
        if config.api != "cli" or cli is None or config.command is None:
            raise ValueError(f"upstream {name!r}: not a CLI upstream (api = {config.api!r})")
        self.name = name
        self.config = config
        self.child_env = child_env
        self.cli = CLIS[cli]
        self.command = config.command.strip()
        self._root: str | None = None  # where scratch folders go (None: the system's temp)
        if config.workdir is not None:
            root = Path(config.workdir).expanduser()
            self._root = str(root)
            if not root.is_dir():
                raise ValueError(
                    f"upstream {name!r}: workdir {str(root)!r} is not an existing folder"
                )
        self.slots = asyncio.Semaphore(config.max_concurrency)
        self._waiting = 0
        self.running: set[int] = set()  # process groups of runs in progress (`Run`s add theirs)
        self._settings: Path | None = None
        if self.executable() is None:
            log.warning("upstream %r: %s", name, self._missing_message())

    # -- configuration checks ----------------------------------------------------------------

    def _path(self) -> str:
        path = self.config.env.get("PATH")
        return path if path is not None else os.environ.get("PATH", os.defpath)

    def executable(self) -> str | None:
        """The command's full path, if it can be run."""
        if os.sep in self.command or (os.altsep and os.altsep in self.command):
            path = os.path.expanduser(self.command)
            return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
        return shutil.which(self.command, path=self._path())

    def _missing_message(self) -> str:
        if os.sep in self.command:
            path = os.path.expanduser(self.command)
            why = "does not exist" if not os.path.exists(path) else "is not an executable file"
            return (
                f"upstream {self.name!r}: the {self.cli.name} CLI at {path!r} {why} "
                f"([upstreams.{self.name}] command)"
            )
        return (
            f"upstream {self.name!r}: the {self.cli.name} CLI {self.command!r} is not on PATH; "
            f"install it, or set [upstreams.{self.name}] command to its full path"
        )

    def _gemini_settings(self, env: Mapping[str, str]) -> Path | None:
        """A system settings file for Gemini CLI that turns its tools off (`tools.core = []`),
        over the system settings it would otherwise read. Gemini CLI skips a settings file in
        a folder that others may write to (any /tmp), so it lives in brim's cache folder."""
        if self._settings is not None:
            return self._settings
        base_path = env.get("GEMINI_CLI_SYSTEM_SETTINGS_PATH") or "/etc/gemini-cli/settings.json"
        settings: dict[str, Any] = {}
        try:
            settings = json.loads(Path(base_path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning(
                "upstream %r: cannot read Gemini CLI's system settings %s (%s); its tools stay on",
                self.name,
                base_path,
                exc,
            )
            return None
        if not isinstance(settings, dict):
            settings = {}
        tools = settings.get("tools")
        settings["tools"] = {**(tools if isinstance(tools, dict) else {}), "core": []}
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = Path(cache) / "brim" / "cli"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            safe = re.sub(r"[^\w.-]", "_", self.name)
            target = folder / f"gemini-settings-{os.getpid()}-{safe}.json"
            target.write_text(json.dumps(settings), encoding="utf-8")
            target.chmod(0o600)
        except OSError as exc:
            log.warning(
                "upstream %r: cannot write Gemini CLI settings to %s (%s); its tools stay on",
                self.name,
                folder,
                exc,
            )
            return None
        self._settings = target
        return target

    # -- the pool ----------------------------------------------------------------------------

    def _busy(self, why: str) -> RateLimited:
        retry_after = max(1, math.ceil(min(self.config.queue_timeout_s, 60) or 1))
        message = (
            f"upstream {self.name!r}: all {self.config.max_concurrency} {self.cli.name} CLI "
            f"processes are busy ({why}); retry after {retry_after} s"
        )
        headers = CIMultiDict({"Content-Type": "application/json", "retry-after": str(retry_after)})
        body = CHAT.error_body(ErrorInfo(429, "rate_limit_error", message, "cli_busy"))
        return RateLimited(upstream=self.name, status=429, headers=headers, body=body)

    async def _acquire(self) -> None:
        if self.slots.locked():
            if self._waiting >= self.config.max_queued:
                raise self._busy(f"{self._waiting} requests already waiting")
            self._waiting += 1
            try:
                async with asyncio.timeout(self.config.queue_timeout_s):
                    await self.slots.acquire()
            except TimeoutError:
                raise self._busy(
                    f"none came free within queue_timeout_s ({self.config.queue_timeout_s:g} s)"
                ) from None
            finally:
                self._waiting -= 1
        else:
            await self.slots.acquire()

    # -- errors ------------------------------------------------------------------------------

    # -- a request ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        for group in list(self.running):
            kill_group(group)
        if self._settings is not None:
            with contextlib.suppress(OSError):
                self._settings.unlink()
            self._settings = None

    async def send(self, exchange: Exchange) -> UpstreamResponse:
        if exchange.api != CHAT.name or exchange.body is None:
            raise UpstreamProtocolError(
                f"upstream {self.name!r} (api = cli) serves Chat Completions requests only",
                upstream=self.name,
            )
        messages = exchange.body.get("messages")
        prompt = render_prompt(messages if isinstance(messages, list) else [])
        executable = self.executable()
        if executable is None:
            raise UpstreamUnreachable(self._missing_message(), upstream=self.name)
        await self._acquire()
        try:
            run = await self._start(executable, exchange, prompt)
        except BaseException:
            self.slots.release()
            raise
        try:
            if not exchange.stream:
                return await self._whole(exchange, run)
            first = await run.first()
        except BaseException:
            await run.close()
            raise
        return UpstreamResponse(
            status=200,
            headers=_SSE,
            chunks=self._stream(exchange, run, first),
            closer=run.close,
        )

    async def _start(self, executable: str, exchange: Exchange, prompt: str) -> Run:
        env = self.child_env.environment(os.environ, self.config)
        settings = self._gemini_settings(env) if self.cli.name == "gemini" else None
        command = self.cli.command(cli_model(exchange.model), settings, env)
        env.update(command.env)
        scratch = Path(tempfile.mkdtemp(prefix="brim-cli-", dir=self._root))
        argv = [executable, *command.args, *self.config.args]
        log.debug("request %s: running %s in %s", exchange.request_id, argv, scratch)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=scratch,
                env=env,
                start_new_session=True,  # its own process group, killed whole
                limit=LINE_LIMIT,
            )
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise UpstreamUnreachable(
                f"{self._missing_message()} ({exc.strerror or exc})", upstream=self.name
            ) from exc
        return Run(self, process, scratch, prompt.encode(), exchange.request_id)

    async def _whole(self, exchange: Exchange, run: Run) -> UpstreamResponse:
        try:
            texts: list[str] = []
            used: Used | None = None
            async for event in run.events():
                if isinstance(event, Text):
                    texts.append(event.text)
                elif isinstance(event, Used):
                    used = event
        finally:
            await run.close()
        completion = _completion(exchange.model, "".join(texts), used)
        return UpstreamResponse(
            status=200, headers=JSON_HEADERS, body=orjson.dumps(completion), payload=completion
        )

    async def _stream(
        self, exchange: Exchange, run: Run, first: Event | None
    ) -> AsyncIterator[bytes]:
        body = exchange.body or {}
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        head = {
            "id": f"chatcmpl-cli-{os.urandom(12).hex()}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": exchange.model,
        }
        used: Used | None = None
        try:
            yield _chunk(head, {"role": "assistant", "content": ""})
            if isinstance(first, Text):
                yield _chunk(head, {"content": first.text})
            elif isinstance(first, Used):
                used = first
            async for event in run.events():
                if isinstance(event, Text):
                    yield _chunk(head, {"content": event.text})
                elif isinstance(event, Used):
                    used = event
            yield _chunk(head, {}, "stop")
            if include_usage:
                usage = _usage(used)
                yield b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            await run.close()


def _usage(used: Used | None) -> dict[str, Any]:
    if used is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    usage: dict[str, Any] = {
        "prompt_tokens": used.prompt,
        "completion_tokens": used.completion,
        "total_tokens": used.prompt + used.completion,
    }
    if used.cached:
        usage["prompt_tokens_details"] = {"cached_tokens": used.cached}
    return usage


def _completion(model: str, text: str, used: Used | None) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-cli-{os.urandom(12).hex()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(used),
    }


def _chunk(head: Mapping[str, Any], delta: Mapping[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"
