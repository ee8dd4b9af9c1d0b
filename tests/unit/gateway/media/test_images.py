from __future__ import annotations

import base64
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.media.images import ImageError, ImageLimits, inspect_image, parse_data_uri
from tests.support.images import data_uri, gif, jpeg, png, png_bomb, truncated_png, webp

LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=4096 * 4096)


@pytest.mark.parametrize(
    ("data", "mime"),
    [(png(), "image/png"), (jpeg(), "image/jpeg"), (gif(), "image/gif"), (webp(), "image/webp")],
)
def test_allowed_types_are_sniffed_from_the_bytes(data: bytes, mime: str) -> None:
    image = inspect_image(data, "data", LIMITS)
    assert image.mime_type == mime
    assert image.data == data


def test_size_comes_from_the_image() -> None:
    image = inspect_image(png(13, 7), "data", LIMITS)
    assert (image.width, image.height) == (13, 7)


def test_a_declared_type_that_disagrees_is_taken_from_the_bytes() -> None:
    image = inspect_image(parse_data_uri(data_uri(jpeg(), "image/png"), LIMITS), "data", LIMITS)
    assert image.mime_type == "image/jpeg"


@pytest.mark.parametrize(
    "mime", ["text/plain", "", "application/octet-stream", "image/svg+xml", "image/tiff"]
)
def test_data_uris_declaring_other_types_are_refused(mime: str) -> None:
    with pytest.raises(ImageError) as info:
        parse_data_uri(data_uri(png(), mime), LIMITS)
    assert info.value.code == "unsupported_image_type"


def test_image_jpg_is_taken_as_jpeg() -> None:
    assert parse_data_uri(data_uri(jpeg(), "image/jpg"), LIMITS) == jpeg()


def test_a_data_uri_over_the_cap_is_refused_before_decoding() -> None:
    uri = "data:image/png;base64," + "A" * (2 << 20)
    with pytest.raises(ImageError) as info:
        parse_data_uri(uri, LIMITS)
    assert info.value.code == "image_too_large"


def test_a_payload_just_over_the_cap_is_refused() -> None:
    limits = ImageLimits(max_bytes=len(png()) - 1, max_pixels=LIMITS.max_pixels)
    with pytest.raises(ImageError) as info:
        parse_data_uri(data_uri(png()), limits)
    assert info.value.code == "image_too_large"


@pytest.mark.parametrize("uri", ["data:image/png;base64,@@@@", "data:image/png;base64,AAA", "data:image/png"])
def test_malformed_data_uris_are_refused(uri: str) -> None:
    with pytest.raises(ImageError):
        parse_data_uri(uri, LIMITS)


def test_a_header_declaring_too_many_pixels_is_refused_before_decoding() -> None:
    # Under Pillow's own limit, over ours: only our header check can refuse it as too large
    # (a decode would fail as corrupt instead).
    with pytest.raises(ImageError) as info:
        inspect_image(png_bomb(8000, 8000), "data", LIMITS)
    assert info.value.code == "image_too_large"
    assert "8000x8000" in str(info.value)


def test_a_header_past_pillows_limit_is_too_large_too() -> None:
    with pytest.raises(ImageError) as info:
        inspect_image(png_bomb(100_000, 100_000), "data", LIMITS)
    assert info.value.code == "image_too_large"


@pytest.mark.parametrize(
    "data", [truncated_png(), b"\x89PNG\r\n\x1a\n" + b"garbage" * 10, b"hello world", b"GIF89a", b""]
)
def test_corrupt_or_non_image_data_is_refused(data: bytes) -> None:
    with pytest.raises(ImageError) as info:
        inspect_image(data, "data", LIMITS)
    assert info.value.code == "invalid_image"


def test_other_formats_pillow_reads_are_refused() -> None:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, format="BMP")
    with pytest.raises(ImageError) as info:
        inspect_image(out.getvalue(), "data", LIMITS)
    assert info.value.code == "invalid_image"


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_are_an_image_error_or_an_image(data: bytes) -> None:
    try:
        image = inspect_image(data, "data", LIMITS)
    except ImageError:
        return
    assert image.width * image.height <= LIMITS.max_pixels


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_data_uris_never_raise_anything_but_an_image_error(payload: str) -> None:
    for uri in (f"data:image/png;base64,{payload}", f"data:{payload}", payload):
        with contextlib.suppress(ImageError):
            parse_data_uri(uri, LIMITS)


def test_base64_with_line_breaks_is_accepted() -> None:
    encoded = base64.encodebytes(png()).decode()
    assert parse_data_uri(f"data:image/png;base64,{encoded}", LIMITS) == png()
