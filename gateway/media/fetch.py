"""Fetching one image URL so that it cannot be turned against the gateway's network: http(s)
only, every hop's host checked against the allow-list and every address it resolves to checked
before connecting, the connection made to exactly those addresses (a resolver that answers only
what was checked: a second DNS answer can never be used), redirects followed here one hop at a
time with the same checks, proxies from the environment ignored, connect and read timeouts, and
the byte cap enforced while reading.

aiohttp rather than another client: its connector takes a resolver, which pins each connection to
the checked addresses while TLS still verifies the certificate for the host name."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from gateway.media.addresses import parse_address, refusal
from gateway.media.images import ImageError

# host, port -> the IP addresses it resolves to (text).
Resolve = Callable[[str, int], Awaitable[list[str]]]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HEADERS = {
    "Accept": "image/png, image/jpeg, image/webp, image/gif;q=0.9, */*;q=0.1",
    # Bytes on the wire are what the cap counts; no compressed body to inflate past it either.
    "Accept-Encoding": "identity",
    "User-Agent": "trtllm-gateway-media/1",
}
_CHUNK = 64 * 1024


async def resolve_host(host: str, port: int) -> list[str]:
    """The system resolver's addresses for a host (the default `Resolve`)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class FetchOptions:
    allowed_domains: frozenset[str]
    connect_timeout_s: float
    read_timeout_s: float
    max_redirects: int
    max_bytes: int
    # The certificates https URLs are verified against (None: the system's).
    ssl_context: ssl.SSLContext | None = None


class _PinnedResolver(AbstractResolver):
    """Answers a host name only with the addresses this fetch checked for it; any other name
    (none should be asked) gets no address, so nothing unchecked is ever connected to."""

    def __init__(self) -> None:
        self.pins: dict[str, list[str]] = {}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self.pins.get(host)
        if not addresses:
            raise OSError(f"{host}: no checked address")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


def check_url(url: URL, options: FetchOptions) -> tuple[str, bool]:
    """The URL's host (normalized) and whether the allow-list names it, or an ImageError for a
    scheme other than http(s), a URL with no host, or a host outside the allow-list."""
    if url.scheme not in ("http", "https"):
        scheme = f"`{url.scheme}:`" if url.scheme else "no scheme"
        raise ImageError(
            f"image URLs must be http:// or https:// (or a data: URI), not {scheme}", "invalid_image_url"
        )
    host = (url.raw_host or "").rstrip(".").lower()
    if not host:
        raise ImageError("the image URL has no host", "invalid_image_url")
    named = host in options.allowed_domains
    if options.allowed_domains and not named:
        raise ImageError(
            f"the image URL's host {host!r} is not one of this server's allowed media domains",
            "image_url_not_allowed",
        )
    return host, named


async def checked_addresses(host: str, port: int, trusted: bool, resolve: Resolve) -> list[str]:
    """Every address the host resolves to, each one allowed, or an ImageError naming the first
    that is not (a host that resolves to one private address is refused outright)."""
    literal = parse_address(host)
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise ImageError(
                f"the image URL's host {host!r} could not be resolved: {exc}", "image_fetch_failed"
            ) from None
        if not addresses:
            raise ImageError(f"the image URL's host {host!r} has no address", "image_fetch_failed")
    for address in addresses:
        parsed = parse_address(address)
        why = "not an IP address" if parsed is None else refusal(parsed, trusted=trusted)
        if why is not None:
            shown = repr(host) if literal is not None else f"{host!r} (which resolves to {address})"
            raise ImageError(f"image URLs may not reach {shown}: {why}", "image_url_not_allowed")
    return addresses


async def fetch(url_text: str, options: FetchOptions, resolve: Resolve) -> tuple[bytes, str]:
    """The image's bytes and the URL they came from (after redirects)."""
    try:
        url = URL(url_text)
    except (ValueError, TypeError):
        raise ImageError("the image URL is malformed", "invalid_image_url") from None
    pins = _PinnedResolver()
    connector = aiohttp.TCPConnector(
        resolver=pins,
        use_dns_cache=False,
        force_close=True,
        limit=1,
        ssl=options.ssl_context if options.ssl_context is not None else True,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=options.connect_timeout_s, sock_read=options.read_timeout_s
    )
    try:
        async with (
            aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                trust_env=False,  # a proxy from the environment would connect where we did not check
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            ) as session,
            asyncio.timeout(options.connect_timeout_s + options.read_timeout_s),
        ):
            return await _follow(session, pins, url, options, resolve)
    except ImageError:
        raise
    except TimeoutError:
        raise ImageError(
            f"fetching the image timed out (connect {options.connect_timeout_s:g} s, read "
            f"{options.read_timeout_s:g} s)",
            "image_fetch_timeout",
        ) from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise ImageError(
            f"fetching the image failed: {exc.__class__.__name__}: {exc}", "image_fetch_failed"
        ) from None


async def _follow(
    session: aiohttp.ClientSession, pins: _PinnedResolver, url: URL, options: FetchOptions, resolve: Resolve
) -> tuple[bytes, str]:
    for _ in range(options.max_redirects + 1):
        host, named = check_url(url, options)
        port = url.port or (443 if url.scheme == "https" else 80)
        pins.pins[url.raw_host or host] = await checked_addresses(host, port, named, resolve)
        async with session.get(url, allow_redirects=False, headers=_HEADERS) as response:
            if response.status in _REDIRECTS:
                location = response.headers.get("Location")
                if not location:
                    raise ImageError(
                        f"the image URL redirected (HTTP {response.status}) without a Location",
                        "image_fetch_failed",
                    )
                url = url.join(URL(location))
                continue
            if response.status != 200:
                raise ImageError(f"fetching the image failed: HTTP {response.status}", "image_fetch_failed")
            return await _read(response, options.max_bytes), str(url)
    raise ImageError(
        f"the image URL redirected more than {options.max_redirects} times", "image_fetch_failed"
    )


async def _read(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    length = response.content_length
    if length is not None and length > max_bytes:
        raise ImageError(
            f"the image is {length} bytes; images are limited to {max_bytes} bytes", "image_too_large"
        )
    body = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            raise ImageError(
                f"the image is more than {max_bytes} bytes; images are limited to {max_bytes} bytes",
                "image_too_large",
            )
    return bytes(body)
