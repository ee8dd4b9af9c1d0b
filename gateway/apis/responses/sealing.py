"""Sealed reasoning (`include: ["reasoning.encrypted_content"]`): a reasoning item's text goes to
the client encrypted and authenticated (AES-256-GCM), so a client running with `store: false` can
hand it back and the gateway restores it, and no client can read or forge it.

The key comes from the configuration (base64 of 32 bytes, shared by every replica) or is made
once and kept in the state directory (`reasoning.key`, mode 0600)."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gateway.errors import InvalidRequestError, ServerConfigError

logger = logging.getLogger(__name__)

_VERSION: Final = b"\x01"
_NONCE_BYTES: Final = 12
# Bound to its purpose: a sealed value made for anything else never opens as reasoning.
_AAD: Final = b"trtllm-openai-gateway/responses/reasoning/v1"
KEY_FILE: Final = "reasoning.key"


def parse_key(text: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ServerConfigError("the reasoning encryption key must be base64 of 32 bytes") from None
    if len(key) != 32:
        raise ServerConfigError(f"the reasoning encryption key must be 32 bytes, got {len(key)}")
    return key


def load_or_create_key(state_dir: Path) -> bytes:
    """The key kept in `state_dir`, made on first use. Several processes may race to make it: the
    file is created exclusively, and a loser reads the winner's."""
    path = state_dir / KEY_FILE
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return parse_key(path.read_text(encoding="ascii"))
    key = AESGCM.generate_key(bit_length=256)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(base64.b64encode(key).decode("ascii") + "\n")
    logger.info("made a new reasoning encryption key in %s", path)
    return key


class ReasoningSealer:
    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, text: str, *, model: str) -> str:
        payload = json.dumps({"model": model, "text": text}, separators=(",", ":")).encode()
        nonce = os.urandom(_NONCE_BYTES)
        sealed = _VERSION + nonce + self._aead.encrypt(nonce, payload, _AAD)
        return base64.urlsafe_b64encode(sealed).decode("ascii")

    def open(self, token: str, *, param: str) -> str:
        """The reasoning text sealed in `token`; a 400 naming `param` when it was not made by
        this gateway's key or was changed."""
        try:
            raw = base64.urlsafe_b64decode(token.encode("ascii"))
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raw = b""
        if len(raw) > 1 + _NONCE_BYTES and raw[:1] == _VERSION:
            nonce, body = raw[1 : 1 + _NONCE_BYTES], raw[1 + _NONCE_BYTES :]
            try:
                payload = json.loads(self._aead.decrypt(nonce, body, _AAD))
            except InvalidTag:
                payload = None
            if isinstance(payload, dict) and isinstance(payload.get("text"), str):
                return payload["text"]
        raise InvalidRequestError(
            f"The encrypted content in '{param}' could not be verified: it was not made by this "
            "server, or it was changed.",
            param=param,
            code="invalid_encrypted_content",
        )
