"""Images on both Triton contracts: the multimodal ensemble read from its config (the CPU stand-in's,
rendered) and its `image_url_input`; the llmapi model's `image_url` with the question it renders its
template around."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from deploy.model_repo import render_text, resolve_variables
from deploy.multimodal_repo import MULTIMODAL_TEMPLATES
from gateway.engine import GenerationRequest, ImageInput, SamplingParams
from gateway.errors import InvalidRequestError
from gateway.triton import contract as c
from gateway.triton import llmapi as la
from gateway.triton.tensors import build_request, json_request_fits
from tests.unit.gateway.triton.test_llmapi import upstream
from tests.unit.gateway.triton.test_translation import CURRENT as TEXT_ENSEMBLE

PNG = ImageInput(b"\x89PNG\r\n\x1a\nfake", "image/png", 2, 3, "data")
JPEG = ImageInput(b"\xff\xd8\xff\xe0fake", "image/jpeg", 4, 5, "data")


def _multimodal(dims: str = "-1") -> mc.ModelConfig:
    values = resolve_variables("cpu", "current", {"tokenizer_dir": "/m", "model_dir": "/m"})
    text = render_text((MULTIMODAL_TEMPLATES / "ensemble" / "config.pbtxt").read_text(), values)
    if dims != "-1":
        # TensorRT-LLM up to v0.19 declares one URL a request.
        text = text.replace(
            'name: "image_url_input"\n    data_type: TYPE_STRING\n    dims: [ -1 ]',
            'name: "image_url_input"\n    data_type: TYPE_STRING\n    dims: [ 1 ]',
        )
    return text_format.Parse(text, mc.ModelConfig())


def _request(*images: ImageInput, question: str | None = "What is it?") -> GenerationRequest:
    return GenerationRequest(
        "r1",
        "<start_of_turn>user\n<start_of_image>What is it?",
        (1, 2),
        SamplingParams(max_tokens=4),
        images=images,
        question=question,
    )


def _strings(request: service_pb2.ModelInferRequest, name: str) -> tuple[list[int], list[str]]:
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if tensor.name == name:
            out, pos = [], 0
            while pos < len(raw):
                (length,) = struct.unpack_from("<I", raw, pos)
                out.append(raw[pos + 4 : pos + 4 + length].decode())
                pos += 4 + length
            return list(tensor.shape), out
    raise AssertionError(f"no input {name}")


def test_the_multimodal_ensemble_takes_images_and_a_text_ensemble_does_not() -> None:
    config = _multimodal()
    assert c.is_multimodal(config)
    contract = c.read_contract(config, "ensemble")
    info = contract.capabilities()
    assert info.images and contract.images_per_request is None
    # No token counts on this ensemble: usage says how its prompt is counted.
    assert info.usage_source.startswith("prompt: tokenizer, images expanded")
    text = c.read_contract(text_format.Parse(TEXT_ENSEMBLE, mc.ModelConfig()), "ensemble")
    assert not text.capabilities().images
    assert not c.is_multimodal(text_format.Parse(TEXT_ENSEMBLE, mc.ModelConfig()))


def test_images_go_as_data_uris_the_preprocessing_decodes_itself_with_their_own_bytes() -> None:
    contract = c.read_contract(_multimodal(), "ensemble")
    built = build_request(
        contract, _request(PNG, JPEG), request_id="1", seed=None, num_sequences=1, stream=True
    )
    shape, urls = _strings(built, "image_url_input")
    assert shape == [1, 2]
    # TensorRT-LLM's preprocessing fetches any URL but this prefix itself: never a URL, only
    # the bytes the client sent (PIL reads their format from them).
    assert [base64.b64decode(u.removeprefix("data:image/jpeg;base64,")) for u in urls] == [
        PNG.data,
        JPEG.data,
    ]
    assert all(u.startswith("data:image/jpeg;base64,") for u in urls)
    # Megabytes of base64 go as a binary gRPC tensor, not in a JSON body.
    assert not json_request_fits(contract, _request(PNG))


def test_a_repository_that_takes_one_image_refuses_two_naming_the_limit() -> None:
    contract = c.read_contract(_multimodal("1"), "ensemble")
    assert contract.images_per_request == 1
    built = build_request(contract, _request(PNG), request_id="1", seed=None, num_sequences=1, stream=True)
    assert _strings(built, "image_url_input")[0] == [1, 1]
    with pytest.raises(InvalidRequestError, match="1 image per request"):
        build_request(contract, _request(PNG, JPEG), request_id="1", seed=None, num_sequences=1, stream=True)


def test_llmapi_sends_the_question_and_the_images_as_data_uris() -> None:
    contract = la.read_llmapi_contract(upstream("current", decoupled=True))
    assert contract.capabilities(vision=True).images
    # image_url is declared whether or not model.yaml turns images on: a text checkpoint takes none.
    assert not contract.capabilities(vision=False).images
    built = la.build_llmapi_request(contract, _request(PNG, JPEG), request_id="1", seed=None)
    assert _strings(built, "text_input")[1] == ["What is it?"]
    assert _strings(built, "image_url")[1] == [PNG.data_uri(), JPEG.data_uri()]
    plain = la.build_llmapi_request(contract, _request(), request_id="1", seed=None)
    assert _strings(plain, "text_input")[1] == ["<start_of_turn>user\n<start_of_image>What is it?"]


def test_llmapi_refuses_a_conversation_that_is_not_one_question() -> None:
    contract = la.read_llmapi_contract(upstream("current", decoupled=True))
    with pytest.raises(InvalidRequestError, match="one question"):
        la.build_llmapi_request(contract, _request(PNG, question=None), request_id="1", seed=None)
    # 1.2.x declares no image_url.
    old = la.read_llmapi_contract(upstream("v1.2", decoupled=True))
    with pytest.raises(InvalidRequestError, match="takes no images"):
        la.build_llmapi_request(old, _request(PNG), request_id="1", seed=None)


def test_the_stand_in_templates_exist() -> None:
    assert Path(MULTIMODAL_TEMPLATES / "multimodal_encoders" / "1" / "model.py").is_file()
