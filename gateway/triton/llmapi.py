"""The `llmapi` model's contract (TensorRT-LLM's `triton_backend/all_models/llmapi/tensorrt_llm`, a
Python model over the LLM API), read from its model config; its request tensors and responses. Pure.

Text in (`text_input`, tokenized by the LLM API, which adds BOS itself), text out: `text_output` is
the whole text so far in every streamed response, `finish_reason` a string ("None" until the end).
There is no batch dimension (`max_batch_size: 0`): every tensor has exactly its declared dims.
Inputs left out take the LLM API's defaults, some of which are wrong for a gateway (32 max tokens,
the prompt echoed), so those are always sent.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from gateway.engine import EngineInfo, GenerationRequest
from gateway.errors import (
    EngineError,
    EngineUnavailableError,
    GatewayError,
    InvalidRequestError,
)
from gateway.triton.connection import TOO_LONG, too_long_error
from gateway.triton.tensors import PACK

TEXT_INPUT = "text_input"
STREAMING = "streaming"
STOP = "stop"
SAMPLING_PREFIX = "sampling_param_"
MAX_TOKENS = "sampling_param_max_tokens"
TEMPERATURE = "sampling_param_temperature"
TOP_K = "sampling_param_top_k"
TOP_P = "sampling_param_top_p"
SEED = "sampling_param_seed"
FREQUENCY_PENALTY = "sampling_param_frequency_penalty"
PRESENCE_PENALTY = "sampling_param_presence_penalty"
EXCLUDE_INPUT = "sampling_param_exclude_input_from_output"
RETURN_PERF_METRICS = "sampling_param_return_perf_metrics"
RETURN_FINISH_REASON = "return_finish_reason"
RETURN_STOP_REASON = "return_stop_reason"
# LoRA by a path on the Triton server (all three together), and images (multimodal models).
LORA_INPUTS = ("lora_id", "lora_name", "lora_path")
IMAGE_URL = "image_url"

TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
STOP_REASON = "stop_reason"
KV_CACHE_REUSED_BLOCK = "kv_cache_reused_block"
# Not in upstream's config: the KV cache block size (model.yaml's kv_cache_config, which Triton does
# not show), as a model config parameter. Reused blocks mean nothing without it.
TOKENS_PER_BLOCK_PARAMETER = "tokens_per_block"

# The model's answer to a request it could not run, and to a cancelled one.
ERROR_PREFIX = "Error generating request: "
CANCELLED_MESSAGE = "Request cancelled by client"

# The SamplingParams fields (gateway.engine) this contract has inputs for; the request's stop
# strings are matched by the gateway, and max tokens always sent.
SAMPLING = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty"}
)

_DTYPES = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_STRING: "BYTES",
}
_U32 = struct.Struct("<I")


def is_llmapi(config: mc.ModelConfig) -> bool:
    """Whether a model config is the llmapi model's, whatever it is named: a Python model taking
    `text_input` and `sampling_param_*` inputs and returning `text_output`."""
    inputs = {i.name for i in config.input}
    return (
        config.backend == "python"
        and TEXT_INPUT in inputs
        and any(name.startswith(SAMPLING_PREFIX) for name in inputs)
        and any(o.name == TEXT_OUTPUT for o in config.output)
    )


def declares(config: mc.ModelConfig) -> str:
    """A model config's interface in a few words, for the one-line start-up error."""
    backend = config.backend or config.platform or ("ensemble" if config.ensemble_scheduling.step else "?")
    inputs = ", ".join(i.name for i in config.input) or "none"
    outputs = ", ".join(o.name for o in config.output) or "none"
    return f"backend {backend}, inputs {inputs}; outputs {outputs}"


