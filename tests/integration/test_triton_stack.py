"""The real local Triton stack: rendered repositories on the wheel's tritonserver with the CPU engine."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deploy import model_repo
from tests.integration.conftest import (
    FAMILY_LAYOUT,
    STACK_LAYOUT,
    STOCK_LAYOUT,
    StackModel,
    StreamResponse,
    TritonStack,
    scalar,
    stream_infer,
)

pytestmark = pytest.mark.integration

PROMPTS = ["Hello world", "The quick brown fox jumps over", "你好 🙂 and some more words here, friend"]


@cache
def _tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


@cache
def _hf_model(directory: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@cache
def hf_greedy(directory: Path, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """transformers' own greedy continuation, without stopping at any end token."""
    import torch

    model = _hf_model(directory)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
            # An id outside the vocabulary: never generated, so generation never stops early.
            eos_token_id=model.config.vocab_size,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def prompt_ids(model: StackModel, text: str) -> list[int]:
    return list(_tokenizer(model.tokenizer_dir).encode(text))


def ensemble_inputs(model: StackModel, text: str, max_tokens: int, *, stream: bool, **extra: Any) -> dict:
    inputs = {
        "text_input": scalar(text, object),
        "max_tokens": scalar(max_tokens, np.int32),
        "stream": scalar(stream, bool),
    }
    inputs.update(extra)
    return inputs


def engine_inputs(prompt: list[int], max_tokens: int, *, streaming: bool, **extra: Any) -> dict:
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": scalar(len(prompt), np.int32),
        "request_output_len": scalar(max_tokens, np.int32),
        "streaming": scalar(streaming, bool),
    }
    inputs.update(extra)
    return inputs


def token_responses(responses: list[StreamResponse]) -> list[StreamResponse]:
    assert [r.error for r in responses] == [None] * len(responses), responses[-1].error
    assert responses[-1].final, "the last response must carry the final flag"
    assert all(not r.final for r in responses[:-1])
    return [r for r in responses if "output_ids" in r.outputs or "text_output" in r.outputs]


def streamed_ids(responses: list[StreamResponse]) -> list[int]:
    ids: list[int] = []
    for response in token_responses(responses):
        length = int(response.outputs["sequence_length"][0, 0])
        ids.extend(int(t) for t in response.outputs["output_ids"][0, 0, :length])
    return ids


def wait_for(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.01)


def test_all_models_of_both_variants_are_ready(triton_stack: TritonStack) -> None:
    index = {m["name"]: m["state"] for m in triton_stack.server.repository_index()}
    expected = {
        name
        for model in triton_stack.models.values()
        for name in (model.ensemble, model.engine, model.preprocessing, model.postprocessing)
        if name  # a family served on the engine route alone has no ensemble
    }

    assert {name: index.get(name) for name in expected} == dict.fromkeys(expected, "READY")
    assert {m.variant for m in triton_stack.models.values()} == {"current", "legacy"}
    assert sorted(triton_stack.models) == sorted([*STACK_LAYOUT, *STOCK_LAYOUT, *FAMILY_LAYOUT])


def test_served_configs_are_the_rendered_contract_variants(triton_stack: TritonStack) -> None:
    client = grpcclient.InferenceServerClient(triton_stack.grpc_url)
    try:
        for model in triton_stack.models.values():
            if not model.ensemble:
                continue  # a family served on the engine route alone
            config = client.get_model_config(model.ensemble, as_json=True)["config"]
            inputs = {t["name"] for t in config["input"]}
            outputs = {t["name"] for t in config["output"]}
            engine = client.get_model_config(model.engine, as_json=True)["config"]
            assert engine["model_transaction_policy"].get("decoupled", False) is model.decoupled
            if model.variant == "current":
                assert {"seed", "min_tokens", "num_return_sequences", "exclude_input_in_output"} <= inputs
                assert {"sequence_index", "num_output_tokens"} <= outputs
            else:
                assert {"random_seed", "min_length"} <= inputs
                assert not {"seed", "min_tokens", "num_return_sequences"} & inputs
            assert ({"output_ids", "sequence_length"} <= outputs) == model.output_ids
    finally:
        client.close()


