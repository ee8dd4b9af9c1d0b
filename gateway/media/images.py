"""Image bytes checked before anything else reads them: data: URIs parsed within a size cap, the
type sniffed from the bytes (never taken from a header), the pixel count read from the header
before a single pixel is decoded, then a full decode that proves the file is whole. Pure and
blocking: the connector runs it on a thread."""

from __future__ import annotations

import base64
import binascii
import io
import re
import urllib.parse
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from gateway.engine import IMAGE_TYPES, ImageInput

# Pillow's format names for the allowed types; its other plug-ins (PSD, TIFF, EPS, ...) are
# never consulted, so a file is never parsed by a decoder for a type the gateway refuses.
_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
# Declared types clients send for the allowed ones.
_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}
_DATA_URI = re.compile(r"^data:(?P<type>[^,;]*)(?P<params>(?:;[^,;]*)*),", re.IGNORECASE)


class ImageError(ValueError):
    """An image the gateway will not take; `code` names the kind, the message says why."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int


def declared_type(mime: str) -> str:
    """A declared image type as one of IMAGE_TYPES, or an ImageError naming what is allowed."""
    normal = mime.strip().lower()
    normal = _ALIASES.get(normal, normal)
    if normal not in IMAGE_TYPES:
        raise ImageError(
            f"the image's declared type {mime or 'text/plain'!r} is not an allowed image type "
            f"({allowed_types()})",
            "unsupported_image_type",
        )
    return normal


def allowed_types() -> str:
    return ", ".join(sorted(IMAGE_TYPES))


def max_data_uri_chars(max_bytes: int) -> int:
    """The longest data: URI whose payload can be within max_bytes (base64: 4 characters per 3
    bytes), with room for its header."""
    return 4 * -(-max_bytes // 3) + 256


def parse_data_uri(uri: str, limits: ImageLimits) -> bytes:
    """A data: URI's bytes: its declared type must be an allowed image type, its size within the
    cap (checked on the text before decoding anything)."""
    if len(uri) > max_data_uri_chars(limits.max_bytes):
        raise ImageError(
            f"the data: URI is {len(uri)} characters; images are limited to {limits.max_bytes} bytes",
            "image_too_large",
        )
    match = _DATA_URI.match(uri)
    if match is None:
        raise ImageError(
            "the data: URI is malformed (expected data:image/TYPE;base64,DATA)", "invalid_image_url"
        )
    declared_type(match.group("type"))
    params = [p.strip().lower() for p in match.group("params").split(";") if p.strip()]
    payload = uri[match.end() :]
    if "base64" in params:
        try:
            data = base64.b64decode(payload.translate(_NO_SPACE), validate=True)
        except (binascii.Error, ValueError):
            raise ImageError("the data: URI's base64 payload is not valid base64", "invalid_image") from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    check_size(len(data), limits.max_bytes)
    return data


_NO_SPACE = str.maketrans("", "", " \t\r\n")


def decode_base64(data: str, limits: ImageLimits) -> bytes:
    """A base64 image payload (Anthropic's base64 source) within the byte cap."""
    if len(data) > max_data_uri_chars(limits.max_bytes):
        raise ImageError(
            f"the base64 image is {len(data)} characters; images are limited to {limits.max_bytes} bytes",
            "image_too_large",
        )
    try:
        raw = base64.b64decode(data.translate(_NO_SPACE), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image data is not valid base64", "invalid_image") from None
    check_size(len(raw), limits.max_bytes)
    return raw


def check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise ImageError(
            f"the image is {size} bytes; images are limited to {max_bytes} bytes", "image_too_large"
        )


def inspect_image(data: bytes, source: str, limits: ImageLimits) -> ImageInput:
    """The validated image: an allowed type by its bytes, at most `max_pixels` by its header
    (read before any pixel is decoded: a small file may declare a huge image), then decoded in
    full, so a truncated or corrupt file is refused here rather than in the model."""
    check_size(len(data), limits.max_bytes)
    if not data:
        raise ImageError("the image is empty", "invalid_image")
    try:
        image = Image.open(io.BytesIO(data), formats=list(_FORMATS))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow's own limit (past the configured one only if that was raised above it); the
        # warning arrives as an exception where warnings are errors.
        raise _too_many_pixels(None, limits.max_pixels) from None
    except UnidentifiedImageError:
        raise ImageError(
            f"the data is not an image of an allowed type ({allowed_types()})", "invalid_image"
        ) from None
    except Exception as exc:  # Pillow's plug-ins raise what their parsers raise on bad headers
        raise ImageError(f"the image could not be read: {exc}", "invalid_image") from None
    with image:
        width, height = image.size
        if width <= 0 or height <= 0:
            raise ImageError("the image has no pixels", "invalid_image")
        if width * height > limits.max_pixels:
            raise _too_many_pixels((width, height), limits.max_pixels)
        mime = _FORMATS[str(image.format)]
        try:
            image.load()
        except Exception as exc:  # truncated data, bad chunks, checksum errors: all decoder-specific
            raise ImageError(f"the image is corrupt or truncated: {exc}", "invalid_image") from None
    return ImageInput(data=data, mime_type=mime, width=width, height=height, source=source)


def _too_many_pixels(size: tuple[int, int] | None, max_pixels: int) -> ImageError:
    what = f"{size[0]}x{size[1]} pixels" if size is not None else "too many pixels"
    return ImageError(
        f"the image is {what}; images are limited to {max_pixels} pixels (width x height)",
        "image_too_large",
    )
