"""The encoder layouts read from model configs: ONNX and TensorRT exports of sentence-transformers and
optimum models, a text-in Python model, and configs that are no encoder."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from deploy.encoder_repo import encoder_config, text_encoder_config
from gateway.triton.encoder import EncoderContractError, read_encoder_info


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


OPTIMUM_ONNX = """
name: "bge" platform: "onnxruntime_onnx" max_batch_size: 16
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] },
         { name: "pooler_output" data_type: TYPE_FP32 dims: [ 384 ] } ]
"""
ST_ONNX_UNBATCHED = """
name: "minilm" platform: "onnxruntime_onnx" max_batch_size: 0
input [ { name: "input_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
        { name: "attention_mask" data_type: TYPE_INT32 dims: [ -1, -1 ] } ]
output [ { name: "token_embeddings" data_type: TYPE_FP32 dims: [ -1, -1, 384 ] },
         { name: "sentence_embedding" data_type: TYPE_FP32 dims: [ -1, 384 ] } ]
"""
TRT_FIXED = """
name: "e5" platform: "tensorrt_plan" max_batch_size: 8
input [ { name: "input_ids" data_type: TYPE_INT32 dims: [ 512 ] },
        { name: "attention_mask" data_type: TYPE_INT32 dims: [ 512 ] } ]
output [ { name: "embeddings" data_type: TYPE_FP16 dims: [ 1024 ] } ]
"""


def test_optimum_export_is_pooled_in_the_gateway_not_by_berts_pooler() -> None:
    info = read_encoder_info(_config(OPTIMUM_ONNX))
    assert (info.takes, info.returns, info.output_name) == ("ids", "tokens", "last_hidden_state")
    assert (info.max_batch_size, info.width, info.token_types) == (16, 384, True)


def test_sentence_transformers_export_without_batching_returns_its_sentence_embedding() -> None:
    info = read_encoder_info(_config(ST_ONNX_UNBATCHED))
    assert (info.returns, info.output_name, info.width, info.token_types) == (
        "pooled",
        "sentence_embedding",
        384,
        False,
    )
    assert read_encoder_info(_config(ST_ONNX_UNBATCHED), "token_embeddings").returns == "tokens"


def test_tensorrt_engine_with_a_fixed_length_bounds_the_input() -> None:
    info = read_encoder_info(_config(TRT_FIXED))
    assert (info.returns, info.max_length, info.width) == ("pooled", 512, 1024)


def test_the_rendered_repositories_read_as_what_they_serve(tmp_path: object) -> None:
    embed = read_encoder_info(_config(encoder_config("e", task="embed", backend="onnxruntime", width=32)))
    assert (embed.returns, embed.output_name) == ("tokens", "last_hidden_state")
    score = read_encoder_info(_config(encoder_config("r", task="score", backend="tensorrt", width=1)))
    assert (score.returns, score.output_name, score.width) == ("pooled", "logits", 1)
    text = read_encoder_info(_config(text_encoder_config("t", width=32, model_dir=tmp_path)))  # type: ignore[arg-type]
    assert (text.takes, text.input_name, text.output_name) == ("text", "text_input", "embedding")


@pytest.mark.parametrize(
    "config",
    [
        # A generator: no encoder inputs.
        'name: "g" max_batch_size: 1 input [ { name: "text_input" data_type: TYPE_STRING dims: [1] },'
        ' { name: "max_tokens" data_type: TYPE_INT32 dims: [1] } ] output [ { name: "text_output" '
        "data_type: TYPE_STRING dims: [-1] } ]",
        # ids without a mask.
        'name: "n" max_batch_size: 4 input [ { name: "input_ids" data_type: TYPE_INT64 dims: [-1] } ]'
        ' output [ { name: "x" data_type: TYPE_FP32 dims: [8] } ]',
        # float ids.
        'name: "f" max_batch_size: 4 input [ { name: "input_ids" data_type: TYPE_FP32 dims: [-1] },'
        ' { name: "attention_mask" data_type: TYPE_INT64 dims: [-1] } ] output [ { name: "x" '
        "data_type: TYPE_FP32 dims: [8] } ]",
        # two pooled outputs: which is the embedding?
        'name: "two" max_batch_size: 4 input [ { name: "input_ids" data_type: TYPE_INT64 dims: [-1] },'
        ' { name: "attention_mask" data_type: TYPE_INT64 dims: [-1] } ] output [ { name: "a" '
        'data_type: TYPE_FP32 dims: [8] }, { name: "b" data_type: TYPE_FP32 dims: [8] } ]',
    ],
)
def test_configs_that_are_no_encoder_layout_are_refused_with_what_they_declare(config: str) -> None:
    with pytest.raises(EncoderContractError) as caught:
        read_encoder_info(_config(config))
    assert "inputs" in caught.value.message or "outputs" in caught.value.message
