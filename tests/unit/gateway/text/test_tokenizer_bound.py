"""Tokenizer.token_bound: at most how many tokens a text encodes to, known without encoding it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text.tokenizer import Tokenizer
from tests.support.tokenizers import loaded_tokenizer


@pytest.fixture(scope="module")
def bpe(tiny_bpe_dir: Path) -> Tokenizer:
    return loaded_tokenizer(tiny_bpe_dir)


def _texts(specials: list[str]) -> st.SearchStrategy[str]:
    # Any text, with the tokenizer's special tokens mixed in (each is one token for many bytes).
    piece = st.one_of(
        st.text(max_size=40), st.sampled_from(specials or [""]), st.sampled_from([" ", "\n\n", "  x"])
    )
    return st.lists(piece, min_size=1, max_size=8).map("".join).filter(bool)


def test_byte_level_bpe_without_normalizer_has_a_bound(bpe: Tokenizer) -> None:
    assert bpe.token_bound("hello", add_special_tokens=True) is not None
    assert bpe.token_bound("", add_special_tokens=True) is None


def test_no_text_encodes_to_more_tokens_than_its_bound(bpe: Tokenizer) -> None:
    specials = [t for t in bpe._tok.all_special_tokens if t]

    @settings(max_examples=400, deadline=None)
    @given(text=_texts(specials), add_special=st.booleans())
    def check(text: str, add_special: bool) -> None:
        bound = bpe.token_bound(text, add_special_tokens=add_special)
        assert bound is not None
        assert len(bpe.encode(text, add_special_tokens=add_special)) <= bound

    check()


def test_a_tokenizer_that_is_not_byte_level_gives_no_bound(tiny_metaspace_dir: Path) -> None:
    # SentencePiece-style: a normalizer and the Metaspace pre-tokenizer, no byte-per-symbol rule.
    assert loaded_tokenizer(tiny_metaspace_dir).token_bound("hello world", add_special_tokens=True) is None
