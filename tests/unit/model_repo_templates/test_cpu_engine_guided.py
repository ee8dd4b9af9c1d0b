"""The CPU engine's guided decoding helpers: guide checks, xgrammar error text, grammar masks, rendering."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from deploy import model_repo, tiny_model
from deploy.model_repo import load_model_configs, render_repository

engine = model_repo.load_reference_engine()


@cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.build_tiny_model("bpe"))


@cache
def _guided() -> Any:
    tokenizer = _tokenizer()
    return engine.GuidedDecoding(tokenizer, len(tokenizer))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            '[00:14:57] /project/cpp/json_schema_converter.cc:4944: Unsupported type "objekt"\n',
            'Unsupported type "objekt"',
        ),
        (
            "[12:01:02] /x/regex_converter.cc:83: Regex parsing error at position 4: Unclosed '['",
            "Regex parsing error at position 4: Unclosed '['",
        ),
        ("plain message", "plain message"),
        ("[00:00:01] a.cc:1: first\n[00:00:01] b.cc:2: second", "first; second"),
    ],
)
def test_grammar_error_message_drops_the_cpp_timestamp_and_location(raw: str, expected: str) -> None:
    assert engine.grammar_error_message(RuntimeError(raw)) == expected


def test_grammar_error_message_of_an_empty_error_is_its_type() -> None:
    assert engine.grammar_error_message(ValueError("")) == "ValueError"


@pytest.mark.parametrize(
    ("guide_type", "guide", "needle"),
    [
        ("xml", "<a/>", "must be one of json, json_schema, regex, ebnf_grammar"),
        ("regex", "", "required for guide type 'regex'"),
        ("ebnf_grammar", "  ", "required for guide type 'ebnf_grammar'"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", "[1, 2]", "must be a JSON schema"),
    ],
)
def test_check_guide_rejects_unusable_guides(guide_type: str, guide: str, needle: str) -> None:
    with pytest.raises(engine.EngineError) as info:
        engine.check_guide(guide_type, guide)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("guide_type", "guide"),
    [("json", ""), ("json_schema", '{"type": "object"}'), ("json_schema", "true"), ("regex", "a+")],
)
def test_check_guide_accepts_usable_guides(guide_type: str, guide: str) -> None:
    engine.check_guide(guide_type, guide)


@pytest.mark.parametrize(
    ("guide_type", "guide", "needle"),
    [
        ("json_schema", '{"type": "objekt"}', 'Unsupported type "objekt"'),
        ("regex", "[a-", "Unclosed '['"),
        ("ebnf_grammar", "root ::= foo", 'Rule "foo" is not defined'),
    ],
)
def test_a_guide_that_does_not_compile_is_an_engine_error_naming_the_problem(
    guide_type: str, guide: str, needle: str
) -> None:
    with pytest.raises(engine.EngineError) as info:
        _guided().compile(guide_type, guide)
    message = str(info.value)
    assert message.startswith(f"guided_decoding_guide ({guide_type}) does not compile: ")
    assert needle in message and ".cc:" not in message


def test_compiled_guides_are_cached_by_type_and_guide() -> None:
    guided = _guided()
    first = guided.compile("regex", "[0-9]{2}")
    assert guided.compile("regex", "[0-9]{2}") is first
    assert guided.compile("regex", "[0-9]{3}") is not first
    # The json type ignores its guide text: one grammar for all.
    assert guided.compile("json", "") is guided.compile("json", "anything")


def _allowed(state: Any, vocab: int) -> set[int]:
    import torch

    scores = torch.zeros(vocab, dtype=torch.float32)
    state.fill()
    state.mask(scores)
    return {int(i) for i in torch.nonzero(torch.isfinite(scores)).flatten()}


def test_a_grammar_state_allows_only_grammatical_tokens_then_only_stop_tokens() -> None:
    tokenizer = _tokenizer()
    vocab = len(tokenizer)
    guide = _guided().compile("regex", "ab")
    end_id = tokenizer.eos_token_id
    state = guide.matcher(end_id)
    assert end_id in state.stop_token_ids

    for char in "ab":
        allowed = _allowed(state, vocab)
        assert allowed, "the grammar must allow something"
        (token,) = tokenizer.encode(char, add_special_tokens=False)
        assert token in allowed and end_id not in allowed
        state.accept(token)
        assert not state.terminated

    assert _allowed(state, vocab) == set(state.stop_token_ids)
    state.accept(end_id)
    assert state.terminated


def test_a_request_end_id_becomes_a_stop_token_of_the_grammar() -> None:
    tokenizer = _tokenizer()
    guide = _guided().compile("regex", "a")
    other_end = tokenizer.encode("z", add_special_tokens=False)[0]
    state = guide.matcher(other_end)
    state.accept(tokenizer.encode("a", add_special_tokens=False)[0])
    assert _allowed(state, len(tokenizer)) == {tokenizer.eos_token_id, other_end}


def test_scores_beyond_the_tokenizer_vocabulary_are_masked() -> None:
    import torch

    tokenizer = _tokenizer()
    state = _guided().compile("json", "").matcher(None)
    scores = torch.zeros(len(tokenizer) + 8, dtype=torch.float32)
    state.fill()
    state.mask(scores)
    assert torch.all(scores[len(tokenizer) :] == float("-inf"))
    assert torch.isfinite(scores[: len(tokenizer)]).any()


def _engine_parameters(tmp_path: Path, backend: str, variant: str, **extra: object) -> dict[str, str]:
    variables: dict[str, object] = {"tokenizer_dir": "/models/tokenizer", **extra}
    if backend == "tensorrtllm":
        variables["engine_dir"] = "/engines/llama"
    out = render_repository(tmp_path / "repo", backend=backend, variant=variant, variables=variables)
    config = load_model_configs(out)["tensorrt_llm"]
    return {key: value.string_value for key, value in config.parameters.items()}


def test_the_cpu_engine_renders_with_xgrammar_guided_decoding_by_default(tmp_path: Path) -> None:
    assert _engine_parameters(tmp_path, "cpu", "current")["guided_decoding_backend"] == "xgrammar"


@pytest.mark.parametrize(
    ("backend", "variant", "extra"),
    [
        ("cpu", "legacy", {}),
        ("cpu", "current", {"guided_decoding_backend": ""}),
        ("tensorrtllm", "current", {}),
    ],
)
def test_guided_decoding_is_left_out_where_it_is_off_or_has_no_inputs(
    tmp_path: Path, backend: str, variant: str, extra: dict[str, object]
) -> None:
    assert "guided_decoding_backend" not in _engine_parameters(tmp_path, backend, variant, **extra)


def test_the_tensorrtllm_engine_gets_xgrammar_and_its_tokenizer_when_asked(tmp_path: Path) -> None:
    params = _engine_parameters(tmp_path, "tensorrtllm", "current", guided_decoding_backend="xgrammar")
    assert params["guided_decoding_backend"] == "xgrammar"
    assert params["tokenizer_dir"] == "/models/tokenizer"


def test_the_variables_listing_shows_the_per_backend_default() -> None:
    listing = model_repo._variables_table(None)
    line = next(line for line in listing.splitlines() if line.startswith("guided_decoding_backend"))
    assert "cpu: 'xgrammar'" in line
    assert "guided_decoding_backend = 'xgrammar'" in model_repo._variables_table("cpu")
    assert "guided_decoding_backend = ''" in model_repo._variables_table("tensorrtllm")


def test_special_tokens_other_than_stop_tokens_are_never_allowed() -> None:
    tokenizer = _tokenizer()
    state = _guided().compile("json", "").matcher(tokenizer.eos_token_id)
    state.accept(tokenizer.encode('{"', add_special_tokens=False)[0])
    allowed = _allowed(state, len(tokenizer))
    assert allowed, "a JSON string allows ordinary tokens"
    assert not allowed & set(tokenizer.all_special_ids)


def test_a_special_token_the_guide_spells_is_allowed_where_the_guide_spells_it() -> None:
    # xgrammar (as TensorRT-LLM builds it) treats `<|im_start|>` as its own text: a guide that
    # spells it lets the model write the one token there, and only there.
    tokenizer = _tokenizer()
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    state = _guided().compile("regex", r"a<\|im_start\|>b").matcher(tokenizer.eos_token_id)
    state.accept(tokenizer.encode("a", add_special_tokens=False)[0])
    assert special in _allowed(state, len(tokenizer))
    state.accept(special)
    allowed = _allowed(state, len(tokenizer))
    assert tokenizer.encode("b", add_special_tokens=False)[0] in allowed
    assert special not in allowed


def test_a_special_token_the_guide_does_not_name_stays_masked_where_its_text_would_fit() -> None:
    tokenizer = _tokenizer()
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    # The regex allows any text, `<|im_start|>`'s included, but does not name the token.
    state = _guided().compile("regex", r"a[^\n]*").matcher(tokenizer.eos_token_id)
    state.accept(tokenizer.encode("a", add_special_tokens=False)[0])
    allowed = _allowed(state, len(tokenizer))
    assert tokenizer.encode("<", add_special_tokens=False)[0] in allowed
    assert special not in allowed