@dataclass(frozen=True, slots=True)
class LlmapiContract:
    model: str
    decoupled: bool
    # Input name -> its Triton dtype ("BYTES", "INT32", ...), as the model declares it.
    inputs: dict[str, str]
    outputs: frozenset[str]
    # The KV cache block size, where the config's parameters give it.
    tokens_per_block: int | None = None

    @property
    def reports_cached_tokens(self) -> bool:
        """Whether responses can say how many prompt tokens came from the KV cache: perf metrics
        can be asked for, the reused blocks come back, and the block size is known."""
        return (
            RETURN_PERF_METRICS in self.inputs
            and KV_CACHE_REUSED_BLOCK in self.outputs
            and self.tokens_per_block is not None
        )

    @property
    def lora(self) -> bool:
        return all(name in self.inputs for name in LORA_INPUTS)

    @property
    def images(self) -> bool:
        return IMAGE_URL in self.inputs

    @property
    def variant(self) -> str:
        # LoRA inputs came with the model.py that streams per step (TensorRT-LLM 1.3); 1.2.x's
        # config has neither, and its model.py answers a stream in one response.
        return "llmapi" if self.lora else "llmapi (no LoRA inputs: 1.2.x or older)"

    @property
    def excludes_input(self) -> bool:
        return EXCLUDE_INPUT in self.inputs

    def streams(self) -> bool:
        """Whether requests are sent with `streaming` true: whenever the model is decoupled, so a
        stop string found by the gateway ends the request at once (a non-decoupled model refuses
        it)."""
        return self.decoupled and STREAMING in self.inputs

    def capabilities(self, *, vision: bool = False) -> EngineInfo:
        """`vision`: the served checkpoint has a vision tower (images are then taken where the
        config declares `image_url`)."""
        names = frozenset(self.inputs)
        excluded = self.excludes_input
        return EngineInfo(
            model=self.model,
            exposes_token_ids=False,
            native_num_sequences=False,
            reports_token_counts=False,
            variant=self.variant,
            decoupled=self.decoupled,
            # A whole result that repeats the prompt is cut by its decoded ids.
            needs_prompt_ids=not excluded,
            repeats_prompt=(not excluded, not excluded),
            inputs=names,
            outputs=self.outputs,
            route="llmapi",
            route_reason=(
                f"{self.model} is TensorRT-LLM's llmapi model (text in, cumulative text out): the gateway "
                "renders chat templates, matches stop strings and counts tokens itself"
            ),
            exact_stream=True,
            cached_tokens=self.reports_cached_tokens,
            tokens_per_block=self.tokens_per_block,
            usage_source="prompt: tokenizer; completion: text re-encoded",
            adds_special_tokens=True,
            counts_text=True,
            sampling=frozenset(
                name for name in SAMPLING if name == "max_tokens" or SAMPLING_PREFIX + name in self.inputs
            ),
            lora=self.lora,
            lora_by_server_path=self.lora,
            images=self.images and vision,
            images_as_question=self.images and vision,
        )


class UnsupportedModelError(GatewayError):
    """A Triton model that speaks none of the contracts the gateway knows."""


def read_llmapi_contract(config: mc.ModelConfig) -> LlmapiContract:
    if not is_llmapi(config):
        raise UnsupportedModelError(f"model {config.name!r} is not an llmapi model ({declares(config)})")
    if config.max_batch_size > 0:
        # The model reads element 0 of a 1-D text_input; a batch dimension would make it 2-D.
        raise UnsupportedModelError(
            f"model {config.name!r}: the llmapi model takes no batch dimension, but its config sets "
            f"max_batch_size {config.max_batch_size} (set it to 0)"
        )
    block = (
        config.parameters[TOKENS_PER_BLOCK_PARAMETER].string_value.strip()
        if (TOKENS_PER_BLOCK_PARAMETER in config.parameters)
        else ""
    )
    return LlmapiContract(
        model=config.name,
        decoupled=bool(config.model_transaction_policy.decoupled),
        inputs={i.name: _DTYPES.get(i.data_type, "BYTES") for i in config.input},
        outputs=frozenset(o.name for o in config.output),
        tokens_per_block=int(block) if block.isdigit() and int(block) > 0 else None,
    )


def _scalar(out: service_pb2.ModelInferRequest, name: str, dtype: str, value: Any) -> None:
    out.inputs.append(service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=dtype, shape=[1]))
    out.raw_input_contents.append(PACK[dtype](value))


def _strings(out: service_pb2.ModelInferRequest, name: str, values: list[str]) -> None:
    encoded = [v.encode() for v in values]
    out.inputs.append(
        service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="BYTES", shape=[len(encoded)])
    )
    out.raw_input_contents.append(b"".join(_U32.pack(len(e)) + e for e in encoded))


def input_values(contract: LlmapiContract, request: GenerationRequest, *, seed: int | None) -> dict[str, Any]:
    """The scalar inputs of one request, by input name (only those the model declares): OpenAI's
    sampling defaults and what the LLM API's defaults get wrong, always explicit. The one place a
    GenerationRequest becomes llmapi inputs (LoRA and images belong here too)."""
    p = request.params
    values: dict[str, Any] = {
        STREAMING: contract.streams(),
        MAX_TOKENS: p.max_tokens,
        EXCLUDE_INPUT: True,
        RETURN_FINISH_REASON: True,
        RETURN_STOP_REASON: True,
    }
    if p.temperature is not None and p.temperature == 0:
        values[TEMPERATURE] = 0.0
        values[TOP_K] = 1
    else:
        values[TEMPERATURE] = 1.0 if p.temperature is None else p.temperature
        values[TOP_P] = 1.0 if p.top_p is None else p.top_p
        if p.top_k is not None:
            values[TOP_K] = p.top_k
    if seed is not None:
        values[SEED] = seed
    if p.presence_penalty is not None:
        values[PRESENCE_PENALTY] = p.presence_penalty
    if p.frequency_penalty is not None:
        values[FREQUENCY_PENALTY] = p.frequency_penalty
    if contract.reports_cached_tokens:
        values[RETURN_PERF_METRICS] = True
    return {name: value for name, value in values.items() if name in contract.inputs}


