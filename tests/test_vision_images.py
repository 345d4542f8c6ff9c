"""The rules over an image a client sends (``exo_p2p.vision.image``) and over an image URL's
address (``exo_p2p.vision.fetch.check_address``): formats served, bounds, corrupt files."""

from __future__ import annotations

import hashlib

import pytest

from exo_p2p.vision.fetch import ImageUrlPolicy, check_address, fetch_image
from exo_p2p.vision.image import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    ImageError,
    decode_base64,
    decode_image,
    parse_data_url,
)
from tests.support.images.samples import b64, data_url, gif_bomb, huge_png_header, image_bytes, truncated_png

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("fmt,media_type", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"),
                                            ("GIF", "image/gif")])
def test_each_format_served_decodes_with_its_digest_and_size(fmt: str, media_type: str) -> None:
    data = image_bytes(fmt, (40, 30))
    part = decode_image(data)
    assert (part.media_type, part.width, part.height) == (media_type, 40, 30)
    assert part.digest == hashlib.sha256(data).hexdigest() and part.data == data


@pytest.mark.parametrize("fmt", ["BMP", "TIFF"])
def test_a_format_not_served_is_refused_by_name(fmt: str) -> None:
    with pytest.raises(ImageError, match=f"format {fmt} is not served"):
        decode_image(image_bytes(fmt))


def test_bad_images_are_refused_before_any_runner_sees_them() -> None:
    with pytest.raises(ImageError, match="truncated or corrupt"):
        decode_image(truncated_png())
    with pytest.raises(ImageError, match="over the limit of 33554432 pixels"):
        decode_image(huge_png_header())
    with pytest.raises(ImageError, match="12000×12000 pixels, over the limit"):
        decode_image(huge_png_header(12000, 12000))
    with pytest.raises(ImageError, match="over the limit of 33554432 pixels"):
        decode_image(gif_bomb())
    with pytest.raises(ImageError, match="9000×9000 pixels, over the limit"):
        decode_image(gif_bomb(9000, 9000))
    with pytest.raises(ImageError, match="no image format known"):
        decode_image(b"%PDF-1.7 not an image at all")
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")


def test_pixel_and_side_bounds_sit_exactly_at_their_limits() -> None:
    side = 8192  # 8192 × 4096 = MAX_IMAGE_PIXELS: the header passes, one row more does not
    assert side * (MAX_IMAGE_PIXELS // side) == MAX_IMAGE_PIXELS
    with pytest.raises(ImageError, match="over the limit of 33554432 pixels"):
        decode_image(huge_png_header(side, MAX_IMAGE_PIXELS // side + 1))
    with pytest.raises(ImageError, match="a side is over the limit of 16384"):
        decode_image(huge_png_header(16385, 1))


def test_bytes_bound_checked_on_the_base64_text_before_decoding() -> None:
    with pytest.raises(ImageError, match=f"over {MAX_IMAGE_BYTES} bytes"):
        decode_base64("A" * (MAX_IMAGE_BYTES // 3 * 4 + 16))
    with pytest.raises(ImageError, match=f"over the limit of {MAX_IMAGE_BYTES}"):
        decode_image(b"\x89PNG" + b"\x00" * MAX_IMAGE_BYTES)
    with pytest.raises(ImageError, match="not valid base64"):
        decode_base64("abc$")


def test_data_urls_must_be_base64_images() -> None:
    png = image_bytes()
    assert parse_data_url(data_url(png)) == ("image/png", png)
    assert decode_base64(b64(png)) == png
    for bad in ("data:text/plain;base64,aGk=", "data:image/png,rawbytes", "http://x/y.png", "data:image/png;base64"):
        with pytest.raises(ImageError):
            parse_data_url(bad)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.1.9", "172.16.0.1", "169.254.169.254", "::1",
                                     "::ffff:127.0.0.1", "fe80::1", "fc00::1", "0.0.0.0", "224.0.0.1", "100.64.0.1"])
def test_private_loopback_and_reserved_addresses_are_refused_unless_allowed(address: str) -> None:
    with pytest.raises(ImageError, match="private, loopback or reserved"):
        check_address(address, allow_private=False)
    check_address(address, allow_private=True)


def test_public_addresses_pass_and_urls_are_off_by_default() -> None:
    for address in ("8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"):
        check_address(address, allow_private=False)
    with pytest.raises(ImageError, match="--allow-image-urls"):
        fetch_image("https://example.com/cat.png", ImageUrlPolicy())
    with pytest.raises(ImageError, match="http"):
        fetch_image("ftp://example.com/cat.png", ImageUrlPolicy(allow=True))
