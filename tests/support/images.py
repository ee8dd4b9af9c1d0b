"""Images and image servers for tests: real PNG/JPEG bytes made with Pillow, hostile ones (a
header that declares a huge image, a truncated file), and a local HTTP server on a loopback
address that counts the requests it gets (a refused server must show none)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
import ssl
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from PIL import Image


def png(width: int = 8, height: int = 6, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


def jpeg(width: int = 8, height: int = 6, color: tuple[int, int, int] = (30, 200, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="JPEG")
    return out.getvalue()


def gif(width: int = 4, height: int = 4) -> bytes:
    out = io.BytesIO()
    Image.new("P", (width, height), 1).save(out, format="GIF")
    return out.getvalue()


def webp(width: int = 4, height: int = 4) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(out, format="WEBP")
    return out.getvalue()


def png_bomb(width: int, height: int) -> bytes:
    """A small PNG whose header declares width x height pixels (its one row of data does not
    match: decoding it would fail, so a 'too many pixels' error proves the header was checked
    before any decoding)."""
    data = bytearray(png(1, 1))
    # IHDR: 8-byte signature, 4-byte length, b"IHDR", then width and height, then 5 bytes, CRC.
    struct.pack_into(">II", data, 16, width, height)
    crc = zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF
    struct.pack_into(">I", data, 29, crc)
    return bytes(data)


def truncated_png() -> bytes:
    data = png(64, 64, (1, 2, 3))
    return data[: len(data) // 2]


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@dataclass
class ImageServer:
    """A local HTTP server: `/image.png`, `/image.jpg`, `/redirect?to=URL` (302), `/hang` (never
    answers until the test ends), `/stream` (more bytes than any cap, no Content-Length),
    `/claims-huge` (a Content-Length past any cap), `/text` (not an image)."""

    host: str
    scheme: str = "http"
    port: int = 0
    requests: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"


def self_signed(name: str, directory: Path) -> tuple[Path, Path]:
    """A certificate for `name` (signed by its own key) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@asynccontextmanager
async def image_server(
    host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
) -> AsyncIterator[ImageServer]:
    """The server on `host` (a free port), over TLS with `tls` (a server context) if given."""
    server = ImageServer(host, scheme="https" if tls is not None else "http")

    def counted(handler: Callable[[web.Request], object]) -> Callable[[web.Request], object]:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            server.requests.append(request.path_qs)
            return await handler(request)  # type: ignore[misc,no-any-return]

        return wrapped

    async def image_png(request: web.Request) -> web.Response:
        return web.Response(body=png(), content_type="image/png")

    async def image_jpg(request: web.Request) -> web.Response:
        return web.Response(body=jpeg(), content_type="image/jpeg")

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def hang(request: web.Request) -> web.Response:
        await server.release.wait()
        return web.Response(body=png(), content_type="image/png")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png"})
        await response.prepare(request)
        chunk = b"\0" * 65536
        try:
            for _ in range(2048):  # 128 MiB at most: far past any cap a test sets
                await response.write(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response

    async def claims_huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png", "Content-Length": str(1 << 40)})
        await response.prepare(request)
        await response.write(png())
        return response

    async def text(request: web.Request) -> web.Response:
        return web.Response(text="hello", content_type="text/plain")

    app = web.Application()
    for path, handler in [
        ("/image.png", image_png),
        ("/image.jpg", image_jpg),
        ("/redirect", redirect),
        ("/hang", hang),
        ("/stream", stream),
        ("/claims-huge", claims_huge),
        ("/text", text),
    ]:
        app.router.add_get(path, counted(handler))  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=tls)
    await site.start()
    server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()


def image_bytes(kind: str, size: tuple[int, int], seed: int) -> bytes:
    """A deterministic picture with some structure (gradients and noise), PNG or JPEG encoded: a
    vision-language model's answer depends on it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    width, height = size
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    base = np.concatenate([x + 0 * y, y + 0 * x, (x + y) / 2], axis=2)
    pixels = np.clip(base * rng.uniform(0.2, 1.0, 3) + rng.normal(0, 40, (height, width, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype("uint8"), "RGB").save(out, format=kind.upper())
    return out.getvalue()


def data_uri_of(data: bytes) -> str:
    """A data: URI with the image's own type (PNG or JPEG, read from its signature)."""
    return data_uri(data, "image/png" if data.startswith(b"\x89PNG") else "image/jpeg")


def reference_greedy(
    model_dir: Path, messages: list[dict[str, object]], images: list[bytes], max_new_tokens: int
) -> tuple[str, int]:
    """transformers' greedy text for chat ``messages`` whose ``{"type": "image"}`` parts take
    ``images`` in order, and the processor's prompt token count: its processor and ``generate``."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()
    pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt, images=pictures or None, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    prompt_len = int(inputs["input_ids"].shape[1])
    return processor.decode(out[0][prompt_len:], skip_special_tokens=True), prompt_len
