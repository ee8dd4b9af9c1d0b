"""The fetcher against local servers only: 127.0.0.1 plays a public host where a test says so
(the address policy patched for that one address), 127.0.0.2 is a private one that must never
be contacted; host names resolve through a resolver the test injects."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import pytest

from gateway.engine import ImageInput
from gateway.errors import InvalidRequestError
from gateway.media import ImageRef, MediaConnector, MediaOptions, addresses, fetch
from tests.support.images import ImageServer, data_uri, image_server, png, self_signed

PUBLIC = "127.0.0.1"  # the one address the tests' policy treats as public


@pytest.fixture
def public_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 counts as a public address (everything else keeps the real policy)."""

    def policy(address: IPv4Address | IPv6Address, *, trusted: bool = False) -> str | None:
        return None if str(address) == PUBLIC else addresses.refusal(address, trusted=trusted)

    monkeypatch.setattr(fetch, "refusal", policy)


@pytest.fixture
async def public() -> AsyncIterator[ImageServer]:
    async with image_server(PUBLIC) as server:
        yield server


@pytest.fixture
async def private() -> AsyncIterator[ImageServer]:
    async with image_server("127.0.0.2") as server:
        yield server


class Resolver:
    """Names to addresses, one answer list per call (the last repeats), counting calls."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        seq = self.answers.get(host)
        if not seq:
            raise OSError(f"{host}: no such host")
        return seq[min(self.calls.count(host), len(seq)) - 1]


def connector(resolver: Resolver | None = None, **options: object) -> MediaConnector:
    return MediaConnector(
        MediaOptions(**{"connect_timeout_s": 5.0, "read_timeout_s": 5.0, **options}),  # type: ignore[arg-type]
        resolve=resolver or Resolver({}),
    )


async def load(media: MediaConnector, url: str) -> ImageInput:
    (image,) = await media.load_images([ImageRef(url, "image")])
    return image


async def refused(media: MediaConnector, url: str, code: str) -> str:
    with pytest.raises(InvalidRequestError) as info:
        await load(media, url)
    assert info.value.code == code, info.value.message
    assert info.value.param == "image"
    assert info.value.status_code == 400
    return info.value.message


async def test_a_loopback_server_is_refused_and_never_contacted(private: ImageServer) -> None:
    message = await refused(connector(), private.url("/image.png"), "image_url_not_allowed")
    assert "loopback" in message
    assert private.requests == []


async def test_a_name_resolving_to_a_private_address_is_refused_and_never_contacted(
    private: ImageServer,
) -> None:
    resolver = Resolver({"images.example.com": [["127.0.0.2"]]})
    url = f"http://images.example.com:{private.port}/image.png"
    message = await refused(connector(resolver), url, "image_url_not_allowed")
    assert "resolves to 127.0.0.2" in message
    assert private.requests == []


async def test_a_name_with_any_private_address_is_refused(
    public_loopback: None, private: ImageServer
) -> None:
    resolver = Resolver({"mixed.example.com": [[PUBLIC, "127.0.0.2"]]})
    await refused(
        connector(resolver), f"http://mixed.example.com:{private.port}/image.png", "image_url_not_allowed"
    )
    assert private.requests == []


async def test_a_public_host_is_fetched(public_loopback: None, public: ImageServer) -> None:
    resolver = Resolver({"images.example.com": [[PUBLIC]]})
    image = await load(connector(resolver), f"http://images.example.com:{public.port}/image.png")
    assert (image.mime_type, image.data) == ("image/png", png())
    assert image.source == f"http://images.example.com:{public.port}/image.png"
    assert public.requests == ["/image.png"]


async def test_a_redirect_to_a_private_address_is_refused_and_never_followed(
    public_loopback: None, public: ImageServer, private: ImageServer
) -> None:
    target = private.url("/image.png")
    url = f"{public.url('/redirect')}?to={target}"
    message = await refused(connector(), url, "image_url_not_allowed")
    assert "127.0.0.2" in message
    assert public.requests == [f"/redirect?to={target}"]
    assert private.requests == []


async def test_a_redirect_to_a_name_resolving_privately_is_refused(
    public_loopback: None, public: ImageServer, private: ImageServer
) -> None:
    resolver = Resolver({"internal.example.com": [["127.0.0.2"]]})
    url = f"{public.url('/redirect')}?to=http://internal.example.com:{private.port}/image.png"
    await refused(connector(resolver), url, "image_url_not_allowed")
    assert private.requests == []


async def test_dns_rebinding_cannot_move_the_connection(
    public_loopback: None, public: ImageServer, private: ImageServer
) -> None:
    # Both servers on one port would be ideal; the private one listens on its own, so the name
    # resolves to the public address first and the private one on any later lookup.
    resolver = Resolver({"rebind.example.com": [[PUBLIC], ["127.0.0.2"]]})
    image = await load(connector(resolver), f"http://rebind.example.com:{public.port}/image.png")
    assert image.data == png()
    assert resolver.calls == ["rebind.example.com"]
    assert private.requests == []


async def test_redirects_are_followed_within_the_cap(public_loopback: None, public: ImageServer) -> None:
    url = f"{public.url('/redirect')}?to=/image.jpg"
    image = await load(connector(), url)
    assert image.mime_type == "image/jpeg"
    assert image.source == public.url("/image.jpg")


async def test_too_many_redirects_are_refused(public_loopback: None, public: ImageServer) -> None:
    hop = public.url("/image.png")
    for _ in range(3):
        hop = f"{public.url('/redirect')}?to={hop.replace('?', '%3F').replace('=', '%3D')}"
    await refused(connector(max_redirects=1), hop, "image_fetch_failed")
    assert len(public.requests) == 2


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/a.png",
        "gopher://example.com/",
        "javascript:alert(1)",
        "//example.com/a.png",
        "example.com/a.png",
        "http:///a.png",
    ],
)
async def test_other_schemes_are_refused(url: str) -> None:
    resolver = Resolver({})
    await refused(connector(resolver), url, "invalid_image_url")
    assert resolver.calls == []


async def test_the_allow_list_refuses_other_hosts(public_loopback: None, public: ImageServer) -> None:
    resolver = Resolver({"images.example.com": [[PUBLIC]]})
    media = connector(resolver, allowed_domains=frozenset({"cdn.example.com"}))
    await refused(media, f"http://images.example.com:{public.port}/image.png", "image_url_not_allowed")
    assert public.requests == []
    assert resolver.calls == []


async def test_a_host_on_the_allow_list_may_be_a_local_server(public: ImageServer) -> None:
    # No policy patch: 127.0.0.1 is loopback, and allowed because the operator named it.
    media = connector(allowed_domains=frozenset({PUBLIC}))
    image = await load(media, public.url("/image.png"))
    assert image.data == png()


async def test_the_allow_list_is_checked_on_every_hop(public: ImageServer, private: ImageServer) -> None:
    media = connector(allowed_domains=frozenset({PUBLIC}))
    url = f"{public.url('/redirect')}?to={private.url('/image.png')}"
    await refused(media, url, "image_url_not_allowed")
    assert private.requests == []


async def test_fetching_urls_can_be_turned_off(public: ImageServer) -> None:
    media = connector(url_fetch=False, allowed_domains=frozenset({PUBLIC}))
    await refused(media, public.url("/image.png"), "image_url_not_allowed")
    assert public.requests == []
    assert (await load(media, data_uri(png()))).data == png()


async def test_a_server_that_never_answers_times_out(public_loopback: None, public: ImageServer) -> None:
    media = connector(read_timeout_s=0.3)
    await refused(media, public.url("/hang"), "image_fetch_timeout")


async def test_a_download_past_the_cap_is_cut(public_loopback: None, public: ImageServer) -> None:
    await refused(connector(max_image_bytes=100_000), public.url("/stream"), "image_too_large")


async def test_a_content_length_past_the_cap_is_refused_up_front(
    public_loopback: None, public: ImageServer
) -> None:
    await refused(connector(), public.url("/claims-huge"), "image_too_large")


async def test_an_error_status_is_refused(public_loopback: None, public: ImageServer) -> None:
    message = await refused(connector(), public.url("/missing"), "image_fetch_failed")
    assert "404" in message


async def test_a_fetched_non_image_is_refused(public_loopback: None, public: ImageServer) -> None:
    await refused(connector(), public.url("/text"), "invalid_image")


async def test_an_unresolvable_host_is_refused() -> None:
    await refused(connector(), "http://nowhere.example.com/a.png", "image_fetch_failed")


async def test_too_many_images_are_refused_before_any_fetch(
    public_loopback: None, public: ImageServer
) -> None:
    media = connector(max_images=2)
    refs = [ImageRef(public.url("/image.png"), f"images[{i}]") for i in range(3)]
    with pytest.raises(InvalidRequestError) as info:
        await media.load_images(refs)
    assert (info.value.code, info.value.param) == ("too_many_images", "images[2]")
    assert public.requests == []


async def test_images_keep_their_order(public_loopback: None, public: ImageServer) -> None:
    refs = [
        ImageRef(public.url("/image.jpg"), "a"),
        ImageRef(data_uri(png()), "b"),
        ImageRef(public.url("/image.png"), "c"),
    ]
    images = await connector().load_images(refs)
    assert [i.mime_type for i in images] == ["image/jpeg", "image/png", "image/png"]
    assert [i.source for i in images] == [public.url("/image.jpg"), "data", public.url("/image.png")]


async def test_https_connects_to_the_checked_address_and_verifies_the_host_name(
    public_loopback: None, tmp_path: Path
) -> None:
    cert, key = self_signed("images.example.com", tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    trust = ssl.create_default_context(cafile=str(cert))
    resolver = Resolver({"images.example.com": [[PUBLIC]], "other.example.com": [[PUBLIC]]})
    async with image_server(PUBLIC, tls=server_tls) as server:
        media = MediaConnector(MediaOptions(), resolve=resolver, ssl_context=trust)
        image = await load(media, f"https://images.example.com:{server.port}/image.png")
        assert image.data == png()
        # The same server under a name its certificate does not carry: the name is what TLS checks.
        message = await refused(
            media, f"https://other.example.com:{server.port}/image.png", "image_fetch_failed"
        )
        assert "certificate" in message.lower()
        # And the system's trust store does not know the test's certificate at all.
        await refused(
            connector(resolver), f"https://images.example.com:{server.port}/image.png", "image_fetch_failed"
        )
    assert server.requests == ["/image.png"]
