"""Building request tensors and reading response tensors of the TensorRT-LLM ensemble.

Reading avoids tritonclient's `InferResult.as_numpy` on the hot path: it scans all outputs per
call and allocates arrays; a streamed token needs a handful of bytes read once.
"""

from __future__ import annotations

import base64
import functools
import struct
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from gateway.engine import GenerationRequest, LoraTensors, TokenLogprob
from gateway.errors import InvalidRequestError
from gateway.lora import cast_weights, config_columns
from gateway.text.ids import int32_array, json_ids
from gateway.triton import contract as c
from gateway.triton.logits import decode_logits, scored_tokens

_U32 = struct.Struct("<I")


@functools.lru_cache(maxsize=1024)
def _header(name: str, dtype: str, shape: tuple[int, ...]) -> service_pb2.ModelInferRequest.InferInputTensor:
    # Appending a finished header copies it in C: half the cost of setting its fields from Python,
    # for each of the dozen tensors of every request.
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=dtype, shape=shape)


def _tensor(
    request: service_pb2.ModelInferRequest, name: str, dtype: str, shape: Sequence[int], raw: bytes
) -> None:
    request.inputs.append(_header(name, dtype, tuple(shape)))
    request.raw_input_contents.append(raw)


# Little-endian packing of one value, as numpy's tobytes gives it, at a tenth of the cost.
PACK = {
    "BOOL": struct.Struct("<?").pack,
    "INT32": struct.Struct("<i").pack,
    "INT64": struct.Struct("<q").pack,
    "UINT64": struct.Struct("<Q").pack,
    "FP32": struct.Struct("<f").pack,
}


def _numpy_bytes(spec: c.TensorSpec, value: Any) -> bytes:
    return np.array([[value]], dtype=spec.np_dtype).tobytes()


def _scalar(request: service_pb2.ModelInferRequest, spec: c.TensorSpec, value: Any) -> None:
    pack = PACK.get(spec.triton_dtype)
    try:
        raw = pack(value) if pack is not None else _numpy_bytes(spec, value)
    except (struct.error, OverflowError):
        # Out of the type's range: numpy's conversion (wrapping, or inf), as before.
        raw = _numpy_bytes(spec, value)
    _tensor(request, spec.name, spec.triton_dtype, (1, 1), raw)


def _strings(request: service_pb2.ModelInferRequest, spec: c.TensorSpec, values: Iterable[str]) -> None:
    encoded = [v.encode() for v in values]
    raw = b"".join(_U32.pack(len(e)) + e for e in encoded)
    _tensor(request, spec.name, "BYTES", [1, len(encoded)], raw)


def sampling_values(request: GenerationRequest) -> dict[str, Any]:
    """OpenAI sampling semantics in TensorRT-LLM terms (pure; names are ensemble input names).

    TensorRT-LLM samples greedily unless top_k or top_p is set, and 0 is its default seed, so the
    OpenAI defaults (temperature 1, nucleus 1, a fresh seed) are sent explicitly.
    """
    p = request.params
    values: dict[str, Any] = {c.MAX_TOKENS: p.max_tokens}
    if p.temperature is not None and p.temperature == 0:
        values[c.TOP_K] = 1
    else:
        values[c.TEMPERATURE] = 1.0 if p.temperature is None else p.temperature
        if p.top_k is not None:
            values[c.TOP_K] = p.top_k
        values[c.TOP_P] = 1.0 if p.top_p is None else p.top_p
    optional = {
        c.PRESENCE_PENALTY: p.presence_penalty,
        c.FREQUENCY_PENALTY: p.frequency_penalty,
        c.REPETITION_PENALTY: p.repetition_penalty,
        c.LENGTH_PENALTY: p.length_penalty,
    }
    values.update({k: v for k, v in optional.items() if v is not None})
    if p.ignore_eos:
        # No id ever equals -1: the engine runs to max_tokens (TensorRT-LLM's own benchmark trick).
        values[c.END_ID] = -1
    else:
        if request.end_id is not None:
            values[c.END_ID] = request.end_id
    if request.pad_id is not None:
        values[c.PAD_ID] = request.pad_id
    return values


