"""The tiny local model (deterministic, cached, loadable offline) and postprocessing's token surface bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from deploy import model_repo, tiny_model


def _load_token_bytes() -> ModuleType:
    path = model_repo.TEMPLATES_DIR / "postprocessing" / "1" / "token_bytes.py"
    spec = importlib.util.spec_from_file_location("postprocessing_token_bytes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


token_bytes = _load_token_bytes()

TEXTS = [
    "Hello world! How are you today?",
    "你好，世界！今天天气很好。",
    "Emoji 🙂🚀 and a family 👨‍👩‍👧‍👦 and a flag 🇫🇷.",
    "Mixed: café, naïve, Ångström, 日本語, 한국어 🎉\n\ttabs and  double  spaces ",
    '<tool_call>{"name": "f"}</tool_call> after',
]


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def tokenizers(tiny_bpe_dir: Path, tiny_metaspace_dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {
        "bpe": AutoTokenizer.from_pretrained(tiny_bpe_dir),
        "metaspace": AutoTokenizer.from_pretrained(tiny_metaspace_dir),
    }


def test_build_is_deterministic_and_cached(tmp_path: Path, tiny_bpe_dir: Path) -> None:
    built = tiny_model.build_tiny_model("bpe", cache_root=tmp_path)

    assert built.parent == tmp_path and built.name == tiny_bpe_dir.name
    assert _digest(built) == _digest(tiny_bpe_dir)
    assert tiny_model.build_tiny_model("bpe", cache_root=tmp_path) == built
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temporary directory left


def test_cache_root_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_CACHE_DIR", str(tmp_path / "cache"))
    assert tiny_model.default_cache_root() == tmp_path / "cache"
    monkeypatch.delenv("GATEWAY_CACHE_DIR")
    assert tiny_model.default_cache_root() == Path.home() / ".cache" / "trtllm-gateway"


def test_unknown_kind_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wordpiece"):
        tiny_model.build_tiny_model("wordpiece", cache_root=tmp_path)


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_model_and_tokenizer_load_offline_with_chat_template_and_extra_eos(
    kind: str, tiny_bpe_dir: Path, tiny_metaspace_dir: Path, tokenizers: dict[str, Any]
) -> None:
    from transformers import AutoModelForCausalLM

    directory = tiny_bpe_dir if kind == "bpe" else tiny_metaspace_dir
    tokenizer = tokenizers[kind]
    model = AutoModelForCausalLM.from_pretrained(directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    config = json.loads((directory / "tokenizer_config.json").read_text())

    eot = tokenizer.convert_tokens_to_ids(tiny_model.EOT_TOKEN)
    assert generation["eos_token_id"] == [tokenizer.eos_token_id, eot]
    assert model.config.vocab_size == len(tokenizer)
    assert "chat_template" in config
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|eot|>\n<|im_start|>user\nHi<|eot|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call><|eot|>\n'
        "<|im_start|>tool\n42<|eot|>\n<|im_start|>assistant\n"
    )
    with_tools = tokenizer.apply_chat_template(
        messages[1:2], tools=[{"type": "function", "function": {"name": "f"}}], tokenize=False
    )
    assert with_tools.startswith("<|im_start|>system\n# Tools\n") and '"name": "f"' in with_tools


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_corpus_has_tokens_that_are_partial_utf8_characters(kind: str, tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers[kind]
    surface = token_bytes.TokenBytes(tokenizer)
    partial = 0
    for token_id in tokenizer.encode(tiny_model.CORPUS, add_special_tokens=False):
        try:
            surface(token_id).decode("utf-8")
        except UnicodeDecodeError:
            partial += 1
    assert partial > 0


@pytest.mark.parametrize("kind", tiny_model.KINDS)
@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_concatenate_to_the_decoded_text(
    kind: str, text: str, tokenizers: dict[str, Any]
) -> None:
    tokenizer = tokenizers[kind]
    surface = token_bytes.TokenBytes(tokenizer)
    ids = tokenizer.encode(text)

    joined = b"".join(surface(t) for t in ids).decode("utf-8")
    decoded = tokenizer.decode(ids, skip_special_tokens=True)

    assert surface.kind == (token_bytes.BYTE_LEVEL if kind == "bpe" else token_bytes.METASPACE)
    first = tokenizer.convert_ids_to_tokens(next(t for t in ids if t not in tokenizer.all_special_ids))
    if kind == "metaspace" and first.startswith("▁"):
        # SentencePiece decoding drops the first word's space at the start of a text; a continuation keeps it.
        decoded = " " + decoded
    assert joined == decoded


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_streamed_continuation_bytes_equal_the_continuation_text(
    kind: str, tokenizers: dict[str, Any]
) -> None:
    tokenizer = tokenizers[kind]
    surface = token_bytes.TokenBytes(tokenizer)
    prompt = tokenizer.encode("Hello")
    completion = tokenizer.encode(" world, 你好 🙂!", add_special_tokens=False)

    streamed = b"".join(surface(t) for t in completion)
    whole = tokenizer.decode(prompt + completion, skip_special_tokens=True)
    start = tokenizer.decode(prompt, skip_special_tokens=True)

    assert whole.startswith(start)
    assert streamed.decode("utf-8") == whole[len(start) :]


@pytest.mark.parametrize("kind", tiny_model.KINDS)
def test_special_tokens_are_skipped_unless_asked_for(kind: str, tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers[kind]
    eot = tokenizer.convert_tokens_to_ids(tiny_model.EOT_TOKEN)

    assert token_bytes.token_surface_bytes(tokenizer, eot) == b""
    assert token_bytes.token_surface_bytes(tokenizer, eot, skip_special_tokens=False) == b"<|eot|>"
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    assert token_bytes.token_surface_bytes(tokenizer, call) == b"<tool_call>"


def test_byte_fallback_and_metaspace_marks_map_to_bytes(tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers["metaspace"]
    surface = token_bytes.TokenBytes(tokenizer)

    assert surface(tokenizer.convert_tokens_to_ids("<0xF0>")) == b"\xf0"
    assert surface(tokenizer.convert_tokens_to_ids("<0x0A>")) == b"\n"
    word = next(t for t in tokenizer.get_vocab() if t.startswith("▁") and len(t) > 2 and t[1:].isascii())
    assert surface(tokenizer.convert_tokens_to_ids(word)) == b" " + word[1:].encode()


def test_other_decoders_fall_back_to_anchored_decoding() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[SEP]": 1, "a": 2, "hello": 3, "##lo": 4, "hel": 5, "world": 6}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]")
    surface = token_bytes.TokenBytes(tokenizer)

    assert surface.kind == token_bytes.ANCHORED
    assert surface(6) == b" world"
    assert surface(4) == b"lo"  # a "##" continuation joins the previous word
    assert surface(1) == b""
