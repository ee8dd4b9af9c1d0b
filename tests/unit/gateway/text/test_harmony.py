"""gpt-oss's o200k-harmony encoding, built offline from a model's tokenizer.json for openai-harmony:
written once under the cache folder, refused for any other vocabulary."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.errors import ServerConfigError
from gateway.text.harmony import O200K_BASE_SHA256, TIKTOKEN_FILE, load_encoding
from tests.support.fixtures import tiny_bpe_dir  # noqa: F401
from tests.unit.gateway.text.family_replies import encode, family_dir


def test_the_encoding_is_built_from_the_models_tokenizer_and_kept_in_the_cache(tmp_path: Path) -> None:
    encoding = load_encoding(family_dir("gptoss"), tmp_path)
    (kept,) = (tmp_path / "harmony").glob(f"*/{TIKTOKEN_FILE}")
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == O200K_BASE_SHA256
    text = "<|channel|>analysis<|message|>Bonjour 你好 🙂<|end|>"
    # The library's ids are the model's own.
    assert encoding.encode(text, allowed_special="all") == encode("gptoss", text)
    # One load per tokenizer and cache folder.
    assert load_encoding(family_dir("gptoss"), tmp_path) is encoding


def test_a_tokenizer_of_another_vocabulary_is_refused_in_one_line(
    tiny_bpe_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    with pytest.raises(ServerConfigError) as raised:
        load_encoding(tiny_bpe_dir, tmp_path)
    message = raised.value.message
    assert "needs the o200k-harmony vocabulary of gpt-oss" in message and str(tiny_bpe_dir) in message
    assert "\n" not in message
    assert not (tmp_path / "harmony").exists() or not list((tmp_path / "harmony").rglob(TIKTOKEN_FILE))


def test_a_folder_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match=r"has no readable tokenizer\.json"):
        load_encoding(tmp_path, tmp_path / "cache")