def engine_priority(priority: int) -> float:
    """The gateway's priority (vLLM's: any integer, lower is more urgent, 0 the default) as
    TensorRT-LLM's executor takes one (`Request::setPriority`: 0.0 to 1.0, higher is more urgent,
    0.5 the default): 0 -> 0.5, -10 -> 0.75, 10 -> 0.25, strictly monotonic, never past the ends."""
    return 0.5 - priority / (2 * (abs(priority) + 10))


def _stop_rows(words: list[list[int]]) -> tuple[list[int], list[int]]:
    """TensorRT-LLM's stop list rows: row 0 the concatenated ids, row 1 each word's end offset,
    padded with -1."""
    flat = [t for w in words for t in w]
    offsets, end = [], 0
    for w in words:
        end += len(w)
        offsets.append(end)
    offsets += [-1] * (len(flat) - len(offsets))
    return flat, offsets


def _stop_words_list(
    request: service_pb2.ModelInferRequest, spec: c.TensorSpec, words: list[list[int]]
) -> None:
    """The [1, 2, N] stop list tensor."""
    flat, offsets = _stop_rows(words)
    data = np.array([[flat, offsets]], dtype=np.int32)
    _tensor(request, spec.name, spec.triton_dtype, list(data.shape), data.tobytes())


def _scalar_values(
    contract: c.Contract, request: GenerationRequest, *, seed: int | None, num_sequences: int, stream: bool
) -> tuple[dict[str, Any], list[str]]:
    """The scalar inputs (by contract name) and the outputs to ask for, whatever the transport."""
    p = request.params
    values = sampling_values(request)
    values[c.STREAM] = stream
    if seed is not None:
        values[c.SEED] = seed
    if p.min_tokens:
        values[c.MIN_TOKENS] = p.min_tokens
    if num_sequences > 1:
        values[c.NUM_RETURN_SEQUENCES] = num_sequences
    values[c.EXCLUDE_INPUT_IN_OUTPUT] = True
    if contract.priority:
        values[c.PRIORITY] = engine_priority(request.priority)
    outputs = requested_outputs(contract, num_sequences=num_sequences, stream=stream)
    if c.NUM_OUTPUT_TOKENS in outputs:
        values[c.RETURN_NUM_OUTPUT_TOKENS] = True
    if contract.reports_cached_tokens:
        values[c.RETURN_PERF_METRICS] = True
        outputs.append(c.KV_CACHE_REUSED_BLOCKS)
    if c.OUTPUT_LOG_PROBS in outputs:
        values[c.RETURN_LOG_PROBS] = True
    if request.logprobs is not None and contract.logprobs:
        values[c.RETURN_LOG_PROBS] = True
        outputs.append(c.OUTPUT_LOG_PROBS)
        if request.logprobs > 0 and contract.top_logprobs:
            values[c.RETURN_GENERATION_LOGITS] = True
            outputs.append(c.GENERATION_LOGITS)
    if request.prompt_logprobs is not None and contract.prompt_logprobs:
        values[c.RETURN_CONTEXT_LOGITS] = True
        outputs.append(c.CONTEXT_LOGITS)
    return values, outputs


def _end_words(contract: c.Contract, request: GenerationRequest) -> tuple[list[list[int]], list[str]]:
    """What the stop-words input carries: end ids on the engine route, their strings on the
    ensemble's (nothing when the model has no such input or the request ignores the end)."""
    if request.params.ignore_eos or c.STOP_WORDS not in contract.inputs:
        return [], []
    if contract.route == "engine":
        return [[t] for t in request.end_token_ids], []
    return [], list(request.end_token_strings)


