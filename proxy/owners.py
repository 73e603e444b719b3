"""Whose a request is: the owner of everything brim keeps from it (`Exchange.owner`).

Named once, at the edge, for every proxied request:

- with brim keys (`[server] api_keys_env`): the brim key the client presented, as
  `key-<32 hex>`;
- else its provider credentials — every one it sent of `Authorization`, `x-api-key`,
  `api-key`, `x-goog-api-key` and the query's `key=` (Gemini's), together — as `cred-<32 hex>`;
- a request with neither is `ANONYMOUS`'s: on a loopback brim without keys that is the one user
  of the machine. A brim that several people reach should have brim keys.

The hex is a keyed BLAKE2b hash (a MAC; one C call per request) under the owner secret:
`[server] owner_secret_env` where it is set (the same on every instance that shares
`[cache] url`, so that a client's entries are its own on all of them), else a random secret made
once per brim run (its workers, forked after it, share it), so that entries a client left before
a restart are not its own after it. Neither a key nor its hash in any other form is kept. An
owner names Redis keys and archive folders; it never appears in logs, headers, metrics or traces.
"""

from __future__ import annotations

import hashlib
import os

from aiohttp import web

from brim.adapters.exchange import ANONYMOUS
from brim.adapters.forwarded_headers import CREDENTIAL_HEADERS
from brim.proxy.config import ServerConfig

# Made when brim's modules load: before `brim serve --workers N` forks, so all its workers agree.
RUN_SECRET = os.urandom(32)
CREDENTIALS = tuple(sorted(CREDENTIAL_HEADERS))  # in one order, so the same ones hash the same
QUERY_KEY = "key"  # Gemini's `?key=`
DIGITS = 32


class Owners:
    """Names owners with one secret; holds nothing of any request."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(secret).digest()  # any length of secret: BLAKE2b's key size

    @classmethod
    def for_server(cls, server: ServerConfig) -> Owners:
        configured = server.owner_secret
        secret = RUN_SECRET if configured is None else configured.get_secret_value().encode()
        return cls(secret)

    def _hashed(self, kind: str, parts: list[str]) -> str:
        message = "\0".join([kind, *parts]).encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(message, key=self._key, digest_size=DIGITS // 2).hexdigest()
        return f"{kind}-{digest}"

    def of_brim_key(self, key: str) -> str:
        """The owner of requests that present brim key `key`."""
        return self._hashed("key", [key])

    def of_credentials(self, request: web.Request) -> str:
        """The owner of a request by the provider credentials it carries (`ANONYMOUS` if none)."""
        headers = request.headers
        parts = [
            f"{name}={value}" for name in CREDENTIALS for value in headers.getall(name, ()) if value
        ]
        if QUERY_KEY in request.query:
            parts += [f"?{QUERY_KEY}={value}" for value in request.query.getall(QUERY_KEY) if value]
        return self._hashed("cred", parts) if parts else ANONYMOUS
