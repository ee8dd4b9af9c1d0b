"""The TensorRT-LLM tensor contract, read from the model's own config at start-up.

Two routes speak it: the `ensemble` (text in, preprocessing tokenizes) and the `engine` (the
`tensorrt_llm` model itself; the gateway sends token ids). Their inputs mean the same things
under different names, and names drift between versions (`random_seed` -> `seed`,
`min_length` -> `min_tokens`, newer optional tensors): requests are written with logical names
and sent under whatever the model declares, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from gateway.engine import EngineInfo
from gateway.lora import parse_target_modules

Route = Literal["ensemble", "engine"]
# What a model entry asks for: "auto" takes the engine route when the ensemble's engine is served.
RouteChoice = Literal["auto", "ensemble", "engine"]

# Logical input names (the ensemble's names where it has them).
PROMPT = "prompt"
PROMPT_LENGTH = "prompt_length"
MAX_TOKENS = "max_tokens"
STREAM = "stream"
END_ID = "end_id"
PAD_ID = "pad_id"
STOP_WORDS = "stop_words"
TOP_K = "top_k"
TOP_P = "top_p"
TEMPERATURE = "temperature"
LENGTH_PENALTY = "length_penalty"
REPETITION_PENALTY = "repetition_penalty"
PRESENCE_PENALTY = "presence_penalty"
FREQUENCY_PENALTY = "frequency_penalty"
MIN_TOKENS = "min_tokens"
SEED = "seed"
BEAM_WIDTH = "beam_width"
NUM_RETURN_SEQUENCES = "num_return_sequences"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
RETURN_NUM_INPUT_TOKENS = "return_num_input_tokens"
RETURN_NUM_OUTPUT_TOKENS = "return_num_output_tokens"
RETURN_LOG_PROBS = "return_log_probs"
RETURN_GENERATION_LOGITS = "return_generation_logits"
RETURN_CONTEXT_LOGITS = "return_context_logits"
GUIDE_TYPE = "guided_decoding_guide_type"
GUIDE = "guided_decoding_guide"
EMBEDDING_BIAS = "embedding_bias"
RETURN_PERF_METRICS = "return_perf_metrics"
# Not in the stock repositories (the TensorRT-LLM backend does not pass a priority on to its
# executor): sent where a model declares it as FP32, in the executor's terms (see
# tensors.engine_priority).
PRIORITY = "priority"
LORA_TASK_ID = "lora_task_id"
LORA_WEIGHTS = "lora_weights"
LORA_CONFIG = "lora_config"
# The multimodal ensemble's images: data: URIs, one entry per image (`image_url_input`, dims [1] up
# to TensorRT-LLM v0.19, so one image a request; [-1] later).
IMAGE_URLS = "image_urls"

# Physical names per route; a tuple lists the names of one input across versions, newest first.
_ENSEMBLE: dict[str, tuple[str, ...]] = {
    PROMPT: ("text_input",),
    MAX_TOKENS: ("max_tokens",),
    STREAM: ("stream",),
    STOP_WORDS: ("stop_words",),
    TOP_K: ("top_k",),
    TOP_P: ("top_p",),
    LENGTH_PENALTY: ("length_penalty",),
    IMAGE_URLS: ("image_url_input",),
}
_ENGINE: dict[str, tuple[str, ...]] = {
    PROMPT: ("input_ids",),
    PROMPT_LENGTH: ("input_lengths",),
    MAX_TOKENS: ("request_output_len",),
    STREAM: ("streaming",),
    STOP_WORDS: ("stop_words_list",),
    TOP_K: ("runtime_top_k",),
    TOP_P: ("runtime_top_p",),
    LENGTH_PENALTY: ("len_penalty",),
    # A bias per vocabulary entry; the ensemble only has word-level embedding_bias_words.
    EMBEDDING_BIAS: ("embedding_bias",),
}
_SHARED: dict[str, tuple[str, ...]] = {
    END_ID: ("end_id",),
    PAD_ID: ("pad_id",),
    TEMPERATURE: ("temperature",),
    REPETITION_PENALTY: ("repetition_penalty",),
    PRESENCE_PENALTY: ("presence_penalty",),
    FREQUENCY_PENALTY: ("frequency_penalty",),
    MIN_TOKENS: ("min_tokens", "min_length"),
    SEED: ("seed", "random_seed"),
    BEAM_WIDTH: ("beam_width",),
    NUM_RETURN_SEQUENCES: ("num_return_sequences",),
    EXCLUDE_INPUT_IN_OUTPUT: ("exclude_input_in_output",),
    RETURN_NUM_INPUT_TOKENS: ("return_num_input_tokens",),
    RETURN_NUM_OUTPUT_TOKENS: ("return_num_output_tokens",),
    RETURN_LOG_PROBS: ("return_log_probs",),
    RETURN_GENERATION_LOGITS: ("return_generation_logits",),
    RETURN_CONTEXT_LOGITS: ("return_context_logits",),
    RETURN_PERF_METRICS: ("return_perf_metrics",),
    GUIDE_TYPE: ("guided_decoding_guide_type",),
    GUIDE: ("guided_decoding_guide",),
    PRIORITY: ("priority",),
    LORA_TASK_ID: ("lora_task_id",),
    LORA_WEIGHTS: ("lora_weights",),
    LORA_CONFIG: ("lora_config",),
}
ROUTE_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "ensemble": {**_SHARED, **_ENSEMBLE},
    "engine": {**_SHARED, **_ENGINE},
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "ensemble": (PROMPT, MAX_TOKENS),
    "engine": (PROMPT, PROMPT_LENGTH, MAX_TOKENS),
}
LEGACY_NAMES = frozenset({"random_seed", "min_length"})

# Outputs (the same names on both routes; only the ensemble has text_output).
TEXT_OUTPUT = "text_output"
OUTPUT_IDS = "output_ids"
SEQUENCE_LENGTH = "sequence_length"
SEQUENCE_INDEX = "sequence_index"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
OUTPUT_LOG_PROBS = "output_log_probs"
GENERATION_LOGITS = "generation_logits"
CONTEXT_LOGITS = "context_logits"
KV_CACHE_REUSED_BLOCKS = "kv_cache_reused_blocks"
# The engine model's parameter giving its KV cache block size (EngineSettings.tokens_per_block).
TOKENS_PER_BLOCK_PARAMETER = "tokens_per_block"
# The engine model's parameter saying its engine keeps the prompt's logits (trtllm-build
# --gather_context_logits); without it a request for context logits fails in the engine.
GATHER_CONTEXT_LOGITS_PARAMETER = "gather_context_logits"

_NP_DTYPES: dict[int, type[np.generic]] = {
    mc.TYPE_BOOL: np.bool_,
    mc.TYPE_INT32: np.int32,
    mc.TYPE_INT64: np.int64,
    mc.TYPE_UINT64: np.uint64,
    mc.TYPE_FP32: np.float32,
    mc.TYPE_FP16: np.float16,
    mc.TYPE_STRING: np.object_,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    triton_dtype: str
    np_dtype: type[np.generic]
    # As declared, without the batch dimension.
    dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What the engine model's own parameters say (its config's `parameters`), where the tensor
    contract alone cannot tell: the same tensors are declared whether or not a feature is on."""

    # The guided decoding backend when it is set up (`guided_decoding_backend` with the tokenizer
    # information it needs); "" otherwise, and then guide inputs are declared but do nothing useful.
    guided_backend: str = ""
    # `exclude_input_in_output` model parameter: whole results leave the prompt out by default.
    excludes_input: bool = False
    # The ensemble's text_output, streamed and joined, is the exact text: our postprocessing says
    # so (`text_output: token_bytes`); upstream's decodes each response alone.
    exact_text_stream: bool = False
    # The engine's KV cache block size (`tokens_per_block`, see model_repo_templates/README.md):
    # the TensorRT-LLM backend does not report it, and reused blocks mean nothing without it.
    tokens_per_block: int | None = None
    # The engine's `lora_target_modules` as module ids, where its config declares them (the CPU
    # reference engine does; a TensorRT-LLM engine keeps them in its engine directory).
    lora_target_modules: tuple[int, ...] | None = None
    # `gather_context_logits`: the engine was built to return the prompt's logits (the CPU
    # reference engine always can); the tensors are declared either way.
    context_logits: bool = False