def build_request(
    contract: c.Contract,
    request: GenerationRequest,
    *,
    request_id: str,
    seed: int | None,
    num_sequences: int,
    stream: bool,
    lora: LoraTensors | None = None,
) -> service_pb2.ModelInferRequest:
    """The ModelInferRequest for the contract's route, with only the inputs the model declares.
    A LoRA request sends its task id, and its weights only when `lora` gives them (the backend
    asked for them: it does not hold the adapter)."""
    out = service_pb2.ModelInferRequest(model_name=contract.model, id=request_id)
    # Decoupled models then end every request with an empty response flagged final, so the
    # stream's end is explicit even when the engine sent its last token without the flag.
    out.parameters["triton_enable_empty_final_response"].bool_param = True
    specs = contract.inputs
    if contract.route == "engine":
        ids = int32_array(request.prompt_ids)
        _tensor(out, specs[c.PROMPT].name, "INT32", [1, len(ids)], ids.tobytes())
        _scalar(out, specs[c.PROMPT_LENGTH], len(request.prompt_ids))
    else:
        _strings(out, specs[c.PROMPT], [request.prompt_text])
    values, outputs = _scalar_values(contract, request, seed=seed, num_sequences=num_sequences, stream=stream)
    for name, value in values.items():
        spec = specs.get(name)
        if spec is not None:
            _scalar(out, spec, value)
    if request.logit_bias and contract.logit_bias:
        bias = np.zeros((1, request.vocab_size), dtype=np.float32)
        for token, value in request.logit_bias:
            bias[0, token] = value
        _tensor(out, specs[c.EMBEDDING_BIAS].name, "FP32", list(bias.shape), bias.tobytes())
    if request.guide is not None and contract.guided_decoding:
        guide_type, guide = request.guide
        _strings(out, specs[c.GUIDE_TYPE], [guide_type])
        _strings(out, specs[c.GUIDE], [guide])
    end_ids, end_strings = _end_words(contract, request)
    if end_ids:
        _stop_words_list(out, specs[c.STOP_WORDS], end_ids)
    elif end_strings:
        _strings(out, specs[c.STOP_WORDS], end_strings)
    if request.lora is not None and contract.lora:
        _lora(out, contract, request.lora.task_id if lora is None else lora.task_id, lora)
    if request.images:
        _images(out, contract, request)
    for name in outputs:
        out.outputs.add().name = name
    return out


# The only data: URI prefix TensorRT-LLM's multimodal preprocessing decodes itself (any other URL
# it fetches with `requests`: the gateway fetches, never Triton). PIL reads the image's format from
# its bytes, so a PNG, WebP or GIF under this prefix is decoded as itself, losslessly.
TRTLLM_DATA_URI_PREFIX = "data:image/jpeg;base64,"


def image_urls(contract: c.Contract, request: GenerationRequest) -> list[str]:
    """The request's images as the multimodal ensemble's `image_url_input` takes them, or an
    InvalidRequestError where the model cannot take them."""
    if not contract.images:
        raise InvalidRequestError(f"model {contract.model!r} takes no images", param="messages")
    limit = contract.images_per_request
    if limit is not None and len(request.images) > limit:
        raise InvalidRequestError(
            f"this model's multimodal repository takes {limit} image per request (its image_url_input "
            f"is declared with dims [1]); the request has {len(request.images)}",
            param="messages",
        )
    return [TRTLLM_DATA_URI_PREFIX + base64.b64encode(image.data).decode("ascii") for image in request.images]


def _images(out: service_pb2.ModelInferRequest, contract: c.Contract, request: GenerationRequest) -> None:
    _strings(out, contract.inputs[c.IMAGE_URLS], image_urls(contract, request))


def _lora(
    out: service_pb2.ModelInferRequest, contract: c.Contract, task_id: int, tensors: LoraTensors | None
) -> None:
    specs = contract.inputs
    _scalar(out, specs[c.LORA_TASK_ID], task_id)
    if tensors is None:
        return
    weights_spec = specs[c.LORA_WEIGHTS]
    raw, dtype = cast_weights(tensors.weights, weights_spec.triton_dtype)
    rows, width = tensors.weights.shape
    _tensor(out, weights_spec.name, dtype, (1, rows, width), raw)
    config = config_columns(tensors.config, contract.lora_config_width)
    _tensor(out, specs[c.LORA_CONFIG].name, "INT32", (1, *config.shape), config.astype(np.int32).tobytes())


