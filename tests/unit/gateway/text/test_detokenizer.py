"""The incremental detokenizer and the UTF-8 assembler: exact text however the stream is split."""

from __future__ import annotations

import codecs
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.text.detokenizer import (
    ByteTableDecoder,
    IncrementalDetokenizer,
    Utf8TextAssembler,
    ids_decoder,
)
from gateway.text.tokenizer import Tokenizer

TEXTS = [
    "Hello world, this is a test.",
    "  leading spaces and  double  spaces",
    "你好，世界！这是一个测试。",
    "emoji 🎉🚀 and 👩‍👩‍👧 family",
    "mixed: café naïve 日本語 😀 end",
]

_tokenizers: dict[Path, Tokenizer] = {}


def tokenizer_for(path: Path) -> Tokenizer:
    if path not in _tokenizers:
        _tokenizers[path] = Tokenizer(path)
    return _tokenizers[path]


def split_points(data: st.DataObject, length: int) -> list[int]:
    cuts = data.draw(st.lists(st.integers(min_value=1, max_value=max(length - 1, 1)), max_size=length))
    return sorted(set(c for c in cuts if 0 < c < length))


def stream_ids(tok: Tokenizer, prompt: list[int], ids: list[int], cuts: list[int]) -> str:
    # The prompt is there to show it makes no difference: the text is the generated ids' own.
    detok = ids_decoder(tok)
    out = []
    bounds = [0, *cuts, len(ids)]
    for a, b in itertools.pairwise(bounds):
        out.append(detok.push_ids(ids[a:b]))
    out.append(detok.flush())
    return "".join(out)


@pytest.fixture(params=["bpe", "metaspace"])
def tok(request: pytest.FixtureRequest, tiny_bpe_dir: Path, tiny_metaspace_dir: Path) -> Tokenizer:
    return tokenizer_for(tiny_bpe_dir if request.param == "bpe" else tiny_metaspace_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_decoding_equals_the_tokenizers_decoding_of_the_ids(tok: Tokenizer, text: str) -> None:
    prompt = tok.encode("Say something:")
    ids = tok.encode(" " + text, add_special_tokens=False)
    expected = tok.decode(ids)
    assert stream_ids(tok, prompt, ids, list(range(1, len(ids)))) == expected
    assert "\ufffd" not in expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(), text=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=40)
)
def test_any_split_of_the_same_tokens_gives_the_same_text(
    tok: Tokenizer, data: st.DataObject, text: str
) -> None:
    prompt = tok.encode("Hi")
    ids = tok.encode(text, add_special_tokens=False)
    whole = stream_ids(tok, prompt, ids, [])
    assert whole == tok.decode(ids)
    assert stream_ids(tok, prompt, ids, split_points(data, len(ids))) == whole
    assert stream_ids(tok, prompt, ids, list(range(1, len(ids)))) == whole


def test_an_incomplete_character_is_held_back_until_completed(tiny_bpe_dir: Path) -> None:
    tok = tokenizer_for(tiny_bpe_dir)
    ids = tok.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1, "the tiny tokenizer should split this emoji across tokens"
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push_ids([i]) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "🎉"


def test_a_truncated_character_is_released_as_a_replacement_at_the_end(tiny_bpe_dir: Path) -> None:
    tok = tokenizer_for(tiny_bpe_dir)
    ids = tok.encode("🎉", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    assert detok.push_ids(ids[:1]) == ""
    assert detok.flush() == "\ufffd"


def test_the_first_generated_word_loses_its_leading_space_as_in_the_tokenizers_decoding(
    tiny_metaspace_dir: Path,
) -> None:
    tok = tokenizer_for(tiny_metaspace_dir)
    prompt = tok.encode("Hello")
    ids = tok.encode(" world", add_special_tokens=False)
    assert stream_ids(tok, prompt, ids, []) == "world" == tok.decode(ids)
    assert stream_ids(tok, prompt, ids, list(range(1, len(ids)))) == "world"


BYTE_RUNS = [
    # A valid character, an invalid run, a valid run ended by an invalid byte, a truncated end.
    ["<0xE4>", "<0xBD>", "<0xA0>", "a"],
    ["<0xE4>", "<0x41>", "b", "<0x42>"],
    ["<0x41>", "<0x42>", "<0xFF>", "▁c"],
    ["d", "<0xF0>", "<0x9F>"],
]


@pytest.mark.parametrize("pieces", BYTE_RUNS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_byte_fallback_runs_decode_as_the_tokenizer_does_even_when_not_utf8(
    tiny_metaspace_dir: Path, pieces: list[str], step: int
) -> None:
    tok = tokenizer_for(tiny_metaspace_dir)
    ids = [tok._tok.convert_tokens_to_ids(p) for p in pieces]
    assert all(i is not None and i != tok._tok.unk_token_id for i in ids), pieces
    detok = ids_decoder(tok)
    out = "".join(detok.push_ids(ids[a : a + step]) for a in range(0, len(ids), step)) + detok.flush()
    assert out == tok.decode(ids)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_ids_with_byte_fallback_tokens_stream_to_the_tokenizers_decoding(
    tiny_metaspace_dir: Path, data: st.DataObject
) -> None:
    tok = tokenizer_for(tiny_metaspace_dir)
    byte_ids = sorted(tok.byte_fallback_ids)
    assert len(byte_ids) == 256
    ordinary = st.integers(0, tok.vocab_size - 1)
    ids = data.draw(st.lists(st.one_of(st.sampled_from(byte_ids), ordinary), max_size=24))
    assert stream_ids(tok, [], ids, split_points(data, len(ids))) == tok.decode(ids)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), text=st.text(max_size=60))
