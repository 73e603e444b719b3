"""Image sizes read from header bytes, and OpenAI's token cost of an image."""

from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brim.policies.images import (
    REMOTE_IMAGE_SIZE,
    data_url_size,
    image_size,
    image_tokens,
    tile_count,
)


def png_header(width: int, height: int) -> bytes:
    """The PNG signature and an IHDR chunk: width and height big-endian at bytes 16..24."""
    ihdr = struct.pack(">II", width, height) + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + b"\0\0\0\0"


def gif_header(version: bytes, width: int, height: int) -> bytes:
    return version + struct.pack("<HH", width, height) + b"\xf7\x00\x00"


def jpeg_header(width: int, height: int) -> bytes:
    """SOI, an APP0 (JFIF) segment to skip, then SOF0: precision, height, width, components."""
    app0_body = b"JFIF\0\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    app0 = b"\xff\xe0" + struct.pack(">H", len(app0_body) + 2) + app0_body
    sof0_body = (
        b"\x08" + struct.pack(">HH", height, width) + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    )
    sof0 = b"\xff\xc0" + struct.pack(">H", len(sof0_body) + 2) + sof0_body
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xda"


def riff(chunk: bytes, body: bytes) -> bytes:
    payload = b"WEBP" + chunk + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", len(payload)) + payload


def webp_vp8x(width: int, height: int) -> bytes:
    """VP8X: flags and 3 reserved bytes, then canvas width−1 and height−1 as 24-bit LE."""
    body = b"\x10\0\0\0" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return riff(b"VP8X", body)


def webp_vp8(width: int, height: int) -> bytes:
    """Lossy: a 3-byte frame tag, the start code 9d 01 2a, then 14-bit width and height (LE)."""
    # The top two bits of each field are a scale, which the module must mask off.
    body = b"\x30\x01\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width | 0x4000, height | 0x8000)
    return riff(b"VP8 ", body + b"\0" * 8)


def webp_vp8l(width: int, height: int) -> bytes:
    """Lossless: the signature byte 0x2f, then width−1 and height−1 in 14-bit fields (LE)."""
    bits = (width - 1) | ((height - 1) << 14)
    return riff(b"VP8L", b"\x2f" + bits.to_bytes(4, "little"))


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


# ---- image_size ----------------------------------------------------------------------------


def test_png_size_is_read_big_endian() -> None:
    assert image_size(png_header(640, 480)) == (640, 480)
    assert image_size(png_header(70_000, 3)) == (70_000, 3)


@pytest.mark.parametrize("version", [b"GIF87a", b"GIF89a"])
def test_gif_size_is_read_little_endian(version: bytes) -> None:
    assert image_size(gif_header(version, 300, 2)) == (300, 2)
    assert image_size(gif_header(version, 0x0102, 0x0304)) == (0x0102, 0x0304)


def test_jpeg_skips_app0_and_reads_height_then_width_from_sof0() -> None:
    data = jpeg_header(width=1920, height=1080)
    assert data[2:4] == b"\xff\xe0"  # the SOF0 is not the first segment
    assert image_size(data) == (1920, 1080)


def test_jpeg_progressive_sof2_is_read_too() -> None:
    data = jpeg_header(width=800, height=600).replace(b"\xff\xc0", b"\xff\xc2")
    assert image_size(data) == (800, 600)


def test_jpeg_huffman_table_marker_is_not_taken_for_a_frame() -> None:
    dht_body = b"\x00" + struct.pack(">HH", 9999, 9999) + b"\0" * 12
    dht = b"\xff\xc4" + struct.pack(">H", len(dht_body) + 2) + dht_body
    data = jpeg_header(width=64, height=32)
    data = data[:2] + dht + data[2:]
    assert image_size(data) == (64, 32)


def test_webp_vp8x() -> None:
    assert image_size(webp_vp8x(1, 1)) == (1, 1)
    assert image_size(webp_vp8x(4000, 3000)) == (4000, 3000)
    assert image_size(webp_vp8x(1 << 24, 1 << 24)) == (1 << 24, 1 << 24)


def test_webp_vp8_masks_the_scale_bits() -> None:
    assert image_size(webp_vp8(1024, 768)) == (1024, 768)
    assert image_size(webp_vp8(0x3FFF, 1)) == (0x3FFF, 1)