# Python's type for each Triton dtype in a JSON body: Triton's parser refuses 1 for an FP32.
_JSON_TYPE: dict[str, type] = {
    "BOOL": bool,
    "INT8": int,
    "INT16": int,
    "INT32": int,
    "INT64": int,
    "UINT8": int,
    "UINT16": int,
    "UINT32": int,
    "UINT64": int,
    "FP16": float,
    "FP32": float,
    "FP64": float,
}


def json_request_fits(contract: c.Contract, request: GenerationRequest) -> bool:
    """Whether Triton's HTTP generate_stream carries this request: not generation or context logits
    (top or prompt log probabilities) nor a vocabulary-wide bias, which binary gRPC tensors carry
    far more cheaply, nor a LoRA adapter (its weights, when the backend asks for them, are binary
    tensors too), nor images (megabytes of base64 text, which a binary gRPC tensor carries as they
    are)."""
    if request.lora is not None or request.images:
        return False
    if request.logprobs is not None and request.logprobs > 0 and contract.top_logprobs:
        return False
    if request.prompt_logprobs is not None and contract.prompt_logprobs:
        return False
    return not (request.logit_bias and contract.logit_bias)


def build_json_request(
    contract: c.Contract,
    request: GenerationRequest,
    *,
    request_id: str,
    seed: int | None,
    num_sequences: int,
    stream: bool,
) -> dict[str, Any]:
    """The same request as `build_request`, as the JSON body of Triton's HTTP generate extension:
    each input by its tensor name (scalars bare, [-1] tensors as flat lists, [2,-1] ones row after
    row); Triton returns every output, so none are named."""
    specs = contract.inputs
    body: dict[str, Any] = {"id": request_id}
    if contract.route == "engine":
        # (TokenIds as their array: the HTTP client writes it with OPT_SERIALIZE_NUMPY.)
        body[specs[c.PROMPT].name] = json_ids(request.prompt_ids)
        body[specs[c.PROMPT_LENGTH].name] = len(request.prompt_ids)
    else:
        body[specs[c.PROMPT].name] = request.prompt_text
    values, _ = _scalar_values(contract, request, seed=seed, num_sequences=num_sequences, stream=stream)
    for name, value in values.items():
        spec = specs.get(name)
        if spec is not None:
            body[spec.name] = _JSON_TYPE.get(spec.triton_dtype, _same)(value)
    if request.guide is not None and contract.guided_decoding:
        guide_type, guide = request.guide
        body[specs[c.GUIDE_TYPE].name] = guide_type
        body[specs[c.GUIDE].name] = guide
    end_ids, end_strings = _end_words(contract, request)
    if end_ids:
        flat, offsets = _stop_rows(end_ids)
        body[specs[c.STOP_WORDS].name] = flat + offsets
    elif end_strings:
        body[specs[c.STOP_WORDS].name] = end_strings
    return body


def _same(value: Any) -> Any:
    return value


def requested_outputs(contract: c.Contract, *, num_sequences: int = 1, stream: bool = True) -> list[str]:
    """The fewest outputs that carry what the gateway needs: every tensor asked for is built,
    sent and parsed again for every streamed token.

    With token ids the gateway counts tokens itself and knows the prompt length, so the engine's
    counts are only asked for from text-only ensembles. A streamed response holds exactly its
    new tokens; only a whole (non-streamed) result needs `sequence_length` to cut padding.
    """
    if contract.exposes_token_ids:
        wanted = [c.OUTPUT_IDS]
        if not stream:
            wanted.append(c.SEQUENCE_LENGTH)
        if contract.route == "ensemble":
            # A decoupled ensemble only answers when an output of its last step (postprocessing's
            # text_output) is asked for: asking for the engine's tensors alone gets no responses.
            wanted.append(c.TEXT_OUTPUT)
    else:
        wanted = [c.TEXT_OUTPUT]
        if contract.reports_token_counts:
            wanted.append(c.NUM_OUTPUT_TOKENS)
        elif not stream and contract.counts_by_log_probs:
            # A whole result's token count, where the model has no num_output_tokens (up to v0.19).
            wanted.append(c.OUTPUT_LOG_PROBS)
    if num_sequences > 1:
        wanted.append(c.SEQUENCE_INDEX)
    return [n for n in wanted if n in contract.outputs]


