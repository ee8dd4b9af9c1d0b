"""The CPU engine's log probs, generation logits and xgrammar guided decoding, against the real Triton."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from tests.integration.conftest import StackModel, StreamResponse, TritonStack, scalar, stream_infer
from tests.integration.test_triton_stack import assert_continuation

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over"
TOLERANCE = 1e-4
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        # Not maxLength: xgrammar 0.2.8 then lets raw control characters into the string (invalid JSON).
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "verified": {"type": "boolean"},
                "level": {"enum": [1, 2, 3]},
            },
            "required": ["age", "verified"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "tags", "owner"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{3,6}-\d{2}"
# Enough for any output of SCHEMA (about 70 tokens with the tiny byte-level vocabulary).
GUIDED_MAX_TOKENS = 160


@cache
def _tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


@cache
def _hf_model(directory: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def reference_logits(model: StackModel, prompt: list[int], generated: list[int]) -> np.ndarray:
    """The reference model's next-token logits at each generated position: [len(generated), vocab]."""
    import torch

    with torch.inference_mode():
        logits = _hf_model(model.tokenizer_dir)(torch.tensor([prompt + generated])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)].numpy()


def reference_greedy(model: StackModel, prompt: list[int], max_tokens: int) -> list[int]:
    generated: list[int] = []
    for _ in range(max_tokens):
        generated.append(int(reference_logits(model, prompt, [*generated, 0])[-1].argmax()))
    return generated


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def prompt_ids(model: StackModel, text: str) -> list[int]:
    return list(_tokenizer(model.tokenizer_dir).encode(text))


def engine_inputs(prompt: list[int], max_tokens: int, *, streaming: bool, **extra: Any) -> dict:
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": scalar(len(prompt), np.int32),
        "request_output_len": scalar(max_tokens, np.int32),
        "streaming": scalar(streaming, bool),
        "exclude_input_in_output": scalar(True, bool),
    }
    inputs.update(extra)
    return inputs


def ensemble_inputs(text: str, max_tokens: int, *, stream: bool, **extra: Any) -> dict:
    # No requested-output list: Triton sends every output, text_output included (a decoupled ensemble
    # answers nothing unless text_output is requested).
    inputs = {
        "text_input": scalar(text, object),
        "max_tokens": scalar(max_tokens, np.int32),
        "stream": scalar(stream, bool),
        "exclude_input_in_output": scalar(True, bool),
    }
    inputs.update(extra)
    return inputs


def guide_inputs(guide_type: str, guide: str) -> dict[str, np.ndarray]:
    return {
        "guided_decoding_guide_type": scalar(guide_type, object),
        "guided_decoding_guide": scalar(guide, object),
    }


def ok(responses: list[StreamResponse]) -> list[StreamResponse]:
    """The responses carrying tokens; asserts no error and a final flag on the last one only."""
    assert [r.error for r in responses] == [None] * len(responses), responses[-1].error
    assert responses[-1].final and all(not r.final for r in responses[:-1])
    return [r for r in responses if "output_log_probs" in r.outputs or "output_ids" in r.outputs]


@dataclass
class Generation:
    """One sequence's outputs joined across its responses."""

    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float | None = None
    logits: list[np.ndarray] = field(default_factory=list)
    text: bytes = b""


def gather(responses: list[StreamResponse], *, streamed: bool) -> dict[int, Generation]:
    """Sequences by sequence_index, checking each response's tensor shapes against the contract."""
    sequences: dict[int, Generation] = {}
    for response in ok(responses):
        out = response.outputs
        index = int(out["sequence_index"][0, 0]) if "sequence_index" in out else 0
        seq = sequences.setdefault(index, Generation())
        if "output_ids" in out:
            length = int(out["sequence_length"][0, 0])
            seq.ids.extend(int(t) for t in out["output_ids"][0, 0, :length])
        if "output_log_probs" in out:
            count = out["output_log_probs"].shape[2]
            assert (out["output_log_probs"].dtype, out["output_log_probs"].shape) == (
                np.float32,
                (1, 1, count),
            )
            assert (out["cum_log_probs"].dtype, out["cum_log_probs"].shape) == (np.float32, (1, 1))
            assert count == 1 or not streamed
            seq.log_probs.extend(float(v) for v in out["output_log_probs"][0, 0])
            # Streaming: the total so far, so the last response has the sequence's total.
            seq.cum_log_prob = float(out["cum_log_probs"][0, 0])
        if "generation_logits" in out:
            logits = out["generation_logits"]
            assert logits.dtype == np.float32 and logits.ndim == 4 and logits.shape[:2] == (1, 1)
            assert logits.shape[2] == 1 or not streamed
            seq.logits.extend(logits[0, 0])
        if "text_output" in out:
            seq.text += out["text_output"].reshape(-1)[0]
    return sequences