def test_webp_vp8l_packs_width_and_height_minus_one_in_14_bits() -> None:
    assert image_size(webp_vp8l(1, 1)) == (1, 1)
    assert image_size(webp_vp8l(400, 301)) == (400, 301)
    assert image_size(webp_vp8l(16384, 16384)) == (16384, 16384)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello world, not an image at all",
        b"BM" + b"\0" * 40,  # BMP is not read
        b"\x89PNG\r\n\x1a\n\0\0",  # PNG cut short before IHDR
        b"GIF89a\x01",  # GIF cut short
        b"RIFF\0\0\0\0WEBPVP8Z" + b"\0" * 20,  # unknown WebP chunk
        b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 20,  # RIFF, but not WebP
        b"\xff\xd8\x00\x00" + b"\0" * 20,  # JPEG whose next byte is not a marker
        b"\xff\xd8",  # JPEG with no segments
    ],
)
def test_unknown_or_truncated_bytes_give_none(data: bytes) -> None:
    assert image_size(data) is None


# ---- data_url_size -------------------------------------------------------------------------


def test_data_url_size_of_a_png_header() -> None:
    assert data_url_size(data_url(png_header(1234, 567))) == (1234, 567)


def test_data_url_size_reads_only_the_head_of_a_long_payload() -> None:
    payload = png_header(2048, 4096) + bytes(range(256)) * 2_000  # ~500 kB after the header
    url = data_url(payload)
    assert len(url) > 300_000
    assert data_url_size(url) == (2048, 4096)


def test_data_url_size_of_other_formats() -> None:
    assert data_url_size(data_url(jpeg_header(320, 240), "image/jpeg")) == (320, 240)
    assert data_url_size(data_url(webp_vp8l(50, 60), "image/webp")) == (50, 60)
    assert data_url_size(data_url(gif_header(b"GIF89a", 7, 9), "image/gif")) == (7, 9)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/cat.png",
        "http://example.com/data:image/png;base64,AAAA",
        "file:///tmp/cat.png",
        "",
    ],
)
def test_non_data_url_gives_none(url: str) -> None:
    assert data_url_size(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64,a===",  # one data character: undecodable
        "data:image/png;base64,!!!!****",  # nothing in the alphabet
        "data:image/png;base64,=abc",
        "data:image/png;base64,ab=cdefg",
        "data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
        "data:image/png;base64",  # no comma
        "data:,",
    ],
)
def test_broken_data_url_gives_none_without_raising(url: str) -> None:
    assert data_url_size(url) is None


# ---- tile_count / image_tokens -------------------------------------------------------------


def test_openai_worked_example_1024_square_high() -> None:
    # 1024 < 2048, no first resize; shortest side 1024 → 768×768 → 2×2 tiles.
    assert tile_count(1024, 1024) == 4
    assert image_tokens(data_url(png_header(1024, 1024)), "high", "gpt-4o") == 765


def test_openai_worked_example_2048_by_4096_high() -> None:
    # Fit 2048 box → 1024×2048; shortest side → 768×1536 → 2×3 tiles.
    assert tile_count(2048, 4096) == 6
    assert image_tokens(data_url(png_header(2048, 4096)), "high", "gpt-4o") == 1105


@pytest.mark.parametrize("size", [(1, 1), (1024, 1024), (2048, 4096), (10_000, 10)])
def test_low_detail_is_a_flat_85(size: tuple[int, int]) -> None:
    assert image_tokens(data_url(png_header(*size)), "low", "gpt-4o") == 85
    assert image_tokens("https://example.com/cat.png", "low", "gpt-4o") == 85


@pytest.mark.parametrize("size", [(1024, 1024), (2048, 4096), (300, 300), (5000, 900)])
def test_auto_and_unset_detail_count_as_high(size: tuple[int, int]) -> None:
    url = data_url(png_header(*size))
    high = image_tokens(url, "high", "gpt-4o")
    assert image_tokens(url, "auto", "gpt-4o") == high
    assert image_tokens(url, None, "gpt-4o") == high
    assert high > 85


def test_small_image_is_not_scaled_up() -> None:
    assert tile_count(300, 300) == 1
    assert image_tokens(data_url(png_header(300, 300)), "high") == 85 + 170


def test_remote_url_counts_as_1024_by_1536() -> None:
    assert REMOTE_IMAGE_SIZE == (1024, 1536)
    assert tile_count(*REMOTE_IMAGE_SIZE) == 6
    assert image_tokens("https://example.com/cat.png", "high", "gpt-4o") == 85 + 170 * 6 == 1105
    assert image_tokens("https://example.com/cat.png", "auto") == 1105


def test_unreadable_data_url_counts_as_a_remote_image() -> None:
    assert image_tokens("data:image/png;base64,!!!!", "high") == 1105