def cancel_request(model: str, request_id: str) -> service_pb2.ModelInferRequest:
    """A `stop` request for the engine model: stops the in-flight request with the same id.

    Triton does not pass a cancelled ensemble call on to the composing models, so the engine
    would otherwise keep generating for a client that is gone; the TensorRT-LLM backend (and our
    CPU engine) stop a request when a request with its id arrives with stop=true.
    """
    out = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    one = np.array([[1]], dtype=np.int32).tobytes()
    _tensor(out, "input_ids", "INT32", [1, 1], one)
    _tensor(out, "input_lengths", "INT32", [1, 1], one)
    _tensor(out, "request_output_len", "INT32", [1, 1], one)
    _tensor(out, "stop", "BOOL", [1, 1], np.array([[True]]).tobytes())
    return out


# Not frozen, like GenerationDelta: one per streamed token, and frozen dataclasses are slow to make.
@dataclass(slots=True)
class ParsedResponse:
    index: int
    token_ids: tuple[int, ...] | None
    text: bytes | None
    num_output_tokens: int | None
    num_input_tokens: int | None
    final: bool
    empty: bool
    log_probs: tuple[float, ...] | None = None
    # [tokens, vocab] rows of the generation logits, when asked for.
    logits: np.ndarray | None = None
    kv_cache_reused_blocks: int | None = None
    # [prompt tokens, vocab] context logits, when asked for (on one response of the request).
    context_logits: np.ndarray | None = None


def _bytes_elements(raw: bytes) -> list[bytes]:
    out, pos, end = [], 0, len(raw)
    while pos < end:
        (length,) = _U32.unpack_from(raw, pos)
        pos += 4
        out.append(raw[pos : pos + length])
        pos += length
    return out


def _int32(raw: bytes) -> int | None:
    return int.from_bytes(raw[:4], "little", signed=True) if raw else None


_FINAL = "triton_final_response"


def parse_response(response: Any) -> ParsedResponse:
    """Read one ModelInferResponse protobuf (one streamed step, or the whole result).

    Once per streamed token: each protobuf field read builds a Python object, so every field is
    read once, and text that token ids make redundant is not unpacked at all."""
    params = response.parameters
    final = _FINAL in params and params[_FINAL].bool_param
    outputs = response.outputs
    if not outputs:
        return ParsedResponse(0, None, None, None, None, final, True)
    raw_contents = response.raw_output_contents
    count = len(raw_contents)
    ids: tuple[int, ...] | None = None
    text_raw: bytes | None = None
    index = 0
    n_out: int | None = None
    n_in: int | None = None
    seq_len: int | None = None
    log_probs: tuple[float, ...] | None = None
    logits: np.ndarray | None = None
    context: np.ndarray | None = None
    reused: int | None = None
    for pos, output in enumerate(outputs):
        if pos >= count:
            break
        raw = raw_contents[pos]
        name = output.name
        if name == c.OUTPUT_IDS:
            ids = tuple(array("i", raw))
        elif name == c.TEXT_OUTPUT:
            text_raw = raw
        elif name == c.SEQUENCE_LENGTH:
            seq_len = _int32(raw)
        elif name == c.SEQUENCE_INDEX:
            index = _int32(raw) or 0
        elif name == c.NUM_OUTPUT_TOKENS:
            n_out = _int32(raw)
        elif name == c.NUM_INPUT_TOKENS:
            n_in = _int32(raw)
        elif name == c.OUTPUT_LOG_PROBS:
            log_probs = tuple(array("f", raw))
        elif name == c.GENERATION_LOGITS:
            logits = decode_logits(raw, output.datatype, int(output.shape[-1]) if output.shape else 0)
        elif name == c.CONTEXT_LOGITS:
            context = decode_logits(raw, output.datatype, int(output.shape[-1]) if output.shape else 0)
        elif name == c.KV_CACHE_REUSED_BLOCKS:
            reused = _int32(raw)
    text: bytes | None = None
    if ids is not None:
        # Token ids are exact; text_output comes along only because the ensemble needs it asked for.
        if seq_len is not None:
            # output_ids is [1, beam, padded tokens]: only the first sequence_length are real.
            ids = ids[:seq_len]
    elif text_raw is not None:
        text = b"".join(_bytes_elements(text_raw))
    return ParsedResponse(index, ids, text, n_out, n_in, final, False, log_probs, logits, reused, context)