def parameters(config: mc.ModelConfig) -> dict[str, str]:
    """A model config's string parameters, without those a template left unfilled (`${name}`)."""
    out = {}
    for key, value in config.parameters.items():
        text = value.string_value.strip()
        if text and not text.startswith("${"):
            out[key] = text
    return out


_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
# What each guided decoding backend needs besides its name (the TensorRT-LLM backend's own check).
_GUIDED_NEEDS: dict[str, tuple[str, ...]] = {"xgrammar": ("tokenizer_dir", "xgrammar_tokenizer_info_path")}


def engine_settings(
    engine: Mapping[str, str] | None, postprocessing: Mapping[str, str] | None = None
) -> EngineSettings:
    engine = engine or {}
    backend = engine.get("guided_decoding_backend", "").lower()
    needs = _GUIDED_NEEDS.get(backend)
    usable = backend if needs is not None and any(engine.get(k) for k in needs) else ""
    return EngineSettings(
        guided_backend=usable,
        excludes_input=engine.get("exclude_input_in_output", "").lower() in _TRUE,
        exact_text_stream=(postprocessing or {}).get("text_output") == "token_bytes",
        tokens_per_block=_positive_int(engine.get(TOKENS_PER_BLOCK_PARAMETER, "")),
        lora_target_modules=parse_target_modules(engine.get("lora_target_modules", "")),
        context_logits=engine.get(GATHER_CONTEXT_LOGITS_PARAMETER, "").lower() in _TRUE,
    )


