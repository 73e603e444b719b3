"""The listening side of `brim serve`: what a failure to listen is called, and the sockets that
several worker processes share one port through (see `proxy.workers`)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

# A deep accept queue: at hundreds of concurrent clients the default 128 drops SYNs, and each
# drop costs the client a one-second retransmit.
BACKLOG = 1024
# What binding a socket fails with; a file brim cannot open has a filename and is not one.
LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})

SocketMode = Literal["reuse_port", "shared"]


class CannotListen(Exception):
    """`brim serve` could not open its listening socket (the message says why)."""


def listen_error(exc: OSError, host: str, port: int) -> CannotListen | None:
    """`exc`, raised while binding `host:port`, as the one line `brim serve` says about it; None
    when it is not a failure to listen (a file that cannot be read, say)."""
    gai = isinstance(exc, socket.gaierror)
    if exc.filename is not None or not (gai or exc.errno in LISTEN_ERRNOS):
        return None
    reason = exc.strerror if gai or not exc.errno else os.strerror(exc.errno)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return CannotListen(f"cannot listen on {address}: {(reason or str(exc)).lower()}")


def socket_mode(setting: str) -> SocketMode:
    """`[server] worker_socket` on this system: "auto" is reuse_port on Linux, where the kernel
    spreads connections over the sockets of a SO_REUSEPORT group, and shared elsewhere (macOS
    and the BSDs accept SO_REUSEPORT but hand every connection to one socket)."""
    if setting == "reuse_port" or (setting == "auto" and sys.platform.startswith("linux")):
        if not hasattr(socket, "SO_REUSEPORT"):
            raise CannotListen("worker_socket = 'reuse_port': this system has no SO_REUSEPORT")
        return "reuse_port"
    return "shared"


@dataclass
class Listener:
    """The port the workers serve, as the supervisor holds it.

    `shared`: `sockets` listen, and every worker (forked from the supervisor) accepts on them.
    `reuse_port`: `sockets` are bound with SO_REUSEPORT but do not listen — they hold the port
    (so that `port = 0` has a number, and no other program takes it while the workers start)
    and no connection ever waits on them; each worker binds and listens on its own socket of the
    same group, so a worker that is not serving yet, or has died, gets no connections.
    """

    host: str
    port: int
    mode: SocketMode
    sockets: list[socket.socket]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def open_listener(host: str, port: int, mode: SocketMode) -> Listener:
    """Bind `host:port` (every address `host` resolves to) for workers; raises `CannotListen`."""
    sockets: list[socket.socket] = []
    try:
        if mode == "reuse_port" and port != 0:
            # Probe: a socket without SO_REUSEPORT cannot bind beside anyone listening there,
            # not even another group of SO_REUSEPORT sockets that would otherwise take half of
            # the connections without a word.
            for family, address in _addresses(host, port):
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    _prepare(probe, family, reuse_port=False)
                    probe.bind(address)
        for family, address in _addresses(host, port):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            _prepare(sock, family, reuse_port=mode == "reuse_port")
            # port 0: the first address picks a free port and the others take the same one
            sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]
            if mode == "shared":
                sock.listen(BACKLOG)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        error = listen_error(exc, host, port)
        if error is None:
            raise
        raise error from None
    return Listener(host, port, mode, sockets)


def _addresses(host: str, port: int) -> Iterator[tuple[socket.AddressFamily, tuple[Any, ...]]]:
    """The (family, address) pairs `host` resolves to, as asyncio's `create_server` binds them."""
    seen = set()
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, _, _, _, address in infos:
        if (family, address) not in seen and family in (socket.AF_INET, socket.AF_INET6):
            seen.add((family, address))
            yield family, tuple(address)


def _prepare(sock: socket.socket, family: socket.AddressFamily, *, reuse_port: bool) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:  # as asyncio does: an IPv6 socket serves IPv6 only
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