def _flat(value: Any) -> tuple[int, ...]:
    # A one-element tensor is a bare number in the generate extension's JSON, a larger one a list.
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            return tuple(v for row in value for v in row)
        return tuple(value)
    return (value,)


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list) else value


def parse_json_response(obj: dict[str, Any], *, whole: bool) -> ParsedResponse:
    """Read one event of Triton's HTTP generate_stream (one streamed step, or the whole result
    when `whole`): the same reading as `parse_response`, from the JSON Triton writes for every
    output (names as keys, a one-element tensor as a bare value, strings as JSON strings)."""
    raw_ids = obj.get(c.OUTPUT_IDS)
    raw_text = obj.get(c.TEXT_OUTPUT)
    n_out = obj.get(c.NUM_OUTPUT_TOKENS)
    if raw_ids is None and raw_text is None and n_out is None:
        return ParsedResponse(0, None, None, None, None, False, True)
    ids: tuple[int, ...] | None = None
    text: bytes | None = None
    if raw_ids is not None:
        ids = _flat(raw_ids)
        seq_len = obj.get(c.SEQUENCE_LENGTH)
        if whole and seq_len is not None:
            # output_ids is [1, beam, padded tokens]: only the first sequence_length are real.
            ids = ids[: _one(seq_len)]
    elif raw_text is not None:
        text = (raw_text if isinstance(raw_text, str) else "".join(raw_text)).encode()
    index = obj.get(c.SEQUENCE_INDEX)
    n_in = obj.get(c.NUM_INPUT_TOKENS)
    log_probs = obj.get(c.OUTPUT_LOG_PROBS)
    reused = obj.get(c.KV_CACHE_REUSED_BLOCKS)
    return ParsedResponse(
        0 if index is None else _one(index),
        ids,
        text,
        None if n_out is None else _one(n_out),
        None if n_in is None else _one(n_in),
        False,
        False,
        None if log_probs is None else tuple(float(v) for v in _flat(log_probs)),
        None,
        None if reused is None else _one(reused),
    )


def token_logprobs(parsed: ParsedResponse, ids: tuple[int, ...] | None, top: int) -> tuple[TokenLogprob, ...]:
    """Each new token's log probability and its `top` most likely alternatives. With generation
    logits both come from one log-softmax of the token's row (so a chosen token equals its own
    alternative entry exactly); without them, the engine's reported value."""
    if not ids:
        return ()
    rows = parsed.logits
    if top > 0 and rows is not None and len(rows) >= len(ids):
        # The rows may span more than this response's tokens: the new tokens' rows are the last.
        return tuple(scored_tokens(rows[len(rows) - len(ids) :], ids, top))
    values = parsed.log_probs or ()
    # output_log_probs may hold the whole padded row: the new tokens' values are the last ones.
    chosen = values[-len(ids) :] if len(values) >= len(ids) else (float("nan"),) * len(ids)
    return tuple(TokenLogprob(int(token), float(logprob)) for token, logprob in zip(ids, chosen, strict=True))
