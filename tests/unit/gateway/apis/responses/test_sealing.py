"""Sealed reasoning: round trip, no forgery, no reading, the key kept in the state directory."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from gateway.apis.responses.sealing import KEY_FILE, ReasoningSealer, load_or_create_key, parse_key
from gateway.errors import InvalidRequestError, ServerConfigError


def test_sealed_reasoning_opens_to_its_text_and_hides_it() -> None:
    sealer = ReasoningSealer(bytes(range(32)))
    token = sealer.seal("the secret plan", model="tiny")
    assert "secret" not in token and b"secret" not in base64.urlsafe_b64decode(token)
    assert sealer.open(token, param="input[1].encrypted_content") == "the secret plan"
    # Each seal is fresh (random nonce), yet both open.
    assert sealer.seal("the secret plan", model="tiny") != token


@pytest.mark.parametrize("tamper", ["flip", "truncate", "garbage", "other_key", "empty"])
def test_a_changed_or_foreign_token_is_a_400(tamper: str) -> None:
    sealer = ReasoningSealer(bytes(32))
    token = sealer.seal("x", model="tiny")
    raw = bytearray(base64.urlsafe_b64decode(token))
    if tamper == "flip":
        raw[-1] ^= 1
        token = base64.urlsafe_b64encode(bytes(raw)).decode()
    elif tamper == "truncate":
        token = base64.urlsafe_b64encode(bytes(raw[:-4])).decode()
    elif tamper == "garbage":
        token = "not base64 at all ✓"
    elif tamper == "other_key":
        token = ReasoningSealer(bytes([1]) * 32).seal("x", model="tiny")
    else:
        token = ""
    with pytest.raises(InvalidRequestError) as info:
        sealer.open(token, param="input[0].encrypted_content")
    assert info.value.param == "input[0].encrypted_content"


def test_the_key_is_made_once_and_kept(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path / "state")
    assert len(key) == 32
    assert load_or_create_key(tmp_path / "state") == key
    assert (tmp_path / "state" / KEY_FILE).stat().st_mode & 0o777 == 0o600
    token = ReasoningSealer(key).seal("kept", model="m")
    assert ReasoningSealer(load_or_create_key(tmp_path / "state")).open(token, param="p") == "kept"


@pytest.mark.parametrize("text", ["short", "!!!", base64.b64encode(bytes(16)).decode()])
def test_a_configured_key_must_be_32_bytes_of_base64(text: str) -> None:
    with pytest.raises(ServerConfigError):
        parse_key(text)
    assert parse_key(base64.b64encode(bytes(32)).decode()) == bytes(32)