def test_gpt_4o_mini_bills_2833_plus_5667_per_tile() -> None:
    url = data_url(png_header(1024, 1024))
    assert image_tokens(url, "low", "gpt-4o-mini") == 2833
    assert image_tokens(url, "high", "gpt-4o-mini") == 2833 + 5667 * 4
    assert image_tokens(url, "high", "openai/gpt-4o-mini-2024-07-18") == 2833 + 5667 * 4
    assert image_tokens("https://example.com/cat.png", "high", "gpt-4o-mini") == 2833 + 5667 * 6


@pytest.mark.parametrize(
    ("width", "height", "tiles"),
    [
        (512, 512, 1),
        (513, 512, 2),
        (768, 768, 4),
        (4096, 8192, 6),
        (10_000, 10, 4),  # 2048×2 → 4×1
        (2048, 768, 8),  # no scaling: 4×2
        (1536, 1024, 6),  # shortest 1024 → 1152×768 → 3×2
    ],
)
def test_tile_count_table(width: int, height: int, tiles: int) -> None:
    assert tile_count(width, height) == tiles
    assert tile_count(height, width) == tiles


def test_degenerate_sizes_count_one_tile() -> None:
    assert tile_count(0, 100) == 1
    assert tile_count(100, -5) == 1


@given(st.integers(1, 10_000), st.integers(1, 10_000))
def test_tile_count_is_between_1_and_8(width: int, height: int) -> None:
    # After scaling, the long side is ≤ 2048 (≤ 4 tiles) and the short side ≤ 768 (≤ 2 tiles),
    # so the count is a product a×b with a ≤ 2 and b ≤ 4: never 5 or 7, never more than 8.
    # (Checked exhaustively over the whole 1..10000 grid while writing this test.)
    tiles = tile_count(width, height)
    assert 1 <= tiles <= 8
    assert tiles in {1, 2, 3, 4, 6, 8}
    assert tile_count(height, width) == tiles


def test_line_wrapped_base64_is_read() -> None:
    import base64 as b64
    import struct as st

    header = (
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + st.pack(">II", 640, 480) + b"\x08\x02\x00\x00\x00"
    )
    encoded = b64.encodebytes(header + b"\x00" * 100_000).decode()  # 76-character lines
    assert "\n" in encoded
    assert data_url_size("data:image/png;base64," + encoded) == (640, 480)


def test_data_urls_that_are_not_base64_are_not_decoded() -> None:
    assert data_url_size("data:image/svg+xml,<svg width='10' height='10'/>") is None


def test_model_names_match_regardless_of_case() -> None:
    assert image_tokens("https://example.test/a.png", "low", "GPT-4o-mini") == 2833


# ---- PDF pages -----------------------------------------------------------------------------


def test_a_pdf_is_decoded_once_however_often_it_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from brim.policies import images

    decoded: list[int] = []
    real = images.base64.b64decode

    def counting(data: str | bytes, validate: bool = False) -> bytes:
        decoded.append(len(data))
        return real(data, validate=validate)

    monkeypatch.setattr(images.base64, "b64decode", counting)
    pdf = b"%PDF-1.4 " + uuid.uuid4().hex.encode() + b"\n" + b"1 0 obj << /Type /Page >>\n" * 3
    text = base64.b64encode(pdf).decode()
    for _ in range(3):  # each request parses its body anew: an equal string, not the same one
        source = {"type": "base64", "media_type": "application/pdf", "data": "".join([text])}
        assert images.pdf_tokens(source) == 3 * images.PDF_PAGE_TOKENS
    assert len(decoded) == 1


def test_a_pdf_without_pages_counts_as_one_page_and_a_remote_one_as_ten() -> None:
    from brim.policies.images import PDF_PAGE_TOKENS, pdf_tokens

    empty = {"type": "base64", "data": base64.b64encode(b"%PDF-1.4 nothing").decode()}
    assert pdf_tokens(empty) == PDF_PAGE_TOKENS
    assert pdf_tokens({"type": "url", "url": "https://e.com/a.pdf"}) == 10 * PDF_PAGE_TOKENS


def test_the_image_constants_are_the_rules_own_figures() -> None:
    from brim.policies.images import GEMINI_IMAGE_TOKENS, MAX_IMAGE_TOKENS, MAX_TILES

    assert MAX_TILES == tile_count(2048, 768) == 8
    largest = data_url(png_header(2048, 768))
    assert MAX_IMAGE_TOKENS == 2833 + 5667 * 8 == image_tokens(largest, "high", "gpt-4o-mini")
    assert GEMINI_IMAGE_TOKENS == 258