@pytest.mark.parametrize("key", ["bpe_current", "bpe_legacy", "metaspace_current", "bpe_stock"])
def test_streaming_through_the_ensemble_sends_one_response_per_token_then_a_final_one(
    triton_stack: TritonStack, key: str
) -> None:
    model = triton_stack.models[key]
    max_tokens = 12
    prompt = prompt_ids(model, PROMPTS[0])
    expected = hf_greedy(model.tokenizer_dir, tuple(prompt), max_tokens)
    eos = _tokenizer(model.tokenizer_dir).eos_token_id
    # The random model could emit the tokenizer's eos (the default end_id); keep the check exact.
    expected = expected[: expected.index(eos)] if eos in expected else expected

    responses = stream_infer(
        triton_stack.grpc_url, model.ensemble, ensemble_inputs(model, PROMPTS[0], max_tokens, stream=True)
    )
    tokens = token_responses(responses)

    assert len(tokens) == len(expected)
    if model.output_ids:
        assert streamed_ids(responses) == expected
        assert all(r.outputs["output_ids"].shape == (1, 1, 1) for r in tokens)
    text = b"".join(r.outputs["text_output"].reshape(-1)[0] for r in tokens)
    assert_continuation(model, prompt, expected, text)


def assert_continuation(model: StackModel, prompt: list[int], completion: list[int], text: bytes) -> None:
    """``text`` is exactly what ``completion`` adds to the prompt's text.

    Compared as bytes with the (unit-tested) surface-bytes function; when they are valid UTF-8, also
    as text with transformers' decoding of prompt + completion minus the prompt. Invalid sequences
    are left out of that comparison because the tokenizers' decoders replace them lossily (a byte
    fallback run becomes one U+FFFD per byte, even its ASCII bytes).
    """
    tokenizer = _tokenizer(model.tokenizer_dir)
    assert text == _token_bytes_module().TokenBytes(tokenizer).join(completion)
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return
    whole = tokenizer.decode(prompt + completion, skip_special_tokens=True)
    start = tokenizer.decode(prompt, skip_special_tokens=True)
    assert whole.startswith(start)
    assert decoded == whole[len(start) :]


@cache
def _token_bytes_module() -> ModuleType:
    path = model_repo.TEMPLATES_DIR / "postprocessing" / "1" / "token_bytes.py"
    spec = importlib.util.spec_from_file_location("integration_token_bytes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", ["bpe_current", "bpe_legacy", "metaspace_current"])
def test_greedy_output_ids_equal_transformers_generate(triton_stack: TritonStack, key: str) -> None:
    model = triton_stack.models[key]
    max_tokens = 24
    for text in PROMPTS:
        prompt = prompt_ids(model, text)
        expected = hf_greedy(model.tokenizer_dir, tuple(prompt), max_tokens)
        responses = stream_infer(
            triton_stack.grpc_url,
            model.engine,
            engine_inputs(prompt, max_tokens, streaming=False, end_id=scalar(-1, np.int32)),
        )
        (response,) = token_responses(responses)
        length = int(response.outputs["sequence_length"][0, 0])
        ids = [int(t) for t in response.outputs["output_ids"][0, 0, :length]]
        # The stock default exclude_input_in_output=false echoes the prompt in non-streaming output.
        assert ids == prompt + expected


def test_ensemble_non_streaming_excludes_the_prompt_on_request(triton_stack: TritonStack) -> None:
    model = triton_stack.models["metaspace_current"]
    prompt = prompt_ids(model, PROMPTS[2])
    expected = hf_greedy(model.tokenizer_dir, tuple(prompt), 10)
    inputs = ensemble_inputs(
        model,
        PROMPTS[2],
        10,
        stream=False,
        exclude_input_in_output=scalar(True, bool),
        end_id=scalar(-1, np.int32),
    )

    (response,) = token_responses(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))

    assert response.outputs["output_ids"][0, 0].tolist() == expected
    assert response.outputs["sequence_length"].tolist() == [[10]]
    assert_continuation(model, prompt, expected, response.outputs["text_output"][0, 0])


