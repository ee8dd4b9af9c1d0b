"""The llmapi contract, read from upstream-shaped configs (tests/data/llmapi): detection, the
capabilities it declares, the request tensors, responses and errors. Pure: no Triton."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from deploy.model_repo import LlmapiSettings, load_model_configs, render_llmapi_repository
from gateway.engine import GenerationRequest, SamplingParams
from gateway.errors import ContextLengthExceededError, EngineError
from gateway.triton import llmapi as la
from gateway.triton.models import detect_contract
from tests.unit.gateway.triton.test_translation import CURRENT as CPP_ENSEMBLE

DATA = Path(__file__).resolve().parents[3] / "data" / "llmapi"
PROFILES = ("current", "v1.2")


def upstream(profile: str, *, decoupled: bool = False, name: str | None = None) -> mc.ModelConfig:
    config = text_format.Parse((DATA / profile / "config.pbtxt").read_text(), mc.ModelConfig())
    config.model_transaction_policy.decoupled = decoupled
    if name is not None:
        config.name = name
    return config


def interface(config: mc.ModelConfig) -> tuple[object, object]:
    def row(t: mc.ModelInput | mc.ModelOutput) -> tuple[object, ...]:
        return (t.name, t.data_type, tuple(t.dims), getattr(t, "optional", False))

    return [row(i) for i in config.input], [row(o) for o in config.output]


@pytest.mark.parametrize("profile", PROFILES)
def test_upstreams_config_is_the_llmapi_contract_whatever_its_name(profile: str) -> None:
    for name in ("tensorrt_llm", "my-llama"):
        config = upstream(profile, name=name)
        assert detect_contract(config) == "llmapi"
        contract = la.read_llmapi_contract(config)
        assert contract.model == name and not contract.decoupled
    assert detect_contract(text_format.Parse(CPP_ENSEMBLE, mc.ModelConfig())) == "tensorrt_llm"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("decoupled", [True, False])
def test_the_stand_ins_config_declares_upstreams_interface_exactly(
    profile: str, decoupled: bool, tmp_path: Path, tiny_bpe_dir: Path
) -> None:
    settings = LlmapiSettings(
        model=str(tiny_bpe_dir), name="tensorrt_llm", profile=profile, decoupled=decoupled, stand_in=True
    )
    rendered = load_model_configs(render_llmapi_repository(tmp_path / "repo", settings))["tensorrt_llm"]
    assert interface(rendered) == interface(upstream(profile))
    assert rendered.max_batch_size == 0 and rendered.model_transaction_policy.decoupled == decoupled
    files = sorted(p.name for p in (tmp_path / "repo" / "tensorrt_llm" / "1").iterdir())
    assert files == ["engine.py", "model.py", "model.yaml"]


def test_a_model_no_contract_fits_is_one_line_naming_it_its_interface_and_the_contracts() -> None:
    config = text_format.Parse(
        'name: "preprocessing" backend: "python" input { name: "QUERY" data_type: TYPE_STRING dims: [1] } '
        'output { name: "INPUT_ID" data_type: TYPE_INT32 dims: [-1] }',
        mc.ModelConfig(),
    )
    with pytest.raises(la.UnsupportedModelError) as caught:
        detect_contract(config)
    message = caught.value.message
    assert "\n" not in message
    assert "'preprocessing'" in message and "inputs QUERY" in message and "outputs INPUT_ID" in message
    assert "C++ repository" in message and "llmapi" in message


def test_a_batch_dimension_is_refused() -> None:
    config = upstream("current")
    config.max_batch_size = 8
    with pytest.raises(la.UnsupportedModelError, match="max_batch_size 8"):
        la.read_llmapi_contract(config)


def test_the_capabilities_say_what_the_contract_lacks() -> None:
    info = la.read_llmapi_contract(upstream("current", decoupled=True)).capabilities()
    assert (info.route, info.decoupled, info.exposes_token_ids, info.native_num_sequences) == (
        "llmapi",
        True,
        False,
        False,
    )
    assert not (info.logprobs or info.guided_decoding or info.logit_bias or info.reports_token_counts)
    assert info.adds_special_tokens and info.counts_text and info.exact_stream
    assert info.repeats_prompt == (False, False)
    assert info.sampling == frozenset(
        {"max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty"}
    )
    assert "re-encoded" in info.usage_source
    assert la.read_llmapi_contract(upstream("v1.2")).variant.startswith("llmapi (no LoRA")


def _values(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], object]]:
    out: dict[str, tuple[str, list[int], object]] = {}
    pack = {"BOOL": "<?", "INT32": "<i", "UINT64": "<Q", "FP32": "<f"}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if tensor.datatype == "BYTES":
            (length,) = struct.unpack_from("<I", raw)
            value: object = raw[4 : 4 + length].decode()
        else:
            (value,) = struct.unpack(pack[tensor.datatype], raw)
        out[tensor.name] = (tensor.datatype, list(tensor.shape), value)
    return out


def _request(**params: object) -> GenerationRequest:
    sp = SamplingParams(**{"max_tokens": 64, **params})  # type: ignore[arg-type]
    return GenerationRequest("r1", "<|im_start|>user\nhi", (5, 6), sp)


@pytest.mark.parametrize("decoupled", [True, False])
def test_the_request_sends_what_the_defaults_get_wrong_with_no_batch_dimension(decoupled: bool) -> None:
    contract = la.read_llmapi_contract(upstream("current", decoupled=decoupled))
    built = la.build_llmapi_request(contract, _request(seed=5), request_id="42", seed=5)
    values = _values(built)
    assert built.model_name == "tensorrt_llm" and built.id == "42"
    assert values["text_input"] == ("BYTES", [1], "<|im_start|>user\nhi")
    assert values["sampling_param_max_tokens"] == ("INT32", [1], 64)
    assert values["sampling_param_exclude_input_from_output"] == ("BOOL", [1], True)
    assert values["return_finish_reason"] == ("BOOL", [1], True)
    assert values["return_stop_reason"] == ("BOOL", [1], True)
    assert values["streaming"] == ("BOOL", [1], decoupled)
    assert values["sampling_param_seed"] == ("UINT64", [1], 5)
    # OpenAI's sampling defaults, explicit.
    assert values["sampling_param_temperature"][2] == 1.0 and values["sampling_param_top_p"][2] == 1.0
    assert "sampling_param_stop" not in values  # the gateway matches stop strings itself
    assert [o.name for o in built.outputs] == ["text_output", "finish_reason"]


def test_temperature_zero_is_greedy() -> None:
    contract = la.read_llmapi_contract(upstream("v1.2"))
    values = _values(la.build_llmapi_request(contract, _request(temperature=0.0), request_id="1", seed=None))
    assert values["sampling_param_temperature"][2] == 0.0 and values["sampling_param_top_k"][2] == 1
    assert "sampling_param_seed" not in values and "sampling_param_top_p" not in values


def _response(text: bytes | None, reason: str | None, *, final: bool) -> service_pb2.ModelInferResponse:
    out = service_pb2.ModelInferResponse()
    for name, value in (
        ("text_output", text),
        ("finish_reason", None if reason is None else reason.encode()),
    ):
        if value is not None:
            out.outputs.add(name=name, datatype="BYTES", shape=[1])
            out.raw_output_contents.append(struct.pack("<I", len(value)) + value)
    if final:
        out.parameters["triton_final_response"].bool_param = True
    return out


def test_responses_carry_the_cumulative_text_and_a_finish_reason_at_the_end() -> None:
    first = la.parse_llmapi_response(_response(b"Hel", "None", final=False))
    assert (first.text, first.finish_reason, first.final) == (b"Hel", None, False)
    last = la.parse_llmapi_response(_response(b"Hello", "length", final=True))
    assert (last.text, last.finish_reason, last.final) == (b"Hello", "length", True)
    empty = la.parse_llmapi_response(_response(None, None, final=True))
    assert (empty.text, empty.final) == (None, True)


def test_errors_lose_the_models_prefix_and_a_too_long_prompt_is_a_400() -> None:
    long = la.llmapi_error(
        "Error generating request: The sum of prompt length (9000) and query length (0) should not exceed "
        "max_num_tokens (8192)",
        "m",
    )
    assert isinstance(long, ContextLengthExceededError) and long.code == "context_length_exceeded"
    # Not a field of every API (completions' prompt, Responses' input): named by none.
    assert long.param is None
    other = la.llmapi_error("Error generating request: CUDA out of memory", "m")
    assert isinstance(other, EngineError) and other.message == "Triton failed the request: CUDA out of memory"


def test_cached_tokens_need_the_block_size_and_come_back_as_strings() -> None:
    config = upstream("current", decoupled=True)
    assert not la.read_llmapi_contract(config).capabilities().cached_tokens
    config.parameters["tokens_per_block"].string_value = "32"
    contract = la.read_llmapi_contract(config)
    info = contract.capabilities()
    assert info.cached_tokens and info.tokens_per_block == 32
    built = la.build_llmapi_request(contract, _request(), request_id="1", seed=None)
    assert _values(built)["sampling_param_return_perf_metrics"][2] is True
    assert "kv_cache_reused_block" in [o.name for o in built.outputs]
    response = _response(b"Hi", "stop", final=True)
    response.outputs.add(name="kv_cache_reused_block", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(struct.pack("<I", 1) + b"3")
    assert la.parse_llmapi_response(response).reused_blocks == 3