def image_question(contract: LlmapiContract, request: GenerationRequest) -> str:
    """The `text_input` of a request with images. With images the model renders the chat template
    itself, around one user message made of the images' placeholders and this text; a conversation
    that is not one question (`GenerationRequest.question`) cannot be sent without dropping or
    moving part of it, so it is refused."""
    if not contract.images:
        raise InvalidRequestError(f"model {contract.model!r} takes no images", param="messages")
    if request.question is None:
        raise InvalidRequestError(
            "this model renders its chat template itself around one question and its images, so an "
            "image request must be a single user message whose images come before its text (no "
            "system prompt, earlier turns, tools or text before an image)",
            param="messages",
        )
    return request.question


def build_llmapi_request(
    contract: LlmapiContract, request: GenerationRequest, *, request_id: str, seed: int | None
) -> service_pb2.ModelInferRequest:
    """The ModelInferRequest for one sequence of `request` (n is several requests)."""
    out = service_pb2.ModelInferRequest(model_name=contract.model, id=request_id)
    # A decoupled model then ends every request with a response flagged final.
    out.parameters["triton_enable_empty_final_response"].bool_param = True
    if request.images:
        _strings(out, TEXT_INPUT, [image_question(contract, request)])
        _strings(out, IMAGE_URL, [image.data_uri() for image in request.images])
    else:
        _strings(out, TEXT_INPUT, [request.prompt_text])
    for name, value in input_values(contract, request, seed=seed).items():
        _scalar(out, name, contract.inputs[name], value)
    lora = request.lora
    if lora is not None and contract.lora and lora.server_path is not None:
        # The model loads the adapter from the path itself (again after evicting it); the id is the
        # gateway's content-derived task id, the same on every replica.
        lora_id, lora_name, lora_path = LORA_INPUTS
        _scalar(out, lora_id, contract.inputs[lora_id], lora.task_id)
        _strings(out, lora_name, [lora.name])
        _strings(out, lora_path, [lora.server_path])
    wanted = [TEXT_OUTPUT, FINISH_REASON]
    if contract.reports_cached_tokens:
        wanted.append(KV_CACHE_REUSED_BLOCK)
    for name in wanted:
        if name in contract.outputs:
            out.outputs.add().name = name
    return out


@dataclass(slots=True)
class LlmapiResponse:
    # The whole text so far (None: the response has none, e.g. an empty final response).
    text: bytes | None
    # "stop", "length", ... once finished; None before (the model sends "None").
    finish_reason: str | None
    final: bool
    # KV cache blocks of the prompt the engine reused, when perf metrics were asked for.
    reused_blocks: int | None = None


def _elements(raw: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + 4 <= len(raw):
        (length,) = _U32.unpack_from(raw, pos)
        pos += 4
        out.append(raw[pos : pos + length])
        pos += length
    return out


def parse_llmapi_response(response: service_pb2.ModelInferResponse) -> LlmapiResponse:
    params = response.parameters
    final = "triton_final_response" in params and params["triton_final_response"].bool_param
    text: bytes | None = None
    reason: str | None = None
    reused: int | None = None
    raw_contents = response.raw_output_contents
    for pos, output in enumerate(response.outputs):
        if pos >= len(raw_contents):
            break
        if output.name == KV_CACHE_REUSED_BLOCK:
            reused = _count(output.datatype, raw_contents[pos])
            continue
        elements = _elements(raw_contents[pos])
        if output.name == TEXT_OUTPUT:
            # One element per output sequence; the gateway asks for one.
            text = elements[0] if elements else b""
        elif output.name == FINISH_REASON and elements:
            value = elements[0].decode("utf-8", "replace")
            reason = None if value in ("", "None") else value
    return LlmapiResponse(text, reason, final, reused)


def _count(datatype: str, raw: bytes) -> int | None:
    # The model sends its perf outputs as strings whatever the config declares; read either.
    if datatype == "BYTES":
        elements = _elements(raw)
        text = elements[0].decode("ascii", "replace").strip() if elements else ""
        return int(text) if text.isdigit() else None
    return int.from_bytes(raw[:4], "little", signed=True) if len(raw) >= 4 else None


def llmapi_error(message: str, model: str) -> GatewayError:
    """The model's error (INTERNAL, `Error generating request: ...`) as the gateway's error."""
    detail = message.split(ERROR_PREFIX, 1)[1] if ERROR_PREFIX in message else message
    if TOO_LONG.search(detail):
        return too_long_error(detail)
    lowered = message.lower()
    if "unknown model" in lowered or "not ready" in lowered:
        return EngineUnavailableError(f"model {model!r} is not available in Triton: {message}")
    return EngineError(f"Triton failed the request: {detail}")
