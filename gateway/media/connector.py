"""The one way a request's images come in: every image part of every API is an ImageRef handed to
`MediaConnector.load_images`, which applies the caps, fetches URLs (gateway.media.fetch) or decodes
data: URIs, and checks each image's type, size and pixels (gateway.media.images) off the event loop."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.engine import ImageInput
from gateway.errors import InvalidRequestError
from gateway.media import fetch as fetching
from gateway.media.images import ImageError, ImageLimits, inspect_image, parse_data_uri

if TYPE_CHECKING:
    from gateway.config import Settings


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image as a client referred to it: an http(s) URL or a data: URI, and the request field
    that holds it (errors name it)."""

    url: str
    param: str


@dataclass(frozen=True, slots=True)
class MediaOptions:
    """The fetch options and caps (Settings' media fields; the defaults are Settings')."""

    url_fetch: bool = True
    allowed_domains: frozenset[str] = frozenset()
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_redirects: int = 3
    max_image_bytes: int = 20 * 1024 * 1024
    max_images: int = 16
    max_pixels: int = 7680 * 4320

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaOptions:
        return cls(
            url_fetch=settings.media_url_fetch,
            allowed_domains=frozenset(d.rstrip(".").lower() for d in settings.allowed_media_domains),
            connect_timeout_s=settings.media_connect_timeout_s,
            read_timeout_s=settings.media_read_timeout_s,
            max_redirects=settings.media_max_redirects,
            max_image_bytes=settings.max_image_bytes,
            max_images=settings.max_images_per_request,
            max_pixels=settings.max_image_pixels,
        )


class MediaConnector:
    """Loads a request's images; one per service, holding nothing between requests."""

    def __init__(
        self,
        options: MediaOptions,
        *,
        resolve: fetching.Resolve | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.options = options
        # None: the system resolver, looked up on each fetch (tests put a local one in its place).
        self._resolve = resolve
        self._limits = ImageLimits(options.max_image_bytes, options.max_pixels)
        self._fetch = fetching.FetchOptions(
            allowed_domains=options.allowed_domains,
            connect_timeout_s=options.connect_timeout_s,
            read_timeout_s=options.read_timeout_s,
            max_redirects=options.max_redirects,
            max_bytes=options.max_image_bytes,
            ssl_context=ssl_context,
        )
        # Decoding a large image holds its pixels in memory: a few at a time per process.
        self._decoding = asyncio.Semaphore(max(1, min(4, os.cpu_count() or 1)))

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaConnector:
        return cls(MediaOptions.from_settings(settings))

    def check_count(self, refs: Sequence[ImageRef]) -> None:
        """A 400 for more images than a request may carry (before any is fetched)."""
        limit = self.options.max_images
        if len(refs) > limit:
            raise InvalidRequestError(
                f"the request has {len(refs)} images; this server takes at most {limit} per request",
                param=refs[limit].param,
                code="too_many_images",
            )

    async def load_images(self, refs: Sequence[ImageRef]) -> tuple[ImageInput, ...]:
        """The images, in order, each validated; an InvalidRequestError naming the first that
        fails (the others are cancelled)."""
        if not refs:
            return ()
        self.check_count(refs)
        tasks = [asyncio.ensure_future(self._load(ref)) for ref in refs]
        try:
            return tuple(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def _load(self, ref: ImageRef) -> ImageInput:
        try:
            url = ref.url.strip()
            scheme = url.partition(":")[0].lower()
            if scheme == "data":
                async with self._decoding:
                    return await asyncio.to_thread(self._from_data_uri, url)
            if scheme in ("http", "https") and not self.options.url_fetch:
                raise ImageError(
                    "this server does not fetch image URLs; send the image as a data: URI",
                    "image_url_not_allowed",
                )
            resolve = self._resolve if self._resolve is not None else fetching.resolve_host
            data, source = await fetching.fetch(url, self._fetch, resolve)
            async with self._decoding:
                return await asyncio.to_thread(inspect_image, data, source, self._limits)
        except ImageError as exc:
            raise InvalidRequestError(str(exc), param=ref.param, code=exc.code) from None

    def _from_data_uri(self, uri: str) -> ImageInput:
        return inspect_image(parse_data_uri(uri, self._limits), "data", self._limits)
