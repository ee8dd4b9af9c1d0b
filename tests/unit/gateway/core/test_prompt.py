"""A rendered chat template reaches the engine as transformers' apply_chat_template(tokenize=True)
encodes it, on each route, for each real family; a raw prompt keeps the tokenizer's default."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from deploy.families import FAMILIES, build_family_model
from deploy.tiny_model import build_tiny_model
from gateway.config import ServedModel
from gateway.core.models import ModelRuntime
from gateway.core.prompt import chat_prompt, raw_prompt, template_specials_mismatch
from gateway.text.tokenizer import Tokenizer
from tests.support.tokenizers import loaded_tokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello, 你好 🙂"},
    {"role": "assistant", "content": "Hi there."},
    {"role": "user", "content": "Again, café?"},
]


@dataclass(frozen=True)
class _Info:
    route: str


@dataclass(frozen=True)
class _Engine:
    info: _Info


@cache
def _tokenizers(model_dir: Path) -> tuple[Tokenizer, Any]:
    """The gateway's tokenizer and the transformers tokenizer it wraps (the reference)."""
    tokenizer = loaded_tokenizer(model_dir)
    return tokenizer, tokenizer._tok


def _runtime(model_dir: Path, route: str, add_special_tokens: bool) -> ModelRuntime:
    config = ServedModel(name="m", tokenizer=model_dir, add_special_tokens=add_special_tokens)
    return ModelRuntime(config, _tokenizers(model_dir)[0], _Engine(_Info(route)), 0)  # type: ignore[arg-type]


def _sent_ids(runtime: ModelRuntime, text: str, add_special_tokens: bool) -> list[int]:
    """The ids the engine sees: the gateway's own on the engine route; on the text routes, what a
    preprocessing that adds special tokens as the model's setting says makes of the text sent."""
    if runtime.engine.info.route == "engine":
        return runtime.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return runtime.tokenizer.encode(text, add_special_tokens=runtime.config.add_special_tokens)


ROUTES = [("engine", True), ("ensemble", True), ("ensemble", False)]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(("route", "add_special"), ROUTES)
def test_chat_prompt_ids_are_transformers_apply_chat_template_ids(
    family: str, route: str, add_special: bool
) -> None:
    model_dir = build_family_model(family)
    _, hf = _tokenizers(model_dir)
    expected = list(hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"])
    runtime = _runtime(model_dir, route, add_special)
    rendered = runtime.tokenizer.apply_chat_template(MESSAGES)
    prompt = chat_prompt(runtime, rendered)
    # The gateway's count and the engine's ids agree, and both are transformers'.
    assert runtime.tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens) == expected
    assert _sent_ids(runtime, prompt.text, prompt.add_special_tokens) == expected
    assert template_specials_mismatch(runtime) is None
    # A template that writes BOS itself keeps exactly the ones it writes (Llama 2: one a turn).
    if hf.bos_token:
        assert expected.count(hf.bos_token_id) == rendered.count(hf.bos_token)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_raw_prompt_keeps_the_tokenizers_default(family: str) -> None:
    model_dir = build_family_model(family)
    _, hf = _tokenizers(model_dir)
    runtime = _runtime(model_dir, "engine", True)
    prompt = raw_prompt(runtime, "Once upon a time 🙂")
    assert runtime.tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens) == list(
        hf.encode("Once upon a time 🙂")
    )


def test_a_template_without_the_bos_its_tokenizer_adds_is_named_on_the_text_route() -> None:
    # The tiny SentencePiece model's tokenizer adds <|bos|>; its chat template does not write it.
    model_dir = build_tiny_model("metaspace")
    assert template_specials_mismatch(_runtime(model_dir, "engine", True)) is None
    why = template_specials_mismatch(_runtime(model_dir, "ensemble", True))
    assert why is not None and "'<|bos|>'" in why and "route=engine" in why
    # On the engine route the template's own text is the prompt: no BOS.
    runtime = _runtime(model_dir, "engine", True)
    prompt = chat_prompt(runtime, runtime.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]))
    ids = runtime.tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens)
    assert runtime.tokenizer.convert_ids_to_tokens(ids[:1]) != ["<|bos|>"]