def _positive_int(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


@dataclass(frozen=True, slots=True)
class Contract:
    model: str
    route: Route
    decoupled: bool
    # Logical input name -> the model's tensor, for the inputs this model declares.
    inputs: dict[str, TensorSpec]
    outputs: frozenset[str]
    declared_inputs: frozenset[str]
    settings: EngineSettings = EngineSettings()

    @property
    def exposes_token_ids(self) -> bool:
        return OUTPUT_IDS in self.outputs

    @property
    def native_num_sequences(self) -> bool:
        # Only a decoupled model can answer one request with several responses, one per sequence.
        return self.decoupled and NUM_RETURN_SEQUENCES in self.inputs and SEQUENCE_INDEX in self.outputs

    @property
    def reports_token_counts(self) -> bool:
        return NUM_OUTPUT_TOKENS in self.outputs and RETURN_NUM_OUTPUT_TOKENS in self.inputs

    @property
    def counts_by_log_probs(self) -> bool:
        """A text-only model without token counts still says how many tokens a response holds:
        one log probability per generated token (every stock version has these tensors)."""
        return RETURN_LOG_PROBS in self.inputs and OUTPUT_LOG_PROBS in self.outputs

    @property
    def usage_source(self) -> str:
        if self.images and not self.reports_token_counts:
            # The multimodal ensemble reports no prompt tokens: the gateway counts the template's
            # text with each image's placeholder expanded as the model's processor expands it.
            return "prompt: tokenizer, images expanded as by the processor; completion: " + self._completions
        return self._completions

    @property
    def _completions(self) -> str:
        if self.exposes_token_ids:
            return "token ids"
        if self.reports_token_counts:
            return "num_output_tokens"
        if self.counts_by_log_probs:
            return "output_log_probs"
        return "responses (approximate)"

    def streams(self, stream: bool) -> bool:
        """Whether a request is sent with `streaming` true. A decoupled engine streams whenever it
        can (token ids are exact either way, and a stop string then cancels at once); a text-only
        ensemble streams only a streamed request: its whole result is one exact decode."""
        if not self.decoupled:
            return False
        return stream or self.route == "engine" or self.exposes_token_ids

    def exact_stream(self) -> bool:
        """Whether a streamed request's text is exact: from ids, from exact bytes, or from one
        whole result (a model that cannot stream)."""
        return self.exposes_token_ids or self.settings.exact_text_stream or not self.decoupled

    @property
    def logprobs(self) -> bool:
        # Log probabilities are reported per token: they need the token ids to go with them.
        return self.exposes_token_ids and RETURN_LOG_PROBS in self.inputs and OUTPUT_LOG_PROBS in self.outputs

    @property
    def top_logprobs(self) -> bool:
        return self.logprobs and RETURN_GENERATION_LOGITS in self.inputs and GENERATION_LOGITS in self.outputs

    @property
    def prompt_logprobs(self) -> bool:
        """Whether the prompt can be scored: context logits returned by an engine built to keep them,
        on the engine route, where the ids sent are the ids the logits' rows score (the ensemble
        tokenizes the text again)."""
        return (
            self.route == "engine"
            and self.settings.context_logits
            and RETURN_CONTEXT_LOGITS in self.inputs
            and CONTEXT_LOGITS in self.outputs
        )

    @property
    def logit_bias(self) -> bool:
        return EMBEDDING_BIAS in self.inputs

    @property
    def guided_decoding(self) -> bool:
        return GUIDE_TYPE in self.inputs and GUIDE in self.inputs and bool(self.settings.guided_backend)

    def repeats_prompt(self, stream: bool = True) -> bool:
        """Whether a result starts with the prompt (cut by its ids' count, or by its decoded text):
        only a whole, non-streamed result from a model that is neither told to exclude the input
        (a request input) nor set to (the model parameter)."""
        if self.streams(stream):
            return False
        return not (EXCLUDE_INPUT_IN_OUTPUT in self.inputs or self.settings.excludes_input)

    @property
    def may_repeat_prompt(self) -> bool:
        return self.repeats_prompt(stream=False) or self.repeats_prompt(stream=True)

    @property
    def tokens_per_block(self) -> int | None:
        return self.settings.tokens_per_block

    @property
    def reports_cached_tokens(self) -> bool:
        """Whether the engine can say how many prompt tokens came from its KV cache: it returns
        kv_cache_reused_blocks with return_perf_metrics, and the block size is known."""
        return (
            RETURN_PERF_METRICS in self.inputs
            and KV_CACHE_REUSED_BLOCKS in self.outputs
            and self.tokens_per_block is not None
        )

    @property
    def priority(self) -> bool:
        """Whether requests carry their priority: the model declares an FP32 `priority` input."""
        spec = self.inputs.get(PRIORITY)
        return spec is not None and spec.triton_dtype == "FP32"

    @property
    def variant(self) -> str:
        return "legacy" if self.declared_inputs & LEGACY_NAMES else "current"

    @property
    def lora(self) -> bool:
        """Whether requests can carry a LoRA adapter (the ensemble passes it on from v0.15)."""
        return all(k in self.inputs for k in (LORA_TASK_ID, LORA_WEIGHTS, LORA_CONFIG))

    @property
    def lora_config_width(self) -> int:
        """Columns of `lora_config`: 3, or 4 where the model declares the `is_dora` column."""
        spec = self.inputs.get(LORA_CONFIG)
        return 4 if spec is not None and spec.dims and spec.dims[-1] == 4 else 3

    @property
    def images(self) -> bool:
        """Whether requests can carry images: the multimodal ensemble's `image_url_input`."""
        return IMAGE_URLS in self.inputs

    @property
    def images_per_request(self) -> int | None:
        """How many images one request carries (None: any number): `image_url_input` declared
        [1] (TensorRT-LLM up to v0.19) holds one."""
        spec = self.inputs.get(IMAGE_URLS)
        return 1 if spec is not None and spec.dims == (1,) else None

    def capabilities(self) -> EngineInfo:
        """What this model can do, in the Engine protocol's terms: the one place each capability is
        read off the contract (the adapter's `info`, `gateway check` and the start-up table)."""
        return EngineInfo(
            model=self.model,
            exposes_token_ids=self.exposes_token_ids,
            native_num_sequences=self.native_num_sequences,
            reports_token_counts=self.reports_token_counts,
            variant=self.variant,
            decoupled=self.decoupled,
            guided_decoding=self.guided_decoding,
            logprobs=self.logprobs,
            top_logprobs=self.top_logprobs,
            prompt_logprobs=self.prompt_logprobs,
            logit_bias=self.logit_bias,
            cached_tokens=self.reports_cached_tokens,
            tokens_per_block=self.tokens_per_block,
            needs_prompt_ids=self.route == "engine" or self.may_repeat_prompt,
            repeats_prompt=(self.repeats_prompt(stream=True), self.repeats_prompt(stream=False)),
            inputs=self.declared_inputs,
            outputs=self.outputs,
            route=self.route,
            guided_backend=self.settings.guided_backend if self.guided_decoding else "",
            exact_stream=self.exact_stream(),
            usage_source=self.usage_source,
            lora=self.lora,
            lora_target_modules=self.settings.lora_target_modules,
            images=self.images,
            images_per_request=self.images_per_request,
        )

    def with_decoupled(self, decoupled: bool) -> Contract:
        return replace(self, decoupled=decoupled)

    def with_settings(self, settings: EngineSettings) -> Contract:
        return replace(self, settings=settings)


def is_multimodal(config: mc.ModelConfig) -> bool:
    """Whether a model is TensorRT-LLM's multimodal ensemble (it takes `image_url_input`)."""
    return any(i.name in ROUTE_NAMES["ensemble"][IMAGE_URLS] for i in config.input)


def is_engine(config: mc.ModelConfig) -> bool:
    """Whether a model speaks the `tensorrt_llm` contract (token ids in, output_ids out)."""
    try:
        read_contract(config, "engine")
    except ContractError:
        return False
    return True


class ContractError(ValueError):
    """The model does not look like a TensorRT-LLM model the gateway can drive on this route."""


def _dtype_name(code: int) -> str:
    return str(mc.DataType.Name(code)).removeprefix("TYPE_").replace("STRING", "BYTES")


def read_contract(config: mc.ModelConfig, route: Route = "ensemble") -> Contract:
    declared = {
        i.name: TensorSpec(
            i.name, _dtype_name(i.data_type), _NP_DTYPES.get(i.data_type, np.object_), tuple(i.dims)
        )
        for i in config.input
    }
    inputs: dict[str, TensorSpec] = {}
    for logical, names in ROUTE_NAMES[route].items():
        found = next((n for n in names if n in declared), None)
        if found is not None:
            inputs[logical] = declared[found]
    missing = [ROUTE_NAMES[route][k][0] for k in REQUIRED[route] if k not in inputs]
    if missing:
        raise ContractError(
            f"model {config.name!r} has no input(s) {', '.join(missing)}: "
            f"not a TensorRT-LLM {'ensemble' if route == 'ensemble' else 'engine'}"
        )
    outputs = frozenset(o.name for o in config.output)
    needed = OUTPUT_IDS if route == "engine" else None
    if needed and needed not in outputs:
        raise ContractError(f"model {config.name!r} has no {needed} output")
    if TEXT_OUTPUT not in outputs and OUTPUT_IDS not in outputs:
        raise ContractError(f"model {config.name!r} has neither {TEXT_OUTPUT} nor {OUTPUT_IDS} as output")
    return Contract(
        model=config.name,
        route=route,
        decoupled=bool(config.model_transaction_policy.decoupled),
        inputs=inputs,
        outputs=outputs,
        declared_inputs=frozenset(declared),
    )
