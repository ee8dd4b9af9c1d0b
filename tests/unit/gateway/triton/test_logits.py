"""Log probabilities from logits: compared with torch's log_softmax, and a chosen token equal to its
own alternative entry bit for bit; the context-logits contract of the engine route."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from gateway.engine import GenerationRequest, SamplingParams
from gateway.triton import contract as c
from gateway.triton.logits import decode_logits, prompt_logprobs, scored_tokens
from gateway.triton.tensors import ParsedResponse, json_request_fits, parse_response, token_logprobs
from tests.unit.gateway.triton.test_translation import ENGINE, _response, build, contract_of, tensor_values


def _logits(rows: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 4, (rows, vocab)).astype(np.float32)


def test_scores_equal_torchs_log_softmax_and_alternatives_are_the_most_likely() -> None:
    logits = _logits(6, 50)
    tokens = [3, 17, 0, 49, 8, 8]
    reference = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    scored = scored_tokens(logits, tokens, 4, ranks=True)
    for row, (token, entry) in enumerate(zip(tokens, scored, strict=True)):
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(reference[row, token], abs=1e-12)
        best = np.argsort(-reference[row], kind="stable")[:4]
        assert [t for t, _ in entry.top] == best.tolist()
        assert [v for _, v in entry.top] == pytest.approx(reference[row, best].tolist(), abs=1e-12)
        assert entry.rank == int((reference[row] > reference[row, token]).sum()) + 1


def test_a_chosen_token_equals_its_own_alternative_entry_exactly() -> None:
    """lm-eval's is_greedy compares a token's logprob with the largest alternative by equality."""
    logits = _logits(64, 1000, seed=3)
    greedy = logits.argmax(axis=1).tolist()
    for entry in scored_tokens(logits, greedy, 5):
        assert entry.logprob == dict(entry.top)[entry.token_id]
        assert entry.logprob == max(v for _, v in entry.top)
    # FP16 rows too (a logits_datatype the engine may be built with).
    for entry in scored_tokens(logits.astype(np.float16), greedy, 1):
        assert entry.logprob == entry.top[0][1]


def test_equal_logits_are_ordered_by_token_id() -> None:
    scored = scored_tokens(np.zeros((1, 8), dtype=np.float32), [5], 3, ranks=True)
    assert [t for t, _ in scored[0].top] == [0, 1, 2]
    assert scored[0].rank == 1


def test_prompt_logprobs_score_each_token_by_the_row_before_it() -> None:
    logits = _logits(4, 30, seed=1)
    prompt = [7, 2, 29, 11]
    out = prompt_logprobs(logits, prompt, 2)
    reference = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    assert out[0] is None
    assert [e.logprob for e in out[1:] if e is not None] == pytest.approx(
        [reference[0, 2], reference[1, 29], reference[2, 11]], abs=1e-12
    )
    with pytest.raises(ValueError, match="context logits rows"):
        prompt_logprobs(logits[:2], prompt, 0)


def test_bf16_and_fp16_logits_are_widened() -> None:
    values = np.array([[1.5, -2.25, 0.0]], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    assert decode_logits(bf16, "BF16", 3).tolist() == values.tolist()
    assert decode_logits(values.astype("<f2").tobytes(), "FP16", 3).tolist() == values.tolist()


def test_generated_tokens_with_alternatives_take_both_from_the_generation_logits() -> None:
    logits = _logits(2, 40, seed=5)
    ids = (int(logits[0].argmax()), 9)
    # The engine's own float32 values would differ in the last digits: they are not used.
    parsed = ParsedResponse(0, ids, None, None, None, False, False, (-1.0, -2.0), logits)
    entries = token_logprobs(parsed, ids, 2)
    assert entries[0].logprob == entries[0].top[0][1]
    assert entries[1].logprob != -2.0
    # Without alternatives the engine's values stand.
    assert [e.logprob for e in token_logprobs(parsed, ids, 0)] == [-1.0, -2.0]


CONTEXT_ENGINE = ENGINE.replace(
    '{ name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }',
    '{ name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },\n'
    '  { name: "return_context_logits" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',
).replace(
    '{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }',
    '{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] },\n'
    '  { name: "context_logits" data_type: TYPE_FP32 dims: [ -1, -1 ] }',
)


def test_prompts_are_scored_only_where_the_engine_says_it_keeps_context_logits() -> None:
    config = text_format.Parse(CONTEXT_ENGINE, mc.ModelConfig())
    declared = contract_of(CONTEXT_ENGINE, "engine")
    # The tensors are declared whatever the engine was built with: the parameter decides.
    assert not declared.prompt_logprobs
    config.parameters["gather_context_logits"].string_value = "true"
    able = declared.with_settings(c.engine_settings(c.parameters(config)))
    assert able.prompt_logprobs and able.capabilities().prompt_logprobs
    # The ensemble route tokenizes the text again: its rows may not be the ids the gateway has.
    assert not replace(able, route="ensemble").prompt_logprobs
    # Nor without the tensors.
    assert not contract_of(ENGINE, "engine").with_settings(able.settings).prompt_logprobs

    req = GenerationRequest("r", "", (5, 6, 7), SamplingParams(max_tokens=1), end_id=2, prompt_logprobs=1)
    out = build(able, req, seed=None, num_sequences=1, stream=True)
    assert tensor_values(out)["return_context_logits"] == ("BOOL", [1, 1], [True])
    assert "context_logits" in [o.name for o in out.outputs]
    assert not json_request_fits(able, req)
    plain = build(able, replace(req, prompt_logprobs=None), seed=None, num_sequences=1, stream=True)
    assert "return_context_logits" not in tensor_values(plain)
    assert "context_logits" not in [o.name for o in plain.outputs]


def test_context_logits_are_read_from_a_response() -> None:
    logits = _logits(3, 5)
    ids = np.array([[[4]]], dtype=np.int32).tobytes()
    parsed = parse_response(
        _response(
            {"output_ids": ("INT32", [1, 1, 1], ids), "context_logits": ("FP32", [1, 3, 5], logits.tobytes())}
        )
    )
    assert parsed.context_logits is not None
    assert parsed.context_logits.tolist() == logits.tolist()
