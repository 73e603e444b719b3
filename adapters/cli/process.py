"""One run of a coding CLI: its own process group (killed whole when the run times out, when
the client goes away, and after the CLI exits), a scratch working directory (removed after), its
prompt on stdin, its stderr's tail kept for the log, its stdout read into events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from brim.adapters.cli.failures import exit_failure, reported_failure
from brim.adapters.cli.readers import Event, Failed, parse_line
from brim.adapters.errors import UpstreamFailure, UpstreamProtocolError, UpstreamTimeout

if TYPE_CHECKING:
    from brim.adapters.cli.cli_adapter import CliAdapter

log = logging.getLogger("brim.cli")
T = TypeVar("T")
LINE_LIMIT = 64 * 1024 * 1024  # one line of the CLI's JSON output (a whole answer, at most)
STDERR_KEPT = 64 * 1024  # the tail of the CLI's stderr kept for the log
KILL_WAIT_S = 5.0  # after SIGKILL, how long to wait for the process to be reaped


def kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


class Run:
    """One CLI process: its prompt written to stdin, its stderr kept (the tail, for the log),
    its stdout read into events. `close` kills its process group, removes its scratch folder and
    gives its pool slot back, once."""

    def __init__(
        self,
        adapter: CliAdapter,
        process: asyncio.subprocess.Process,
        scratch: Path,
        prompt: bytes,
        request_id: str,
    ) -> None:
        self.adapter = adapter
        self.process = process
        self.scratch = scratch
        self.request_id = request_id
        self.reader = adapter.cli.reader()
        self.deadline = asyncio.get_running_loop().time() + min(
            adapter.config.timeout_s, adapter.config.max_duration_s
        )
        self.stderr = bytearray()
        self.closed = False
        self._rest: AsyncIterator[Event] | None = None
        adapter.running.add(process.pid)
        self._writer = asyncio.ensure_future(self._write(prompt))
        self._drain = asyncio.ensure_future(self._read_stderr())

    async def _write(self, prompt: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        with contextlib.suppress(ConnectionError, BrokenPipeError, OSError):
            stdin.write(prompt)
            await stdin.drain()
            stdin.close()

    async def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None
        while chunk := await stream.read(65536):
            self.stderr += chunk
            if len(self.stderr) > STDERR_KEPT:
                del self.stderr[: len(self.stderr) - STDERR_KEPT]

    def _timeout(self) -> UpstreamTimeout:
        limit = min(self.adapter.config.timeout_s, self.adapter.config.max_duration_s)
        return UpstreamTimeout(
            f"upstream {self.adapter.name!r}: the {self.adapter.cli.name} CLI did not finish "
            f"within timeout_s ({limit:g} s); it was stopped",
            upstream=self.adapter.name,
        )

    async def first(self) -> Event | None:
        """The run's first text (or its usage, for an answer without text), read before the
        client is told 200: a failure the CLI reports first raises here, where the retry stage
        can still act on it."""
        events = self.events()
        async for event in events:
            self._rest = events
            return event
        self._rest = events
        return None

    async def events(self) -> AsyncIterator[Event]:
        """The run's events to its end; a reported failure, a timeout or an exit without an
        answer raises the documented error."""
        rest = self._rest
        if rest is not None:
            self._rest = None
            async for event in rest:
                yield event
            return
        stdout = self.process.stdout
        assert stdout is not None
        reader = self.reader
        while True:
            try:
                line = await self._within(stdout.readline())
            except ValueError as exc:  # a line over LINE_LIMIT
                raise UpstreamProtocolError(
                    f"upstream {self.adapter.name!r}: the {self.adapter.cli.name} CLI wrote a "
                    f"line longer than {LINE_LIMIT} bytes",
                    upstream=self.adapter.name,
                ) from exc
            if not line:
                break
            parsed = parse_line(line)
            if parsed is None:
                continue
            for event in reader.feed(parsed):
                if isinstance(event, Failed):
                    raise self._failed(event)
                yield event
        for event in reader.end():
            if isinstance(event, Failed):
                raise self._failed(event)
            yield event
        await self._within(asyncio.shield(self._drain))
        returncode = await self._within(self.process.wait())
        if (returncode != 0 or not reader.texts) and not reader.final:
            raise self._exited(returncode)

    async def _within(self, waiting: Awaitable[T]) -> T:
        """`waiting`, awaited no later than the run's deadline (each wait on its own: a timeout
        around a `yield` would fire in whatever the consumer is doing)."""
        try:
            async with asyncio.timeout_at(self.deadline):
                return await waiting
        except TimeoutError:
            self._log("timed out")
            raise self._timeout() from None

    def _failed(self, failed: Failed) -> UpstreamFailure:
        self._log(f"reported a failure: {failed.message[:300]!r}")
        return reported_failure(self.adapter.name, self.adapter.cli, failed)

    def _exited(self, returncode: int) -> UpstreamFailure:
        self._log(f"exited with status {returncode} without an answer")
        tail = self.stderr.decode("utf-8", "replace")
        return exit_failure(self.adapter.name, self.adapter.cli, returncode, tail, self.request_id)

    def _log(self, what: str) -> None:
        tail = self.stderr.decode("utf-8", "replace").strip()[-2000:]
        log.warning(
            "request %s: upstream %r: the %s CLI %s%s",
            self.request_id,
            self.adapter.name,
            self.adapter.cli.name,
            what,
            f"; its stderr ends: {tail}" if tail else "",
        )

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        process = self.process
        try:
            kill_group(process.pid)
            self._writer.cancel()
            self._drain.cancel()
            await asyncio.gather(self._writer, self._drain, return_exceptions=True)
            # Reaped, and its pipes read to their end: asyncio closes a subprocess's transport
            # once both have happened. Left to the garbage collector, it was closed after its
            # event loop (a timed-out run at shutdown: "Event loop is closed"). A read still
            # waiting elsewhere (RuntimeError) leaves the pipe to it.
            with contextlib.suppress(
                TimeoutError, ProcessLookupError, OSError, ValueError, RuntimeError
            ):
                async with asyncio.timeout(KILL_WAIT_S):
                    await process.wait()
                    for stream in (process.stdout, process.stderr):
                        while stream is not None and await stream.read(65536):
                            pass
        finally:
            self.adapter.running.discard(process.pid)
            self.adapter.slots.release()
            # Shielded: the caller is often a handler being cancelled (its client went away); a
            # removal cancelled before its thread took it up would leave the folder for good.
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, self.scratch, True))
