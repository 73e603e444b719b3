"""Compressed request bodies (`Content-Encoding`). brim decodes gzip (`x-gzip`) and deflate
itself, once, piece by piece (aiohttp's own decoding is off: `proxy.app.start`), so that what
it holds and checks is the decoded body:

- each decoded piece takes room under `max_body_buffer_mb` before the next is made
  (`proxy.admission.read_body`), so a small compressed body cannot hold many megabytes past it;
- the decoded body is bounded by `max_body_mb` (413), and by `max_decompression_ratio` times
  its compressed size once past `RATIO_FREE_BYTES` (413: a decompression bomb stops there);
- data that does not decode is a 400, any other coding (br, zstd, compress, a list of codings)
  a 415 naming the ones brim takes: br and zstd would need decoders brim does not ship, and no
  SDK or coding CLI compresses its requests.

The body then goes on without `Content-Encoding` (`adapters.forwarded_headers` drops it).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from aiohttp import web

from brim.adapters.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

PIECE = 256 * 1024  # decoded bytes made at a time
RATIO_FREE_BYTES = 1024 * 1024  # a body may decode to this much whatever its ratio
GZIP_WINDOW = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the data
CODINGS = ("gzip", "x-gzip", "deflate")


def content_coding(request: web.Request) -> str | None:
    """The body's coding that brim decodes (gzip, x-gzip, deflate), None for a body sent as it
    is; `UnsupportedMediaType` for any other."""
    declared = request.headers.get("Content-Encoding")
    if declared is None:
        return None
    coding = declared.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in CODINGS:
        return coding
    raise UnsupportedMediaType(
        f"brim decodes request bodies sent with Content-Encoding gzip or deflate, not "
        f"{declared[:40]!r}: send the body uncompressed or gzip it."
    )


class Inflater:
    """Decodes one compressed body into pieces of at most `PIECE` bytes, refusing past `limit`
    decoded bytes or past `ratio` times the compressed size (module doc)."""

    def __init__(self, coding: str, limit: int, ratio: float) -> None:
        self.coding = coding
        self.limit = limit
        self.ratio = ratio

    def _decoder(self, first: bytes) -> zlib._Decompress:
        if self.coding != "deflate":
            return zlib.decompressobj(GZIP_WINDOW)
        # "deflate" is zlib-wrapped (RFC 9110); some clients send raw deflate: tell by the first
        # byte, whose low four bits are 8 in a zlib header.
        raw = bool(first) and first[0] & 0x0F != 8
        return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)

    def pieces(self, compressed: bytes) -> Iterator[bytes]:
        """The decoded body, a piece at a time."""
        allowed = min(self.limit, max(int(self.ratio * len(compressed)), RATIO_FREE_BYTES))
        decoder, data, size = self._decoder(compressed), compressed, 0
        try:
            while True:
                piece = decoder.decompress(data, PIECE)
                data = decoder.unconsumed_tail
                if piece:
                    size += len(piece)
                    if size > allowed:
                        raise self._too_large(len(compressed))
                    yield piece
                if decoder.eof:
                    data = decoder.unused_data
                    if not data:
                        return
                    if self.coding == "deflate":
                        raise self._invalid("data follows the end of the deflate stream")
                    decoder = self._decoder(data)  # another gzip member (RFC 1952)
                elif not data and not piece:
                    raise self._invalid("the data ends before the compressed stream does")
        except zlib.error as exc:
            raise self._invalid(str(exc)) from None

    def _too_large(self, compressed: int) -> PayloadTooLarge:
        if self.limit <= max(int(self.ratio * compressed), RATIO_FREE_BYTES):
            return PayloadTooLarge(
                f"The request body decodes to more than this brim's limit of {self.limit} "
                "bytes (server.max_body_mb)."
            )
        return PayloadTooLarge(
            f"The request body decodes to more than {self.ratio:g} times its compressed size "
            f"of {compressed} bytes (server.max_decompression_ratio)."
        )

    def _invalid(self, why: str) -> InvalidRequest:
        return InvalidRequest(
            f"The request body is not valid {self.coding} data (Content-Encoding: "
            f"{self.coding}): {why}."
        )
