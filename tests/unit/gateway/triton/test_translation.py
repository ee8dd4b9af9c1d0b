"""Pure parts of the Triton adapter: contract reading, request tensors, response parsing."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from gateway.engine import GenerationRequest, SamplingParams
from gateway.triton import contract as c
from gateway.triton.tensors import build_request, parse_response, requested_outputs, sampling_values

CURRENT = """
name: "ensemble"
platform: "ensemble"
max_batch_size: 64
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "end_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "pad_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "min_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },
  { name: "num_return_sequences" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
  { name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "sequence_index" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

LEGACY = """
name: "ensemble"
platform: "ensemble"
max_batch_size: 64
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "min_length" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "random_seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },
  { name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def contract_of(text: str, route: c.Route = "ensemble") -> c.Contract:
    return c.read_contract(text_format.Parse(text, mc.ModelConfig()), route)


def request(**params: object) -> GenerationRequest:
    sp = SamplingParams(**{"max_tokens": 8, **params})  # type: ignore[arg-type]
    return GenerationRequest("r1", "hello", (1, 2), sp, end_id=2, pad_id=0, end_token_strings=("<|eot|>",))


def tensor_values(request: service_pb2.ModelInferRequest) -> dict[str, object]:
    out: dict[str, object] = {}
    for t, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if t.datatype == "BYTES":
            values, pos = [], 0
            while pos < len(raw):
                (n,) = struct.unpack_from("<I", raw, pos)
                values.append(raw[pos + 4 : pos + 4 + n].decode())
                pos += 4 + n
            out[t.name] = (t.datatype, list(t.shape), values)
        else:
            dtype = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}[t.datatype]
            out[t.name] = (t.datatype, list(t.shape), np.frombuffer(raw, dtype=dtype).tolist())
    return out


def build(contract: c.Contract, req: GenerationRequest, **kw: object) -> service_pb2.ModelInferRequest:
    return build_request(contract, req, request_id="rid", **kw)  # type: ignore[arg-type]


def test_contract_variants_are_recognised_from_the_config() -> None:
    cur, leg = contract_of(CURRENT), contract_of(LEGACY)
    assert (cur.variant, cur.inputs[c.SEED].name, cur.inputs[c.MIN_TOKENS].name) == (
        "current",
        "seed",
        "min_tokens",
    )
    assert (leg.variant, leg.inputs[c.SEED].name, leg.inputs[c.MIN_TOKENS].name) == (
        "legacy",
        "random_seed",
        "min_length",
    )
    assert cur.exposes_token_ids and not leg.exposes_token_ids
    # Several responses to one request (one per sequence) need a decoupled model.
    assert not cur.native_num_sequences
    assert cur.with_decoupled(True).native_num_sequences and not leg.with_decoupled(True).native_num_sequences
    assert cur.reports_token_counts and not leg.reports_token_counts


LEGACY_WITH_LOG_PROBS = LEGACY.replace(
    '{ name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true }',
    '{ name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },\n'
    '  { name: "return_log_probs" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',
).replace(
    'output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]',
    'output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },\n'
    '  { name: "output_log_probs" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]',
)


def test_a_text_only_ensemble_streams_only_a_streamed_request() -> None:
    text_only = contract_of(LEGACY_WITH_LOG_PROBS).with_decoupled(True)
    assert text_only.streams(True) and not text_only.streams(False)
    assert not text_only.exact_stream()  # upstream's postprocessing: each response decoded alone
    exact = text_only.with_settings(c.engine_settings({}, {"text_output": "token_bytes"}))
    assert exact.exact_stream()
    # A model that cannot stream answers every request whole: exact, and never asked to stream.
    whole = contract_of(LEGACY_WITH_LOG_PROBS)
    assert not whole.streams(True) and whole.exact_stream()
    # With ids, streaming costs nothing in exactness and lets a stop string cancel at once.
    assert contract_of(CURRENT).with_decoupled(True).streams(False)


def test_a_whole_legacy_result_is_counted_by_its_log_probs() -> None:
    k = contract_of(LEGACY_WITH_LOG_PROBS).with_decoupled(True)
    assert k.usage_source == "output_log_probs"
    assert requested_outputs(k, stream=False) == ["text_output", "output_log_probs"]
    assert requested_outputs(k, stream=True) == ["text_output"]  # one response, one token
    built = tensor_values(build(k, request(), seed=None, num_sequences=1, stream=False))
    assert built["return_log_probs"] == ("BOOL", [1, 1], [True])
    assert built["stream"] == ("BOOL", [1, 1], [False])


@pytest.mark.parametrize(
    ("engine", "backend"),
    [
        ({}, ""),
        ({"guided_decoding_backend": "${guided_decoding_backend}"}, ""),  # left unfilled
        ({"guided_decoding_backend": "xgrammar"}, ""),  # no tokenizer information for it
        ({"guided_decoding_backend": "xgrammar", "tokenizer_dir": "/models/hf"}, "xgrammar"),
        ({"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": "/x.json"}, "xgrammar"),
        ({"guided_decoding_backend": "outlines", "tokenizer_dir": "/models/hf"}, ""),
    ],
)
def test_guided_decoding_counts_only_when_the_engine_config_sets_it_up(
    engine: dict[str, str], backend: str
) -> None:
    config = mc.ModelConfig()
    for key, value in engine.items():
        config.parameters[key].string_value = value
    settings = c.engine_settings(c.parameters(config))
    assert settings.guided_backend == backend
    guided = CURRENT.replace(
        '{ name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },',
        '{ name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },\n'
        '  { name: "guided_decoding_guide_type" data_type: TYPE_STRING dims: [ 1 ] optional: true },\n'
        '  { name: "guided_decoding_guide" data_type: TYPE_STRING dims: [ 1 ] optional: true },',
    )
    assert contract_of(guided).with_settings(settings).guided_decoding == bool(backend)


@pytest.mark.parametrize(
    ("value", "echoes"),
    [(None, True), ("false", True), ("${exclude_input_in_output}", True), ("True", False)],
)
def test_a_whole_result_repeats_the_prompt_unless_the_engine_is_set_to_exclude_it(
    value: str | None, echoes: bool
) -> None:
    config = mc.ModelConfig()
    if value is not None:
        config.parameters["exclude_input_in_output"].string_value = value
    k = contract_of(LEGACY).with_decoupled(True).with_settings(c.engine_settings(c.parameters(config)))
    assert k.repeats_prompt(stream=False) == echoes
    assert not k.repeats_prompt(stream=True)
    # A request input says so itself, whatever the parameter.
    assert not contract_of(CURRENT).with_settings(k.settings).repeats_prompt(stream=False)


def test_a_model_that_is_not_an_ensemble_is_refused() -> None:
    with pytest.raises(c.ContractError, match="text_input"):
        contract_of('name: "m" input [ { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] } ]')


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"temperature": 0.0}, {"top_k": 1}),
        ({}, {"temperature": 1.0, "top_p": 1.0}),
        ({"temperature": 0.7, "top_p": 0.9}, {"temperature": 0.7, "top_p": 0.9}),
        ({"temperature": 0.7, "top_k": 40}, {"temperature": 0.7, "top_k": 40, "top_p": 1.0}),
        (
            {"presence_penalty": 0.0, "frequency_penalty": 0.5},
            {"presence_penalty": 0.0, "frequency_penalty": 0.5},
        ),
    ],
)
def test_openai_sampling_maps_to_tensorrt_llm_inputs(params: dict, expected: dict) -> None:
    values = sampling_values(request(**params))
    for key, value in expected.items():
        assert values[key] == value
    if params.get("temperature") == 0.0:
        assert "temperature" not in values and "top_p" not in values


def test_ignore_eos_sets_an_end_id_no_token_has() -> None:
    assert sampling_values(request(ignore_eos=True))["end_id"] == -1
    assert sampling_values(request())["end_id"] == 2


def test_only_declared_inputs_are_sent_with_the_declared_names_and_shapes() -> None:
    req = request(temperature=0.5, seed=None, min_tokens=3, repetition_penalty=1.2)
    cur = tensor_values(build(contract_of(CURRENT), req, seed=42, num_sequences=2, stream=True))
    assert cur["text_input"] == ("BYTES", [1, 1], ["hello"])
    assert cur["max_tokens"] == ("INT32", [1, 1], [8])
    assert cur["stream"] == ("BOOL", [1, 1], [True])
    assert cur["seed"] == ("UINT64", [1, 1], [42])
    assert cur["min_tokens"] == ("INT32", [1, 1], [3])
    assert cur["num_return_sequences"] == ("INT32", [1, 1], [2])
    assert cur["exclude_input_in_output"] == ("BOOL", [1, 1], [True])
    assert cur["stop_words"] == ("BYTES", [1, 1], ["<|eot|>"])
    assert "repetition_penalty" not in cur  # not declared by this model
    leg = tensor_values(build(contract_of(LEGACY), req, seed=42, num_sequences=1, stream=True))
    assert leg["random_seed"] == ("UINT64", [1, 1], [42])
    assert leg["min_length"] == ("INT32", [1, 1], [3])
    assert set(leg) <= {"text_input", "max_tokens", "stream", "random_seed", "min_length", "top_k"}


def test_requested_outputs_prefer_token_ids() -> None:
    # A decoupled ensemble only answers when its last step's output (text_output) is asked for.
    assert requested_outputs(contract_of(CURRENT)) == ["output_ids", "text_output"]
    assert requested_outputs(contract_of(CURRENT), num_sequences=2, stream=False) == [
        "output_ids",
        "sequence_length",
        "text_output",
        "sequence_index",
    ]
    assert requested_outputs(contract_of(LEGACY)) == ["text_output"]


def test_the_request_asks_for_an_empty_final_response_and_carries_its_id() -> None:
    built = build(contract_of(CURRENT), request(), seed=None, num_sequences=1, stream=True)
    assert built.parameters["triton_enable_empty_final_response"].bool_param is True
    assert (built.model_name, built.id) == ("ensemble", "rid")
    assert [o.name for o in built.outputs] == requested_outputs(contract_of(CURRENT))
    assert "return_num_output_tokens" not in tensor_values(built)  # counted from the ids instead


def _response(
    outputs: dict[str, tuple[str, list[int], bytes]], final: bool = False
) -> service_pb2.ModelInferResponse:
    r = service_pb2.ModelInferResponse(model_name="ensemble")
    for name, (dtype, shape, raw) in outputs.items():
        o = r.outputs.add()
        o.name, o.datatype = name, dtype
        o.shape.extend(shape)
        r.raw_output_contents.append(raw)
    r.parameters["triton_final_response"].bool_param = final
    return r


def test_a_streamed_token_response_is_parsed() -> None:
    ids = np.array([[[17, 99]]], dtype=np.int32).tobytes()
    parsed = parse_response(
        _response(
            {
                "output_ids": ("INT32", [1, 1, 2], ids),
                "sequence_length": ("INT32", [1, 1], np.array([1], dtype=np.int32).tobytes()),
                "sequence_index": ("INT32", [1, 1], np.array([3], dtype=np.int32).tobytes()),
            }
        )
    )
    assert (parsed.token_ids, parsed.index, parsed.final, parsed.empty) == ((17,), 3, False, False)


def test_text_output_bytes_are_kept_exactly() -> None:
    piece = "你".encode()[:2]  # half a character, as our postprocessing may send
    raw = struct.pack("<I", len(piece)) + piece
    parsed = parse_response(_response({"text_output": ("BYTES", [1, 1], raw)}))
    assert parsed.text == piece and parsed.token_ids is None


def test_the_empty_final_response_is_recognised() -> None:
    parsed = parse_response(_response({}, final=True))
    assert parsed.final and parsed.empty


ENGINE = """
name: "tensorrt_llm"
backend: "tensorrtllm"
max_batch_size: 64
model_transaction_policy { decoupled: true }
input [
  { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "end_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "stop_words_list" data_type: TYPE_INT32 dims: [ 2, -1 ] optional: true },
  { name: "runtime_top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "runtime_top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "len_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }
]
output [
  { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
  { name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""


def test_the_engine_route_sends_ids_under_the_engine_names() -> None:
    contract = contract_of(ENGINE, "engine")
    assert contract.decoupled and contract.exposes_token_ids
    req = GenerationRequest(
        "r",
        "unused",
        (5, 6, 7),
        SamplingParams(max_tokens=4, top_k=3, length_penalty=1.5),
        end_id=2,
        end_token_ids=(3, 9),
    )
    values = tensor_values(build(contract, req, seed=11, num_sequences=1, stream=True))
    assert values["input_ids"] == ("INT32", [1, 3], [5, 6, 7])
    assert values["input_lengths"] == ("INT32", [1, 1], [3])
    assert values["request_output_len"] == ("INT32", [1, 1], [4])
    assert values["streaming"] == ("BOOL", [1, 1], [True])
    assert values["runtime_top_k"] == ("INT32", [1, 1], [3])
    assert values["runtime_top_p"] == ("FP32", [1, 1], [1.0])
    assert values["len_penalty"] == ("FP32", [1, 1], [1.5])
    assert values["seed"] == ("UINT64", [1, 1], [11])
    # Two one-token stop words: ids [3, 9], end offsets [1, 2].
    assert values["stop_words_list"] == ("INT32", [1, 2, 2], [3, 9, 1, 2])
    assert "text_input" not in values


def test_the_engine_route_needs_the_engine_inputs() -> None:
    with pytest.raises(c.ContractError, match="input_ids"):
        contract_of(CURRENT, "engine")


def test_ids_win_over_the_text_that_comes_along() -> None:
    ids = np.array([[[5]]], dtype=np.int32).tobytes()
    raw = struct.pack("<I", 1) + b"x"
    parsed = parse_response(
        _response({"output_ids": ("INT32", [1, 1, 1], ids), "text_output": ("BYTES", [1, 1], raw)})
    )
    assert parsed.token_ids == (5,) and parsed.text is None


def test_the_cancel_request_names_the_engine_and_the_request() -> None:
    from gateway.triton.tensors import cancel_request

    stop = cancel_request("tensorrt_llm", "42")
    values = tensor_values(stop)
    assert (stop.model_name, stop.id) == ("tensorrt_llm", "42")
    assert values["stop"] == ("BOOL", [1, 1], [True])
    assert set(values) == {"input_ids", "input_lengths", "request_output_len", "stop"}


PERF = CURRENT.replace(
    '{ name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',
    '{ name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },\n'
    '  { name: "return_perf_metrics" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',
).replace(
    '{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }',
    '{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] },\n'
    '  { name: "kv_cache_reused_blocks" data_type: TYPE_INT32 dims: [ 1 ] }',
)


def test_perf_metrics_are_asked_for_only_when_the_block_size_is_known() -> None:
    unknown = contract_of(PERF)
    assert not unknown.reports_cached_tokens
    assert "return_perf_metrics" not in tensor_values(
        build(unknown, request(), seed=None, num_sequences=1, stream=True)
    )
    known = unknown.with_settings(c.EngineSettings(tokens_per_block=16))
    assert known.reports_cached_tokens and known.capabilities().cached_tokens
    out = build(known, request(), seed=None, num_sequences=1, stream=True)
    assert tensor_values(out)["return_perf_metrics"] == ("BOOL", [1, 1], [True])
    assert "kv_cache_reused_blocks" in [o.name for o in out.outputs]
    # A contract without the tensors never asks, whatever the block size.
    assert not contract_of(CURRENT).with_settings(c.EngineSettings(tokens_per_block=16)).reports_cached_tokens


def test_the_block_size_comes_from_the_tokens_per_block_parameter() -> None:
    config = text_format.Parse(PERF, mc.ModelConfig())
    assert c.engine_settings(c.parameters(config)).tokens_per_block is None
    config.parameters["tokens_per_block"].string_value = "64"
    assert c.engine_settings(c.parameters(config)).tokens_per_block == 64
    config.parameters["tokens_per_block"].string_value = "${tokens_per_block}"
    assert c.engine_settings(c.parameters(config)).tokens_per_block is None


def test_reused_blocks_are_read_from_a_response() -> None:
    ids = np.array([[[17]]], dtype=np.int32).tobytes()
    parsed = parse_response(
        _response(
            {
                "output_ids": ("INT32", [1, 1, 1], ids),
                "kv_cache_reused_blocks": ("INT32", [1, 1], np.array([5], dtype=np.int32).tobytes()),
            }
        )
    )
    assert parsed.kv_cache_reused_blocks == 5


def _with_priority(dtype: str) -> str:
    return ENGINE.replace(
        '{ name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }',
        '{ name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },\n'
        f'  {{ name: "priority" data_type: {dtype} dims: [ 1 ] optional: true }}',
    )


def test_the_priority_is_sent_in_the_executors_terms_only_where_the_model_declares_it_as_fp32() -> None:
    from dataclasses import replace

    req = GenerationRequest("r", "unused", (5, 6), SamplingParams(max_tokens=4), end_id=2)
    assert "priority" not in tensor_values(
        build(contract_of(ENGINE, "engine"), req, seed=None, num_sequences=1, stream=True)
    )
    # An input of another type is not TensorRT-LLM's float priority: nothing is guessed.
    other = contract_of(_with_priority("TYPE_INT32"), "engine")
    assert not other.priority
    assert "priority" not in tensor_values(build(other, req, seed=None, num_sequences=1, stream=True))
    declared = contract_of(_with_priority("TYPE_FP32"), "engine")
    assert declared.priority
    for priority, expected in ((0, 0.5), (-10, 0.75), (10, 0.25)):
        values = tensor_values(
            build(declared, replace(req, priority=priority), seed=None, num_sequences=1, stream=True)
        )
        assert values["priority"] == ("FP32", [1, 1], [pytest.approx(expected)])


def test_engine_priorities_keep_the_order_and_stay_within_the_executors_range() -> None:
    from gateway.triton.tensors import engine_priority

    priorities = [-(2**31), -1000, -11, -10, -1, 0, 1, 10, 11, 1000, 2**31 - 1]
    mapped = [engine_priority(p) for p in priorities]
    assert mapped == sorted(mapped, reverse=True)
    assert len(set(mapped)) == len(mapped)
    assert all(0.0 <= m <= 1.0 for m in mapped)


def test_a_long_prompts_token_id_array_makes_the_same_request_as_its_ints() -> None:
    import orjson

    from gateway.text.ids import TokenIds
    from gateway.triton.tensors import build_json_request

    contract = contract_of(ENGINE, "engine")
    ints = tuple((i * 7919) % 150_000 for i in range(5000))
    made = {}
    for ids in (ints, TokenIds(ints)):
        req = GenerationRequest("r", "unused", ids, SamplingParams(max_tokens=4), end_id=2)
        grpc = build(contract, req, seed=11, num_sequences=1, stream=True).SerializeToString()
        body = build_json_request(contract, req, request_id="r", seed=11, num_sequences=1, stream=True)
        made[type(ids)] = (grpc, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
    assert made[tuple] == made[TokenIds]
    req = GenerationRequest("r", "", TokenIds(ints), SamplingParams(max_tokens=4))
    values = tensor_values(build(contract, req, seed=None, num_sequences=1, stream=True))
    assert values["input_ids"] == ("INT32", [1, 5000], list(ints))