def assert_log_probs_match(model: StackModel, prompt: list[int], seq: Generation, temperature: float) -> None:
    reference = reference_logits(model, prompt, seq.ids)
    expected = log_softmax(reference / temperature)[np.arange(len(seq.ids)), seq.ids]
    np.testing.assert_allclose(seq.log_probs, expected, atol=TOLERANCE, rtol=0)
    assert seq.cum_log_prob is not None
    assert seq.cum_log_prob == pytest.approx(float(np.sum(expected)), abs=TOLERANCE * len(seq.ids))
    assert len(seq.logits) == len(seq.ids)
    # generation_logits are the raw model logits (before bias, penalties, masks and temperature).
    np.testing.assert_allclose(np.stack(seq.logits), reference, atol=TOLERANCE, rtol=0)


DECODINGS = {
    "greedy": ({}, 1.0),
    "sampled_t1": (
        {
            "temperature": scalar(1.0, np.float32),
            "runtime_top_k": scalar(20, np.int32),
            "seed": scalar(7, np.uint64),
        },
        1.0,
    ),
    "sampled_t07": (
        {
            "temperature": scalar(0.7, np.float32),
            "runtime_top_p": scalar(0.9, np.float32),
            "seed": scalar(11, np.uint64),
        },
        0.7,
    ),
}
LOGITS_FLAGS = {"return_log_probs": scalar(True, bool), "return_generation_logits": scalar(True, bool)}


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("decoding", list(DECODINGS))
def test_engine_log_probs_are_log_softmax_of_the_reference_logits(
    triton_stack: TritonStack, streaming: bool, decoding: str
) -> None:
    model = triton_stack.models["bpe_current"]
    prompt = prompt_ids(model, PROMPT)
    extra, temperature = DECODINGS[decoding]
    inputs = engine_inputs(prompt, 8, streaming=streaming, **LOGITS_FLAGS, **extra)

    (seq,) = gather(stream_infer(triton_stack.grpc_url, model.engine, inputs), streamed=streaming).values()

    assert len(seq.ids) == 8
    if decoding == "greedy":
        assert seq.ids == reference_greedy(model, prompt, 8)
    assert_log_probs_match(model, prompt, seq, temperature)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("key", ["bpe_current", "bpe_stock"])
def test_log_probs_and_generation_logits_flow_through_the_ensemble(
    triton_stack: TritonStack, key: str, stream: bool
) -> None:
    model = triton_stack.models[key]
    prompt = prompt_ids(model, PROMPT)
    expected_ids = reference_greedy(model, prompt, 6)
    inputs = ensemble_inputs(PROMPT, 6, stream=stream, **LOGITS_FLAGS)

    (seq,) = gather(stream_infer(triton_stack.grpc_url, model.ensemble, inputs), streamed=stream).values()

    if model.output_ids:
        assert seq.ids == expected_ids
    else:
        assert not seq.ids, "the stock ensemble has no output_ids"
    assert_continuation(model, prompt, expected_ids, seq.text)
    seq.ids = expected_ids
    assert_log_probs_match(model, prompt, seq, 1.0)


def decoded(model: StackModel, seq: Generation) -> str:
    return _tokenizer(model.tokenizer_dir).decode(seq.ids)


