"""Image sizes from base64 data URLs (header bytes only), and what an image costs in tokens.

OpenAI's rule for gpt-4o-class models: `detail: low` costs a flat 85 tokens; `high` (and `auto`,
counted as high so the estimate errs high) scales the image down to fit 2048×2048, then down so
its shorter side is at most 768 (images are never scaled up), and costs 85 + 170 per 512-px
tile. gpt-4o-mini bills the same tiles at 2833 + 5667 per tile. Remote URLs are never fetched:
they are counted as a 1024×1536 image.

Anthropic's and Gemini's rules are below with their constants; what a PDF costs needs its pages
counted, which decodes it, so page counts are cached by content.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
import threading

from cachetools import LRUCache

REMOTE_IMAGE_SIZE = (1024, 1536)
TILE_SIDE = 512
MAX_LONG_SIDE = 2048  # an image is scaled down to fit 2048×2048 …
MAX_SHORT_SIDE = 768  # … then so that its shorter side is at most 768
# The most tiles an image can have after scaling: 2048×768 is 4 × 2 tiles.
MAX_TILES = math.ceil(MAX_LONG_SIDE / TILE_SIDE) * math.ceil(MAX_SHORT_SIDE / TILE_SIDE)
OPENAI_IMAGE_BASE, OPENAI_PER_TILE = 85, 170  # `detail: low` costs the base alone
MINI_IMAGE_BASE, MINI_PER_TILE = 2833, 5667  # gpt-4o-mini
MAX_IMAGE_TOKENS = MINI_IMAGE_BASE + MINI_PER_TILE * MAX_TILES  # the most any rule here counts
GEMINI_IMAGE_TOKENS = 258  # Gemini bills an image (up to 384 px a side) as 258 tokens
_HEADER_BASE64_CHARS = 64 * 1024  # enough for any PNG/GIF/WebP header and most JPEG SOF markers


def data_url_size(url: str) -> tuple[int, int] | None:
    """(width, height) of a `data:image/...;base64,` URL, or None if it cannot be read."""
    if not url.startswith("data:"):
        return None
    meta, comma, payload = url.partition(",")
    if not comma or not meta.endswith(";base64"):
        return None
    # Line-wrapped base64 is common: drop whitespace before cutting to whole 4-char groups.
    head = "".join(payload[: _HEADER_BASE64_CHARS * 2].split())[:_HEADER_BASE64_CHARS]
    head = head[: len(head) - len(head) % 4]
    try:
        data = base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return None
    return image_size(data)


def image_size(data: bytes) -> tuple[int, int] | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    index = 2
    while index + 9 <= len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # standalone markers carry no length
            index += 2
            continue
        length = int.from_bytes(data[index + 2 : index + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return width, height
        index += 2 + length
    return None


def tile_count(width: int, height: int) -> int:
    if width <= 0 or height <= 0:
        return 1
    scale = min(1.0, MAX_LONG_SIDE / max(width, height))
    scale *= min(1.0, MAX_SHORT_SIDE / (min(width, height) * scale))
    return math.ceil(width * scale / TILE_SIDE) * math.ceil(height * scale / TILE_SIDE)


def image_tokens(url: str, detail: str | None, model: str = "") -> int:
    mini = "gpt-4o-mini" in model.lower()
    base, per_tile = (
        (MINI_IMAGE_BASE, MINI_PER_TILE) if mini else (OPENAI_IMAGE_BASE, OPENAI_PER_TILE)
    )
    if detail == "low":
        return base
    size = data_url_size(url) if url.startswith("data:") else REMOTE_IMAGE_SIZE
    width, height = size or REMOTE_IMAGE_SIZE
    return base + per_tile * tile_count(width, height)


ANTHROPIC_MAX_EDGE = 1568
ANTHROPIC_MAX_IMAGE_TOKENS = 1600
PDF_PAGE_TOKENS = 3000  # Anthropic: a page costs 1 500-3 000 tokens (text plus its image); the top
REMOTE_PDF_PAGES = 10  # a PDF by URL is never fetched: counted as ten pages


def anthropic_image_tokens(source: object) -> int:
    """Anthropic's rule: about width × height / 750, after scaling the long edge to 1568 px;
    at most ~1 600. An image whose size cannot be read counts as the most."""
    size = None
    if isinstance(source, dict) and source.get("type") == "base64":
        size = data_url_size(
            f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
        )
    if size is None:
        return ANTHROPIC_MAX_IMAGE_TOKENS
    width, height = size
    scale = min(1.0, ANTHROPIC_MAX_EDGE / max(width, height, 1))
    return min(ANTHROPIC_MAX_IMAGE_TOKENS, math.ceil(width * scale * height * scale / 750))


def pdf_tokens(source: object) -> int:
    """A PDF's pages at their top cost (at least one); a PDF by URL as `REMOTE_PDF_PAGES`."""
    if isinstance(source, dict) and source.get("type") == "base64":
        return PDF_PAGE_TOKENS * max(1, pdf_pages(str(source.get("data", ""))))
    return PDF_PAGE_TOKENS * REMOTE_PDF_PAGES


_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
# Page counts by (length, hash) of the base64 text: a PDF stays in a conversation for many turns,
# and decoding it (tens of ms for a large one) every request would hold up the event loop.
_page_counts: LRUCache[tuple[int, int], int] = LRUCache(maxsize=1_024)
_pdf_lock = threading.Lock()


def pdf_pages(data: str) -> int:
    """The pages of a base64-encoded PDF (0 if none can be found), cached by content."""
    key = (len(data), hash(data))
    with _pdf_lock:
        cached = _page_counts.get(key)
    if cached is not None:
        return cached
    try:
        decoded = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        decoded = b""
    pages = len(_PAGE.findall(decoded))
    with _pdf_lock:
        _page_counts[key] = pages
    return pages