def test_utf8_assembler_is_exact_for_any_byte_split(data: st.DataObject, text: str) -> None:
    raw = text.encode("utf-8", errors="surrogatepass")
    cuts = split_points(data, len(raw))
    asm = Utf8TextAssembler()
    bounds = [0, *cuts, len(raw)]
    out = "".join(asm.push_bytes(raw[a:b]) for a, b in itertools.pairwise(bounds)) + asm.flush()
    assert out == raw.decode("utf-8", errors="replace")


@settings(max_examples=120, deadline=None)
@given(data=st.data(), raw=st.binary(max_size=40))
def test_utf8_assembler_decodes_any_bytes_as_codecs_incremental_decoder_does(
    data: st.DataObject, raw: bytes
) -> None:
    # Invalid and cut-off sequences included: the same replacement characters in the same places.
    cuts = split_points(data, len(raw))
    bounds = [0, *cuts, len(raw)]
    asm = Utf8TextAssembler()
    reference = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for a, b in itertools.pairwise(bounds):
        assert asm.push_bytes(raw[a:b]) == reference.decode(raw[a:b], final=False)
    assert asm.flush() == reference.decode(b"", final=True)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_fast_paths_agree_with_transformers(tok: Tokenizer, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=20))
    text = data.draw(st.text(max_size=30))
    hf = tok._tok
    for skip in (True, False):
        assert tok.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)
    for add in (True, False):
        assert tok.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add)


def stream_table(tok: Tokenizer, ids: list[int], cuts: list[int]) -> str:
    assert tok.token_bytes is not None
    decoder = ByteTableDecoder(tok.token_bytes)
    bounds = [0, *cuts, len(ids)]
    return "".join(decoder.push_ids(ids[a:b]) for a, b in itertools.pairwise(bounds)) + decoder.flush()


def test_byte_level_tokenizers_get_a_byte_table_and_sentencepiece_ones_do_not(
    tiny_bpe_dir: Path, tiny_metaspace_dir: Path
) -> None:
    bpe, sp = tokenizer_for(tiny_bpe_dir), tokenizer_for(tiny_metaspace_dir)
    assert bpe.token_bytes is not None and len(bpe.token_bytes) == bpe.vocab_size
    assert isinstance(ids_decoder(bpe), ByteTableDecoder)
    # Metaspace decoding depends on the position (a leading space is stripped): no table.
    assert sp.token_bytes is None
    assert isinstance(ids_decoder(sp), IncrementalDetokenizer)


def test_the_byte_table_holds_partial_characters_and_drops_special_tokens(tiny_bpe_dir: Path) -> None:
    tok = tokenizer_for(tiny_bpe_dir)
    assert tok.token_bytes is not None
    ids = tok.encode("🎉", add_special_tokens=False)
    assert b"".join(tok.token_bytes[i] for i in ids) == "🎉".encode()
    decoder = ByteTableDecoder(tok.token_bytes)
    assert [decoder.push_ids([i]) for i in ids][:-1] == [""] * (len(ids) - 1)
    eos = tok.info.eos_token_id
    assert eos is not None and tok.token_bytes[eos] == b""
    # Ids past the tokenizer's vocabulary (a padded model vocabulary) and negative ids decode to nothing.
    assert ByteTableDecoder(tok.token_bytes).push_ids([tok.vocab_size + 3, -1]) == ""


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_byte_table_decodes_any_ids_split_anyhow_exactly_as_the_tokenizer(
    tiny_bpe_dir: Path, data: st.DataObject
) -> None:
    tok = tokenizer_for(tiny_bpe_dir)
    # Any ids, special and added tokens included: invalid UTF-8 must come out as the tokenizer has it.
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=30))
    expected = tok.decode(ids)
    assert stream_table(tok, ids, split_points(data, len(ids))) == expected
    assert stream_table(tok, ids, list(range(1, len(ids)))) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_the_byte_table_and_the_window_agree_on_real_text(tiny_bpe_dir: Path, text: str) -> None:
    tok = tokenizer_for(tiny_bpe_dir)
    prompt = tok.encode("Say something:")
    ids = tok.encode(" " + text, add_special_tokens=False)
    assert stream_table(tok, ids, list(range(1, len(ids)))) == stream_ids(tok, prompt, ids, [])


@pytest.mark.parametrize("kind", ["agent", "metaspace"])
def test_decoding_with_special_tokens_kept_gives_the_markers_as_the_tokenizer_does(kind: str) -> None:
    from deploy.tiny_model import build_tiny_model

    tok = tokenizer_for(build_tiny_model(kind))
    text = (
        "<|eot|>Hello <|im_start|>world 你好"
        if kind == "metaspace"
        else (
            "<|channel|>analysis<|message|>Hmm, 你好 🙂<|end|><|start|>assistant<|channel|>final<|message|>Hi"
        )
    )
    ids = tok.encode(text, add_special_tokens=False)
    decoder = ids_decoder(tok, skip_special_tokens=False)
    streamed = "".join(decoder.push_ids([i]) for i in ids) + decoder.flush()
    assert streamed == tok.decode(ids, skip_special_tokens=False)
    assert ("<|channel|>" if kind == "agent" else "<|im_start|>") in streamed
    if kind == "agent":
        # The byte table (with the special tokens' text in it) decodes it, not the window.
        assert isinstance(decoder, ByteTableDecoder)
    plain = ids_decoder(tok)
    assert "".join(plain.push_ids([i]) for i in ids) + plain.flush() == tok.decode(ids)