def assert_valid_json(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


SAMPLING = {
    "temperature": scalar(1.0, np.float32),
    "runtime_top_k": scalar(50, np.int32),
    "seed": scalar(3, np.uint64),
}


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled_n3"])
def test_json_schema_guided_output_parses_and_validates(
    triton_stack: TritonStack, streaming: bool, sampled: bool
) -> None:
    model = triton_stack.models["bpe_current"]
    tokenizer = _tokenizer(model.tokenizer_dir)
    prompt = prompt_ids(model, "Describe a pet as JSON:")
    extra = {**SAMPLING, "num_return_sequences": scalar(3, np.int32)} if sampled else {}
    inputs = engine_inputs(
        prompt,
        GUIDED_MAX_TOKENS,
        streaming=streaming,
        end_id=scalar(tokenizer.eos_token_id, np.int32),
        return_log_probs=scalar(True, bool),
        **guide_inputs("json_schema", json.dumps(SCHEMA)),
        **extra,
    )

    sequences = gather(stream_infer(triton_stack.grpc_url, model.engine, inputs), streamed=streaming)

    assert sorted(sequences) == list(range(3 if sampled else 1))
    texts = [decoded(model, seq) for seq in sequences.values()]
    for text, seq in zip(texts, sequences.values(), strict=True):
        # The grammar ended the sequence (with end_id, not emitted), long before the token limit.
        assert len(seq.ids) < GUIDED_MAX_TOKENS, text
        assert_valid_json(text)
        # Log probs are taken after the grammar mask: never below the unconstrained ones (temperature 1).
        reference = log_softmax(reference_logits(model, prompt, seq.ids))
        unconstrained = reference[np.arange(len(seq.ids)), seq.ids]
        assert np.all(np.asarray(seq.log_probs) >= unconstrained - TOLERANCE)
    if sampled:
        assert len(set(texts)) > 1, "each sequence must sample on its own"


def test_regex_and_ebnf_and_json_guides_are_followed(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    prompt = prompt_ids(model, "Hello world")
    ebnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'
    cases = [
        ("regex", REGEX, False),
        ("regex", REGEX, True),
        ("ebnf_grammar", ebnf, False),
        ("json", "", False),
    ]
    for guide_type, guide, sampled in cases:
        inputs = engine_inputs(
            prompt,
            GUIDED_MAX_TOKENS,
            streaming=True,
            **guide_inputs(guide_type, guide),
            **(SAMPLING if sampled else {}),
        )
        (seq,) = gather(stream_infer(triton_stack.grpc_url, model.engine, inputs), streamed=True).values()
        text = decoded(model, seq)
        assert len(seq.ids) < GUIDED_MAX_TOKENS, (guide_type, text)
        if guide_type == "regex":
            assert re.fullmatch(REGEX, text), text
        elif guide_type == "ebnf_grammar":
            assert re.fullmatch(r"\((?:[0-9]|x)(?:,(?:[0-9]|x))*\)", text), text
        else:
            json.loads(text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_guided_decoding_inputs_flow_through_the_ensemble(triton_stack: TritonStack, stream: bool) -> None:
    model = triton_stack.models["bpe_current"]
    inputs = ensemble_inputs(
        "Describe a pet as JSON:",
        GUIDED_MAX_TOKENS,
        stream=stream,
        **guide_inputs("json_schema", json.dumps(SCHEMA)),
    )

    (seq,) = gather(stream_infer(triton_stack.grpc_url, model.ensemble, inputs), streamed=stream).values()

    assert seq.text.decode() == decoded(model, seq)
    assert_valid_json(seq.text.decode())


def test_guided_and_unguided_requests_share_the_batched_loop(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    labels = {"model": model.engine, "version": "1"}
    prompt = prompt_ids(model, PROMPT)
    plain_tokens = 48
    requests = {
        "schema": engine_inputs(
            prompt, GUIDED_MAX_TOKENS, streaming=True, **guide_inputs("json_schema", json.dumps(SCHEMA))
        ),
        "schema_n2": engine_inputs(
            prompt,
            GUIDED_MAX_TOKENS,
            streaming=True,
            num_return_sequences=scalar(2, np.int32),
            **SAMPLING,
            **guide_inputs("json_schema", json.dumps(SCHEMA)),
        ),
        "regex": engine_inputs(prompt, GUIDED_MAX_TOKENS, streaming=False, **guide_inputs("regex", REGEX)),
        "plain": engine_inputs(prompt, plain_tokens, streaming=True, **LOGITS_FLAGS),
    }
    batched_before = triton_stack.metric("trtllm_cpu_engine_batched_tokens_total", **labels)
    results: dict[str, dict[int, Generation]] = {}
    start = threading.Barrier(len(requests))

    def run(name: str) -> None:
        start.wait()
        streamed = bool(requests[name]["streaming"][0, 0])
        results[name] = gather(
            stream_infer(triton_stack.grpc_url, model.engine, requests[name]), streamed=streamed
        )

    threads = [threading.Thread(target=run, args=(name,)) for name in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert sorted(results) == sorted(requests)
    for name in ("schema", "schema_n2"):
        for seq in results[name].values():
            assert_valid_json(decoded(model, seq))
    assert len(results["schema_n2"]) == 2
    assert re.fullmatch(REGEX, decoded(model, results["regex"][0]))
    # Grammar masks stay with their own rows: the unguided request is still plain greedy decoding.
    plain = results["plain"][0]
    assert plain.ids == reference_greedy(model, prompt, plain_tokens)
    assert_log_probs_match(model, prompt, plain, 1.0)
    assert triton_stack.metric("trtllm_cpu_engine_batched_tokens_total", **labels) > batched_before


@pytest.mark.parametrize(
    ("guide_type", "guide", "needle"),
    [
        ("json_schema", '{"type": "objekt"}', 'does not compile: Unsupported type "objekt"'),
        ("json_schema", '{"type": "object", ', "guided_decoding_guide is not valid JSON"),
        ("regex", "[a-", "does not compile: Regex parsing error"),
        ("ebnf_grammar", "root ::= missing", 'Rule "missing" is not defined'),
        ("xml", "<a/>", "guided_decoding_guide_type must be one of json, json_schema, regex, ebnf_grammar"),
        ("regex", "", "guided_decoding_guide is required for guide type 'regex'"),
    ],
)
def test_a_bad_guide_gets_an_error_response_naming_the_problem(
    triton_stack: TritonStack, guide_type: str, guide: str, needle: str
) -> None:
    model = triton_stack.models["bpe_current"]
    prompt = prompt_ids(model, PROMPT)
    for streaming in (False, True):
        (response,) = stream_infer(
            triton_stack.grpc_url,
            model.engine,
            engine_inputs(prompt, 8, streaming=streaming, **guide_inputs(guide_type, guide)),
        )
        assert response.error is not None and needle in response.error, response.error


def test_guided_decoding_is_refused_where_there_are_no_logits(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_synthetic"]
    prompt = prompt_ids(model, PROMPT)
    (response,) = stream_infer(
        triton_stack.grpc_url,
        model.engine,
        engine_inputs(prompt, 8, streaming=True, **guide_inputs("json", "")),
    )
    assert response.error is not None and "guided decoding is not enabled" in response.error
    assert "synthetic" in response.error
