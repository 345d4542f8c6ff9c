"""Images for the vision tests, made in memory: valid ones of each format served, and the bad
ones the bounds refuse (truncated, a 30000×30000 header, a GIF bomb's huge screen, an
unserved format). Pure: bytes in, bytes out."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (32, 24), color: tuple[int, int, int] = (200, 40, 90)) -> bytes:
    """A ``size`` image of one colour with a diagonal, encoded as ``fmt`` (PNG, JPEG, WEBP, GIF, BMP, TIFF)."""
    image = Image.new("RGB", size, color)
    for i in range(min(size)):
        image.putpixel((i, i), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    """``data:<media_type>;base64,<data>``."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def truncated_png() -> bytes:
    """A valid PNG cut in the middle of its pixel data (its header still reads)."""
    whole = image_bytes("PNG", (256, 256))
    return whole[: len(whole) // 2]


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def huge_png_header(width: int = 30000, height: int = 30000) -> bytes:
    """A PNG whose header says ``width``×``height`` (RGB, 8 bits) and whose data is a few
    hundred bytes of zlib: a decompression bomb if anything decoded it."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 65536, 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def gif_bomb(width: int = 65535, height: int = 65535) -> bytes:
    """A GIF whose logical screen is ``width``×``height`` with one 1×1 frame: decoders that
    allocate the screen first spend gigabytes."""
    header = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return header + frame + b"\x3b"