def test_concurrent_requests_are_batched_and_each_still_equals_generate(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    labels = {"model": model.engine, "version": "1"}
    max_tokens = 96
    prompts = [prompt_ids(model, text) for text in [*PROMPTS, "Once upon a time"]]
    expected = [hf_greedy(model.tokenizer_dir, tuple(p), max_tokens) for p in prompts]
    batched_before = triton_stack.metric("trtllm_cpu_engine_batched_tokens_total", **labels)
    steps_before = triton_stack.metric("trtllm_cpu_engine_steps_total", **labels)
    tokens_before = triton_stack.metric("trtllm_cpu_engine_generated_tokens_total", **labels)
    results: dict[int, list[int]] = {}
    start = threading.Barrier(len(prompts))

    def run(index: int) -> None:
        start.wait()
        inputs = engine_inputs(prompts[index], max_tokens, streaming=True, end_id=scalar(-1, np.int32))
        results[index] = streamed_ids(stream_infer(triton_stack.grpc_url, model.engine, inputs))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert [results.get(i) for i in range(len(prompts))] == expected
    total = len(prompts) * max_tokens
    wait_for(
        lambda: (
            triton_stack.metric("trtllm_cpu_engine_generated_tokens_total", **labels) - tokens_before >= total
        ),
        5,
        "the engine's token counter did not reach the generated total",
    )
    batched = triton_stack.metric("trtllm_cpu_engine_batched_tokens_total", **labels) - batched_before
    steps = triton_stack.metric("trtllm_cpu_engine_steps_total", **labels) - steps_before
    # Sequential serving would generate every token in a step of its own.
    assert batched >= max_tokens / 2
    assert steps < total
    assert triton_stack.metric("trtllm_cpu_engine_max_batch_size", **labels) >= 2


@pytest.mark.parametrize("key", ["bpe_synthetic", "bpe_current"])
def test_a_cancelled_stream_stops_the_engine_work_within_a_step(triton_stack: TritonStack, key: str) -> None:
    model = triton_stack.models[key]
    labels = {"model": model.engine, "version": "1"}
    max_tokens = 2000 if model.engine_mode == "synthetic" else 480
    cancelled_before = triton_stack.metric("trtllm_cpu_engine_cancelled_requests_total", **labels)
    tokens_before = triton_stack.metric("trtllm_cpu_engine_generated_tokens_total", **labels)
    wait_for(
        lambda: triton_stack.metric("nv_trt_llm_request_metrics", request_type="active", **labels) == 0,
        10,
        "the engine is busy before the test starts",
    )
    prompt = prompt_ids(model, PROMPTS[1])
    received: list[StreamResponse] = []

    def cancel_after_three(response: StreamResponse, _client: grpcclient.InferenceServerClient) -> bool:
        received.append(response)
        if len(received) == 1:
            # The engine publishes its gauges after the step that sent this response: wait for it.
            wait_for(
                lambda: (
                    triton_stack.metric("nv_trt_llm_request_metrics", request_type="active", **labels) == 1
                ),
                5,
                "the running request never counted as active",
            )
        return len(received) == 3

    responses = stream_infer(
        triton_stack.grpc_url,
        model.engine,
        engine_inputs(prompt, max_tokens, streaming=True, end_id=scalar(-1, np.int32)),
        on_response=cancel_after_three,
    )
    cancelled_at = time.monotonic()
    assert len(responses) == 3 and not responses[-1].final

    wait_for(
        lambda: (
            triton_stack.metric("trtllm_cpu_engine_cancelled_requests_total", **labels)
            == cancelled_before + 1
        ),
        5,
        "the engine never dropped the cancelled request",
    )
    dropped_after = time.monotonic() - cancelled_at
    wait_for(
        lambda: triton_stack.metric("nv_trt_llm_request_metrics", request_type="active", **labels) == 0,
        5,
        "the cancelled request still counts as active",
    )
    generated = triton_stack.metric("trtllm_cpu_engine_generated_tokens_total", **labels) - tokens_before
    assert generated < max_tokens
    if model.engine_mode == "synthetic":
        # Steps are 20 ms apart: the engine drops the request at its next step once Triton marks it
        # cancelled; the slack covers responses still on their way to this client when it cancelled.
        assert generated <= len(received) + 10, f"{generated} tokens generated for {len(received)} received"
        assert dropped_after < 1.0


def test_stop_input_ends_a_running_request_early(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_synthetic"]
    prompt = prompt_ids(model, PROMPTS[0])
    stop_sent = threading.Event()

    def stop_after_two(response: StreamResponse, _client: grpcclient.InferenceServerClient) -> bool:
        if not stop_sent.is_set() and "output_ids" in response.outputs:
            stop_sent.set()
            stop_responses = stream_infer(
                triton_stack.grpc_url,
                model.engine,
                engine_inputs(prompt, 1, streaming=False, stop=scalar(True, bool)),
                request_id="stop-me",
            )
            assert [r.error for r in stop_responses] == [None] and stop_responses[0].final
        return False

    responses = stream_infer(
        triton_stack.grpc_url,
        model.engine,
        engine_inputs(prompt, 2000, streaming=True),
        request_id="stop-me",
        on_response=stop_after_two,
        timeout=20,
    )

    assert stop_sent.is_set()
    assert responses[-1].final and responses[-1].error is None
    assert len(token_responses(responses)) < 100


def test_engine_outputs_follow_the_contract_dtypes_and_shapes(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    prompt = prompt_ids(model, PROMPTS[1])
    vocab = len(_tokenizer(model.tokenizer_dir))
    flags = {
        name: scalar(True, bool)
        for name in (
            "return_log_probs",
            "return_num_input_tokens",
            "return_num_output_tokens",
            "return_generation_logits",
            "return_context_logits",
            "exclude_input_in_output",
        )
    }

    (whole,) = token_responses(
        stream_infer(triton_stack.grpc_url, model.engine, engine_inputs(prompt, 5, streaming=False, **flags))
    )
    out = whole.outputs
    assert (out["output_ids"].dtype, out["output_ids"].shape) == (np.int32, (1, 1, 5))
    assert (out["sequence_length"].dtype, out["sequence_length"].tolist()) == (np.int32, [[5]])
    assert (out["cum_log_probs"].dtype, out["cum_log_probs"].shape) == (np.float32, (1, 1))
    assert (out["output_log_probs"].dtype, out["output_log_probs"].shape) == (np.float32, (1, 1, 5))
    assert np.isclose(out["cum_log_probs"][0, 0], out["output_log_probs"].sum(), atol=1e-4)
    assert np.all(out["output_log_probs"] <= 0)
    assert (out["num_input_tokens"].dtype, out["num_input_tokens"].tolist()) == (np.int32, [[len(prompt)]])
    assert (out["num_output_tokens"].dtype, out["num_output_tokens"].tolist()) == (np.int32, [[5]])
    assert (out["generation_logits"].dtype, out["generation_logits"].shape) == (np.float32, (1, 1, 5, vocab))
    assert (out["context_logits"].dtype, out["context_logits"].shape) == (np.float32, (1, len(prompt), vocab))
    # Greedy: every chosen token is the argmax of its generation logits.
    assert out["generation_logits"][0, 0].argmax(-1).tolist() == out["output_ids"][0, 0].tolist()
    assert "sequence_index" not in out and "batch_index" not in out

    streamed = stream_infer(
        triton_stack.grpc_url, model.engine, engine_inputs(prompt, 5, streaming=True, **flags)
    )
    chunks = token_responses(streamed)
    assert len(chunks) == 5
    for index, chunk in enumerate(chunks):
        assert chunk.outputs["output_ids"].shape == (1, 1, 1)
        assert chunk.outputs["sequence_length"].tolist() == [[1]]
        assert chunk.outputs["output_log_probs"].shape == (1, 1, 1)
        assert chunk.outputs["num_output_tokens"].tolist() == [[1]]
        assert ("num_input_tokens" in chunk.outputs) == (index == 0)
        assert ("context_logits" in chunk.outputs) == (index == 0)
    assert streamed_ids(streamed) == out["output_ids"][0, 0].tolist()
    assert np.isclose(chunks[-1].outputs["cum_log_probs"][0, 0], out["cum_log_probs"][0, 0], atol=1e-4)


def test_ensemble_outputs_have_the_contract_shapes(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    inputs = ensemble_inputs(
        model,
        PROMPTS[0],
        4,
        stream=False,
        return_log_probs=scalar(True, bool),
        return_num_output_tokens=scalar(True, bool),
        exclude_input_in_output=scalar(True, bool),
    )
    (response,) = token_responses(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))
    out = response.outputs

    assert (out["text_output"].dtype, out["text_output"].shape) == (object, (1, 1))
    assert (out["output_ids"].dtype, out["output_ids"].shape) == (np.int32, (1, 1, 4))
    assert (out["sequence_length"].dtype, out["sequence_length"].shape) == (np.int32, (1, 1))
    assert (out["cum_log_probs"].dtype, out["cum_log_probs"].shape) == (np.float32, (1, 1))
    assert (out["output_log_probs"].dtype, out["output_log_probs"].shape) == (np.float32, (1, 1, 4))
    assert out["num_output_tokens"].tolist() == [[4]]


@pytest.mark.parametrize("stream", [True, False])
def test_num_return_sequences_gives_distinct_sequences_tagged_by_index(
    triton_stack: TritonStack, stream: bool
) -> None:
    model = triton_stack.models["bpe_current"]
    inputs = ensemble_inputs(
        model,
        PROMPTS[0],
        8,
        stream=stream,
        num_return_sequences=scalar(3, np.int32),
        top_p=scalar(1.0, np.float32),
        temperature=scalar(1.0, np.float32),
        seed=scalar(7, np.uint64),
        exclude_input_in_output=scalar(True, bool),
        end_id=scalar(-1, np.int32),
    )

    tokens = token_responses(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))
    by_index: dict[int, list[int]] = {}
    for response in tokens:
        assert response.outputs["sequence_index"].dtype == np.int32
        index = int(response.outputs["sequence_index"][0, 0])
        length = int(response.outputs["sequence_length"][0, 0])
        by_index.setdefault(index, []).extend(response.outputs["output_ids"][0, 0, :length].tolist())

    assert sorted(by_index) == [0, 1, 2]
    assert all(len(ids) == 8 for ids in by_index.values())
    assert len({tuple(ids) for ids in by_index.values()}) == 3
    assert len(tokens) == (24 if stream else 3)


def test_seeded_sampling_is_reproducible(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_legacy"]

    def sample(seed: int) -> list[int]:
        inputs = ensemble_inputs(
            model,
            PROMPTS[1],
            10,
            stream=True,
            top_k=scalar(50, np.int32),
            temperature=scalar(0.9, np.float32),
            random_seed=scalar(seed, np.uint64),
            end_id=scalar(-1, np.int32),
        )
        return streamed_ids(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_end_id_is_not_emitted_and_min_tokens_holds_it_back(triton_stack: TritonStack) -> None:
    for key, min_name in (("bpe_current", "min_tokens"), ("bpe_legacy", "min_length")):
        model = triton_stack.models[key]
        prompt = prompt_ids(model, PROMPTS[0])
        greedy = hf_greedy(model.tokenizer_dir, tuple(prompt), 12)
        end = greedy[3]
        first = greedy.index(end)

        ended = streamed_ids(
            stream_infer(
                triton_stack.grpc_url,
                model.engine,
                engine_inputs(prompt, 12, streaming=True, end_id=scalar(end, np.int32)),
            )
        )
        held = streamed_ids(
            stream_infer(
                triton_stack.grpc_url,
                model.engine,
                engine_inputs(
                    prompt,
                    12,
                    streaming=True,
                    end_id=scalar(end, np.int32),
                    **{min_name: scalar(first + 2, np.int32)},
                ),
            )
        )

        assert ended == greedy[:first]
        assert len(held) > first + 1
        assert end not in held[: first + 2]


def test_stop_words_end_generation_and_stay_in_the_output(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    prompt = prompt_ids(model, PROMPTS[1])
    greedy = hf_greedy(model.tokenizer_dir, tuple(prompt), 12)
    word = greedy[4:6]
    stop_words = np.array([[[*word, -1], [2, -1, -1]]], dtype=np.int32)

    ids = streamed_ids(
        stream_infer(
            triton_stack.grpc_url,
            model.engine,
            engine_inputs(
                prompt, 12, streaming=True, end_id=scalar(-1, np.int32), stop_words_list=stop_words
            ),
        )
    )

    cut = next(i for i in range(len(greedy)) if greedy[i : i + 2] == word) + 2
    assert ids == greedy[:cut]


def test_bad_requests_get_error_responses_and_the_engine_keeps_serving(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    prompt = prompt_ids(model, PROMPTS[0])

    (beam,) = stream_infer(
        triton_stack.grpc_url,
        model.engine,
        engine_inputs(prompt, 4, streaming=True, beam_width=scalar(2, np.int32)),
    )
    (too_long,) = stream_infer(
        triton_stack.grpc_url, model.engine, engine_inputs(prompt, 100_000, streaming=True)
    )
    (bad_id,) = stream_infer(triton_stack.grpc_url, model.engine, engine_inputs([10**6], 4, streaming=False))

    assert beam.error is not None and "beam_width" in beam.error
    assert too_long.error is not None and "maximum sequence length" in too_long.error
    assert bad_id.error is not None and "vocabulary" in bad_id.error
    assert (
        len(
            token_responses(
                stream_infer(triton_stack.grpc_url, model.engine, engine_inputs(prompt, 3, streaming=True))
            )
        )
        == 3
    )


def test_synthetic_engine_is_deterministic_and_interleaves_many_streams(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_synthetic"]
    labels = {"model": model.engine, "version": "1"}
    tokenizer = _tokenizer(model.tokenizer_dir)
    inputs = ensemble_inputs(model, PROMPTS[0], 10, stream=True, seed=scalar(3, np.uint64))
    first = streamed_ids(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))
    assert streamed_ids(stream_infer(triton_stack.grpc_url, model.ensemble, inputs)) == first
    assert len(first) == 10
    assert not set(first) & set(tokenizer.all_special_ids)
    assert all("\ufffd" not in tokenizer.decode([t]) for t in first)

    streams, max_tokens = 40, 25
    steps_before = triton_stack.metric("trtllm_cpu_engine_steps_total", **labels)
    results: list[int] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        ids = streamed_ids(
            stream_infer(
                triton_stack.grpc_url,
                model.engine,
                engine_inputs(prompt_ids(model, f"stream {index}"), max_tokens, streaming=True),
            )
        )
        with lock:
            results.append(len(ids))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert results == [max_tokens] * streams
    # Interleaved in one loop: far fewer engine steps than streams x tokens (one after the other
    # would take 1000). The engine's own count, not the wall time, which a busy machine stretches
    # (40 clients starting their streams took over 5 s on one).
    steps = triton_stack.metric("trtllm_cpu_engine_steps_total", **labels) - steps_before
    assert steps < streams * max_tokens / 4


def test_ensemble_stop_words_are_tokenized_alone_and_end_generation(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    tokenizer = _tokenizer(model.tokenizer_dir)
    prompt = prompt_ids(model, PROMPTS[0])
    greedy = hf_greedy(model.tokenizer_dir, tuple(prompt), 16)
    # A generated token that is also its own text's tokenization, so the stop word matches it.
    position, token = next(
        (i, t) for i, t in enumerate(greedy) if i >= 2 and tokenizer.encode(tokenizer.decode([t])) == [t]
    )
    inputs = ensemble_inputs(
        model,
        PROMPTS[0],
        16,
        stream=False,
        exclude_input_in_output=scalar(True, bool),
        end_id=scalar(-1, np.int32),
        stop_words=np.array([[tokenizer.decode([token]).encode(), b"never-generated words"]], dtype=object),
    )

    (response,) = token_responses(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))

    assert response.outputs["output_ids"][0, 0].tolist() == greedy[: greedy.index(token) + 1]
    assert greedy.index(token) <= position


def test_embedding_bias_words_steer_the_next_token(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    tokenizer = _tokenizer(model.tokenizer_dir)
    unbiased = hf_greedy(model.tokenizer_dir, tuple(prompt_ids(model, PROMPTS[0])), 1)[0]
    word, target = next(
        (w, ids[0])
        for w in (" the", " and", " world", " model", "The", " a")
        if len(ids := tokenizer.encode(w)) == 1 and ids[0] != unbiased
    )
    inputs = ensemble_inputs(
        model,
        PROMPTS[0],
        1,
        stream=False,
        exclude_input_in_output=scalar(True, bool),
        embedding_bias_words=np.array([[word.encode()]], dtype=object),
        embedding_bias_weights=np.array([[1000.0]], dtype=np.float32),
    )

    (response,) = token_responses(stream_infer(triton_stack.grpc_url, model.ensemble, inputs))

    assert response.outputs["output_ids"][0, 0].tolist() == [target]


def test_a_request_with_a_batch_of_prompts_tags_responses_with_batch_index(triton_stack: TritonStack) -> None:
    model = triton_stack.models["bpe_current"]
    first, second = prompt_ids(model, PROMPTS[0]), prompt_ids(model, PROMPTS[1])
    width = max(len(first), len(second))
    input_ids = np.zeros((2, width), dtype=np.int32)
    input_ids[0, : len(first)], input_ids[1, : len(second)] = first, second
    inputs = {
        "input_ids": input_ids,
        "input_lengths": np.array([[len(first)], [len(second)]], dtype=np.int32),
        "request_output_len": np.array([[6], [6]], dtype=np.int32),
        "end_id": np.array([[-1], [-1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True], [True]], dtype=bool),
    }

    responses = token_responses(stream_infer(triton_stack.grpc_url, model.engine, inputs))

    by_row = {int(r.outputs["batch_index"][0, 0]): r.outputs["output_ids"][0, 0].tolist() for r in responses}
    assert by_row == {
        0: hf_greedy(model.tokenizer_dir, tuple(first), 6),
        1: hf_greedy(model.tokenizer_dir, tuple(second), 6),
    }
