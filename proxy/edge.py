"""The edge: what brim refuses before it reads a request, against what a web page or a shell
could make of a proxy that holds the operator's keys and starts CLI runs.

- A web page's requests (`Edge.check`): a request whose `Origin` is neither brim's own (the
  `/ui` dashboard's) nor in `[server] allowed_origins` is refused (403 `origin_not_allowed`);
  so is, while brim is bound to loopback (or wherever `allowed_hosts` is set), one whose `Host`
  is not a loopback name or address nor in `allowed_hosts` — a page that rebinds its own DNS
  name to 127.0.0.1 still sends its own name as `Host` (403 `host_not_allowed`). A CORS
  preflight from a refused origin gets that 403, with no `Access-Control-*` header; one from an
  allowed origin is answered (`preflight`), and replies to it carry `Access-Control-Allow-Origin`
  (`allow_origin`).
- Bodies (`check_json_body`): JSON routes take `Content-Type: application/json` only (415):
  a form or `text/plain` body is what a page can send without a preflight; every SDK and CLI
  sends `application/json` (a request with none at all is refused too: a page can send that).
- `request_id`: a client's `x-request-id` is brim's id for the request only when it is a short
  token (it goes into log lines and headers); otherwise brim makes its own.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from aiohttp import web

from brim.adapters.errors import ForeignHost, ForeignOrigin, UnsupportedMediaType
from brim.proxy.config import ServerConfig, is_loopback

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
HOSTS_REMEMBERED = 256  # Host values whose verdict `Edge` keeps
PREFLIGHT_MAX_AGE_S = "600"


def request_id(request: web.Request) -> str:
    """The client's `x-request-id` if it is a short token (`REQUEST_ID`), else a new id."""
    given = request.headers.get("x-request-id")
    if given is not None and REQUEST_ID.fullmatch(given):
        return given
    return os.urandom(12).hex()


def check_json_body(request: web.Request) -> None:
    """415 unless the body is declared `application/json` (with or without parameters)."""
    declared = request.headers.get("Content-Type")
    if declared is not None and declared.partition(";")[0].strip().lower() == "application/json":
        return
    said = "no Content-Type" if declared is None else f"Content-Type {declared[:80]!r}"
    raise UnsupportedMediaType(
        f"brim takes JSON request bodies only: send 'Content-Type: application/json' "
        f"(this request has {said})."
    )


def host_name(header: str) -> str:
    """The name or address in a `Host` header, without its port or brackets, lowercase."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


class Edge:
    """One app's browser rules (`[server] allowed_origins`, `allowed_hosts`, the bind address),
    worked out once."""

    def __init__(self, server: ServerConfig) -> None:
        self.origins = frozenset(server.allowed_origins)
        self.any_origin = "*" in self.origins
        self.hosts = frozenset(server.allowed_hosts)
        self.checks_host = server.loopback or bool(self.hosts)
        self._hosts_seen: dict[str, bool] = {}

    def check(self, request: web.Request) -> None:
        """Refuse a request from a foreign web page (module doc): `ForeignHost`, `ForeignOrigin`."""
        headers = request.headers
        host = headers.get("Host")
        if host is not None and self.checks_host and not self.host_allowed(host):
            raise ForeignHost(
                f"brim does not answer requests for host {host[:80]!r}: it answers for "
                "localhost, 127.0.0.1 and [::1] (and the names in [server] allowed_hosts)."
            )
        origin = headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin, host):
            raise ForeignOrigin(
                f"brim does not answer web pages from {origin[:80]!r}: add the origin to "
                "[server] allowed_origins to let its pages call brim."
            )

    def host_allowed(self, host: str) -> bool:
        verdict = self._hosts_seen.get(host)
        if verdict is None:
            name = host_name(host)
            verdict = is_loopback(name) or name in self.hosts
            if len(self._hosts_seen) >= HOSTS_REMEMBERED:
                self._hosts_seen.clear()
            self._hosts_seen[host] = verdict
        return verdict

    def listed(self, origin: str) -> bool:
        """Whether `[server] allowed_origins` names `origin` (or is "*")."""
        return self.any_origin or origin.strip().lower().rstrip("/") in self.origins

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        """Listed, or brim's own: the page was served by this brim under the `Host` the request
        names (checked above, where it is checked at all)."""
        if self.listed(origin):
            return True
        try:
            authority = urlsplit(origin.strip().lower()).netloc
        except ValueError:
            return False
        return host is not None and authority != "" and authority == host.strip().lower()

    def preflight(self, request: web.Request) -> web.Response | None:
        """The answer to a CORS preflight from a listed origin (`check` has refused any other);
        None for any other request."""
        origin = request.headers.get("Origin")
        method = request.headers.get("Access-Control-Request-Method")
        if request.method != "OPTIONS" or origin is None or method is None:
            return None
        if not self.listed(origin):
            return None  # brim's own origin: same-origin requests have no preflight
        headers = {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST",
            "Access-Control-Max-Age": PREFLIGHT_MAX_AGE_S,
            "Vary": "Origin",
        }
        if wanted := request.headers.get("Access-Control-Request-Headers"):
            headers["Access-Control-Allow-Headers"] = wanted
        return web.Response(status=204, headers=headers)

    async def allow_origin(self, request: web.Request, response: web.StreamResponse) -> None:
        """An `on_response_prepare` hook (set only when `allowed_origins` lists any): a reply to
        a listed origin says so, so that the page may read it."""
        origin = request.headers.get("Origin")
        if origin is not None and self.listed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "*"
            response.headers.add("Vary", "Origin")
