"""In-flight batching engine behind the CPU reference ``tensorrt_llm`` model; no Triton imports.

One loop thread steps every active sequence together: each step it drops cancelled requests, runs one
batched decode forward (KV cache, left-padded rows) for the running sequences, prefills newly arrived
requests so they join the batch, and emits one token per active sequence. Responses follow the
TensorRT-LLM backend: streaming sends each step's new token then an empty final response; non-streaming
sends each sequence whole (prompt included unless excluded). ``synthetic`` mode replaces the model by a
deterministic token function so load tests measure the gateway rather than CPU matrix products.
Guided decoding (JSON, JSON schema, regex, EBNF) masks each step's logits with an xgrammar matcher.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

logger = logging.getLogger(__name__)

NEG_INF = float("-inf")
# TensorRT-LLM's guide types (GuidedDecodingParams::GuideType) this engine compiles.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: ": noise for a client.
_XGRAMMAR_ERROR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")


# TensorRT-LLM's executor::Request default priority.
DEFAULT_PRIORITY = 0.5


class EngineError(ValueError):
    """A request the engine cannot serve; it becomes an error response, never a crash."""


@dataclass(frozen=True, slots=True, eq=False)
class SamplingParams:
    """Per-sequence decoding parameters, with TensorRT-LLM's meanings.

    Greedy decoding happens when temperature == 0, top_k == 1, or neither top_k nor top_p is set
    (both 0): like TensorRT-LLM, a temperature alone does not turn sampling on.
    """

    max_new_tokens: int
    end_id: int | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_words: tuple[tuple[int, ...], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    embedding_bias: np.ndarray | None = None
    guide: CompiledGuide | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k <= 0 and self.top_p <= 0.0)


def grammar_error_message(exc: BaseException) -> str:
    """An xgrammar compile error as one readable line, without the C++ timestamp and source location."""
    text = str(exc).strip()
    lines = [_XGRAMMAR_ERROR_PREFIX.sub("", line).strip() for line in text.splitlines()]
    return "; ".join(line for line in lines if line) or type(exc).__name__


def check_guide(guide_type: str, guide: str) -> None:
    """Reject a guide request before compiling it: unknown type, missing guide, a schema that is not JSON."""
    if guide_type not in GUIDE_TYPES:
        raise EngineError(
            f"guided_decoding_guide_type must be one of {', '.join(GUIDE_TYPES)}, got {guide_type!r}"
        )
    if guide_type != "json" and not guide.strip():
        raise EngineError(f"guided_decoding_guide is required for guide type {guide_type!r}")
    if guide_type == "json_schema":
        try:
            schema = json.loads(guide)
        except ValueError as exc:
            raise EngineError(f"guided_decoding_guide is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise EngineError("guided_decoding_guide must be a JSON schema (an object or a boolean)")


@dataclass(frozen=True, slots=True, eq=False)
class CompiledGuide:
    """A compiled grammar plus what a matcher for it needs; shared by every sequence using the guide."""

    guide_type: str
    grammar: Any
    stop_token_ids: tuple[int, ...]
    vocab_size: int
    # Special tokens the guide does not name: masked (see GuidedDecoding).
    special_token_ids: tuple[int, ...] = ()

    def matcher(self, end_id: int | None) -> GrammarState:
        return GrammarState(self, end_id)


class GrammarState:
    """One sequence's grammar: masks each step's logits and advances with each accepted token.

    The grammar's stop tokens are the tokenizer's eos ids plus the request's ``end_id``: once the
    grammar is complete only those are allowed, and accepting one terminates the matcher. Other
    special tokens are allowed only where the grammar allows them and the guide names them (see
    GuidedDecoding).
    """

    def __init__(self, guide: CompiledGuide, end_id: int | None) -> None:
        import xgrammar as xgr

        stops = set(guide.stop_token_ids)
        if end_id is not None and 0 <= end_id < guide.vocab_size:
            stops.add(end_id)
        self.stop_token_ids = frozenset(stops)
        self._xgr = xgr
        self._vocab_size = guide.vocab_size
        # With no stop token at all the matcher ends as soon as the grammar is complete.
        self._matcher = xgr.GrammarMatcher(
            guide.grammar,
            override_stop_tokens=sorted(stops) or None,
            terminate_without_stop_token=not stops,
        )
        self._bitmask = xgr.allocate_token_bitmask(1, guide.vocab_size)
        self._special = sorted(set(guide.special_token_ids) - stops)

    def fill(self) -> None:
        """Compute the allowed next tokens (once per step, before ``mask``)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)

    def mask(self, scores: Any) -> None:
        """Set the scores of tokens the grammar forbids to -inf, in place (``scores`` is 1-D float32)."""
        self._xgr.apply_token_bitmask_inplace(
            scores.unsqueeze(0), self._bitmask, vocab_size=min(self._vocab_size, scores.numel())
        )
        if scores.numel() > self._vocab_size:
            scores[self._vocab_size :] = NEG_INF
        if self._special:
            scores[self._special] = NEG_INF

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise RuntimeError(f"the grammar matcher rejected token {token} it allowed")

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class GuidedDecoding:
    """xgrammar for one tokenizer: compiles guides per request (cached by (type, guide)) into CompiledGuides.

    ``json_schema`` compiles without free whitespace (``", "`` and ``": "`` separators): a model is
    then never able to spend its tokens on indentation; ``json`` is xgrammar's built-in JSON grammar.

    Special tokens: xgrammar (as TensorRT-LLM builds it, ``TokenizerInfo.from_huggingface``) treats
    as special only tokens that decode to nothing, so a marker that decodes to its own text
    (gpt-oss's ``<|channel|>``, Qwen's ``<|im_end|>``) is allowed wherever the grammar allows that
    text, and a guide that spells ``<|channel|>`` lets a model write the one token. The same
    tokens are also allowed wherever the grammar allows their characters (inside a JSON string),
    where a trained model never writes them but the tests' random models would, and a default
    decode would then drop their text from the output. So a special token is allowed where
    xgrammar allows it only when the guide names it (its text appears in the guide, escapes aside):
    what a guide spells comes out as TensorRT-LLM gives it, and guides that name no special token
    decode as before.
    Thread-safe: ``compile`` runs on Triton's execute threads while the engine loop runs matchers.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, *, cache_size: int = 256) -> None:
        import xgrammar as xgr

        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=1, cache_enabled=False)
        self._vocab_size = vocab_size
        self._stops = tuple(int(t) for t in self.tokenizer_info.stop_token_ids)
        special = set(tokenizer.all_special_ids) | {
            int(i) for i, added in tokenizer.added_tokens_decoder.items() if added.special
        }
        self._special = tuple(sorted(t for t in special if 0 <= t < vocab_size))
        self._special_texts = {t: str(tokenizer.convert_ids_to_tokens(t)) for t in self._special}
        self._cache: collections.OrderedDict[tuple[str, str], CompiledGuide] = collections.OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, guide_type: str, guide: str) -> CompiledGuide:
        check_guide(guide_type, guide)
        key = (guide_type, "" if guide_type == "json" else guide)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        try:
            if guide_type == "json":
                grammar = self._compiler.compile_builtin_json_grammar()
            elif guide_type == "json_schema":
                grammar = self._compiler.compile_json_schema(guide, any_whitespace=False)
            elif guide_type == "regex":
                grammar = self._compiler.compile_regex(guide)
            else:
                grammar = self._compiler.compile_grammar(guide)
        except Exception as exc:
            raise EngineError(
                f"guided_decoding_guide ({guide_type}) does not compile: {grammar_error_message(exc)}"
            ) from None
        # A guide names a special token where its text appears in it once escapes are read
        # (a regex's `<\|channel\|>`, a JSON string's `\"`): see the class docstring.
        spelled = guide.replace("\\", "")
        masked = tuple(
            t for t in self._special if not self._special_texts[t] or self._special_texts[t] not in spelled
        )
        compiled = CompiledGuide(guide_type, grammar, self._stops, self._vocab_size, masked)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """What a request asked to get back, besides the tokens."""

    streaming: bool = False
    exclude_input: bool = False
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    return_perf_metrics: bool = False


class ResponseSink(Protocol):
    """Where a request's responses go (the Triton response sender in production, a list in tests)."""

    def is_cancelled(self) -> bool: ...

    def send(
        self, tensors: dict[str, np.ndarray] | None, *, final: bool, error: str | None = None
    ) -> None: ...


# TensorRT-LLM's LoRA module ids (LoraManager.LORA_MODULE_IDS) -> the Hugging Face Llama-style module
# each adapts, as hf_lora_convert.py maps them (gate_proj is mlp_h_to_4h, up_proj mlp_gate).
LORA_MODULES: dict[int, tuple[str, str]] = {
    0: ("attn_qkv", "self_attn.qkv_proj"),
    1: ("attn_q", "self_attn.q_proj"),
    2: ("attn_k", "self_attn.k_proj"),
    3: ("attn_v", "self_attn.v_proj"),
    4: ("attn_dense", "self_attn.o_proj"),
    5: ("mlp_h_to_4h", "mlp.gate_proj"),
    6: ("mlp_4h_to_h", "mlp.down_proj"),
    7: ("mlp_gate", "mlp.up_proj"),
}
LORA_MODULE_IDS = {name: module_id for module_id, (name, _) in LORA_MODULES.items()}


@dataclass(frozen=True, slots=True, eq=False)
class LoraInput:
    """A request's LoRA inputs as received: the task id, and the weights and config when sent."""

    task_id: int
    weights: np.ndarray | None = None
    config: np.ndarray | None = None


@dataclass(eq=False)
class LoraAdapter:
    """One cached adapter: per (layer, module id), A [r, in] and B [out, r] (scaling folded in),
    as tensors of the runner's dtype and device (numpy arrays in synthetic mode)."""

    task_id: int
    modules: dict[tuple[int, int], tuple[Any, Any]]
    in_flight: int = 0


class LoraCache:
    """The engine's LoRA cache, with TensorRT-LLM's rules and words: an id sent with weights is
    stored (the weights of an id already cached are ignored), an id alone must be cached, and a
    full cache evicts the least recently used adapter no request is using, or refuses."""

    def __init__(
        self,
        capacity: int,
        shapes: dict[tuple[int, int], tuple[int, int]],
        convert: Callable[[np.ndarray], Any],
    ) -> None:
        self.capacity = capacity
        # (layer, module id) -> (in features, out features) of the modules adapters may adapt.
        self._shapes = shapes
        self._convert = convert
        self._adapters: collections.OrderedDict[int, LoraAdapter] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._adapters)

    def __contains__(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._adapters

    def acquire(self, lora: LoraInput) -> LoraAdapter:
        """The request's adapter, pinned until ``release`` (or an EngineError in the backend's words)."""
        with self._lock:
            cached = self._adapters.get(lora.task_id)
            if cached is not None:
                cached.in_flight += 1
                self._adapters.move_to_end(lora.task_id)
                return cached
            if lora.weights is None or lora.config is None:
                raise EngineError(
                    f"LoRA task {lora.task_id} not found in cache. Please send LoRA weights with request"
                )
        adapter = LoraAdapter(lora.task_id, self._modules(lora.weights, lora.config))
        with self._lock:
            cached = self._adapters.get(lora.task_id)
            if cached is not None:
                cached.in_flight += 1
                return cached
            while len(self._adapters) >= self.capacity:
                idle = next((t for t, a in self._adapters.items() if a.in_flight == 0), None)
                if idle is None:
                    raise EngineError("Cache is full. There are no done tasks to evict")
                del self._adapters[idle]
                self.evictions += 1
            adapter.in_flight = 1
            self._adapters[lora.task_id] = adapter
            self.loads += 1
            return adapter

    def release(self, adapter: LoraAdapter) -> None:
        with self._lock:
            adapter.in_flight -= 1

    def _modules(self, weights: np.ndarray, config: np.ndarray) -> dict[tuple[int, int], tuple[Any, Any]]:
        if weights.ndim == 3:
            weights = weights.reshape(-1, weights.shape[-1])
        if config.ndim == 3:
            config = config.reshape(-1, config.shape[-1])
        if weights.ndim != 2 or config.ndim != 2 or config.shape[1] not in (3, 4):
            raise EngineError(
                f"lora_weights must be [1, N, W] and lora_config [1, N, 3], got {list(weights.shape)} "
                f"and {list(config.shape)}"
            )
        if weights.shape[0] != config.shape[0]:
            raise EngineError("lora_weights and lora_config must have one row per module and layer")
        modules: dict[tuple[int, int], tuple[Any, Any]] = {}
        for row, values in enumerate(config.tolist()):
            module_id, layer, rank = (int(v) for v in values[:3])
            if len(values) > 3 and values[3]:
                raise EngineError("DoRA adapters are not supported by the CPU reference engine")
            shape = self._shapes.get((layer, module_id))
            if shape is None:
                name = LORA_MODULES.get(module_id, (str(module_id), ""))[0]
                raise EngineError(
                    f"LoRA module {name} of layer {layer} is not in this engine's lora_target_modules"
                )
            fan_in, fan_out = shape
            if rank <= 0 or rank * (fan_in + fan_out) > weights.shape[1]:
                raise EngineError(
                    f"LoRA row {row}: rank {rank} does not fit a row of {weights.shape[1]} values "
                    f"for a {fan_in}x{fan_out} module"
                )
            flat = np.asarray(weights[row], dtype=np.float32)
            a = flat[: rank * fan_in].reshape(rank, fan_in)
            b = flat[rank * fan_in : rank * (fan_in + fan_out)].reshape(fan_out, rank)
            modules[(layer, module_id)] = (self._convert(a), self._convert(b))
        return modules


_PEFT_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.([A-Za-z_]+)\.lora_([AB])\.weight$")


def read_peft_adapter(path: str, task_id: int) -> LoraInput:
    """A Hugging Face PEFT LoRA directory as TensorRT-LLM's LoRA inputs (rows of A then B with the
    scaling folded in, as hf_lora_convert.py writes them): how a model that loads adapters by path
    (the llmapi model's ``lora_path``) gets the tensors this engine applies."""
    import os

    from safetensors.numpy import load_file

    try:
        with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as f:
            settings = json.load(f)
        tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
        rank, alpha = int(settings["r"]), float(settings.get("lora_alpha", settings["r"]))
    except Exception as exc:
        raise EngineError(f"cannot load the LoRA adapter at {path!r}: {exc}") from None
    scale = alpha / rank**0.5 if settings.get("use_rslora") else alpha / rank
    by_module = {f"{part}": module_id for module_id, (_, part) in LORA_MODULES.items()}
    pairs: dict[tuple[int, int], dict[str, np.ndarray]] = collections.defaultdict(dict)
    for key, value in tensors.items():
        match = _PEFT_KEY.search(key)
        if match is None:
            continue
        module_id = by_module.get(f"{match.group(2)}.{match.group(3)}")
        if module_id is None:
            raise EngineError(f"LoRA module {match.group(3)} has no TensorRT-LLM module id")
        pairs[(module_id, int(match.group(1)))][match.group(4)] = value.astype(np.float32)
    rows, config = [], []
    for (module_id, layer), sides in sorted(pairs.items()):
        a, b = sides["A"], sides["B"] * scale
        rows.append(np.concatenate([a.reshape(-1), b.reshape(-1)]))
        config.append([module_id, layer, a.shape[0]])
    if not rows:
        raise EngineError(f"no LoRA weights in {path!r}")
    weights = np.zeros((1, len(rows), max(r.size for r in rows)), dtype=np.float16)
    for i, row in enumerate(rows):
        weights[0, i, : row.size] = row
    return LoraInput(task_id, weights, np.asarray([config], dtype=np.int32))


def parse_lora_target_modules(text: str) -> list[int]:
    """The ``lora_target_modules`` parameter: TensorRT-LLM module names, comma-separated."""
    ids = []
    for name in (n.strip() for n in text.split(",")):
        if not name:
            continue
        if name not in LORA_MODULE_IDS:
            raise EngineError(f"unknown LoRA module {name!r}; known: {', '.join(LORA_MODULE_IDS)}")
        ids.append(LORA_MODULE_IDS[name])
    return ids


@dataclass(eq=False)
class RequestGroup:
    """One Triton request: ``len(prompts)`` batch rows x ``num_return_sequences`` sequences.

    It is final when all of its sequences are; ``declared_outputs`` limits the tensors sent to those
    the model config declares (the legacy contract has fewer).
    """

    prompts: list[list[int]]
    params: list[SamplingParams]
    options: OutputOptions
    sink: ResponseSink
    declared_outputs: frozenset[str]
    num_return_sequences: int = 1
    request_id: str = ""
    # TensorRT-LLM's executor priority: 0.0 to 1.0, higher first, 0.5 by default.
    priority: float = DEFAULT_PRIORITY
    arrival_ns: int = field(default_factory=time.time_ns)
    # The LoRA inputs, and the cached adapter they resolved to (pinned while the request runs).
    lora: LoraInput | None = None
    adapter: LoraAdapter | None = None
    # The multimodal encoder's output (``prompt_embedding_table``, [rows, hidden]): prompt ids from
    # the vocabulary size on stand for its rows, as in TensorRT-LLM's prompt tuning.
    prompt_table: np.ndarray | None = None
    # Sequences not finished yet, and (non-streaming) sequences whose result is not sent yet.
    unfinished: int = 0
    unsent_results: int = 0
    closed: bool = False

    @property
    def task_id(self) -> int:
        return self.lora.task_id if self.lora is not None else 0

    @property
    def kv_key(self) -> int:
        """What a prompt's KV blocks are keyed by besides its ids: the LoRA task, and the prompt
        table's content (the same placeholder ids stand for different images)."""
        if self.prompt_table is None:
            return self.task_id
        digest = hashlib.blake2b(np.ascontiguousarray(self.prompt_table).tobytes(), digest_size=8).digest()
        return self.task_id ^ int.from_bytes(digest, "little")


@dataclass(eq=False)
class _Sequence:
    uid: int
    group: RequestGroup
    row: int
    index: int
    prompt: list[int]
    params: SamplingParams
    generator: Any = None
    synthetic_base: int = 0
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    generation_logits: list[np.ndarray] = field(default_factory=list)
    context_logits: np.ndarray | None = None
    grammar: GrammarState | None = None
    # Tokens appended this step and not yet sent (streaming sends them at the end of the step).
    unsent: int = 0
    finished: bool = False
    in_runner: bool = False
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    blocks: SequenceBlocks | None = None


@dataclass(frozen=True, slots=True)
class StepStats:
    """What the loop reports after each step (exported as Triton metrics by the model)."""

    active_requests: int
    waiting_requests: int
    scheduled_sequences: int
    context_requests: int
    context_tokens: int
    generation_sequences: int
    steps_total: int
    generated_tokens_total: int
    # Tokens generated in steps shared by two or more sequences: zero if requests ran one at a time.
    batched_tokens_total: int
    completed_requests_total: int
    cancelled_requests_total: int
    max_batch_size: int
    kv_cache: KvCacheStats | None = None


def block_keys(tokens: Sequence[int], tokens_per_block: int, task_id: int = 0) -> list[int]:
    """Chained hashes of the whole blocks of ``tokens``: block i's key covers blocks 0..i.

    A block's key hashes its parent's key with its own tokens (as TensorRT-LLM's and vLLM's block
    managers key their reuse trees), so equal keys mean equal prefixes, not just equal blocks. The
    chain starts from the LoRA task id (0: none): an adapter's blocks are never another's.
    """
    keys: list[int] = []
    parent = task_id
    ids = np.asarray(tokens, dtype="<i4")
    for start in range(0, len(tokens) - tokens_per_block + 1, tokens_per_block):
        digest = hashlib.blake2b(
            parent.to_bytes(8, "little") + ids[start : start + tokens_per_block].tobytes(), digest_size=8
        ).digest()
        parent = int.from_bytes(digest, "little")
        keys.append(parent)
    return keys


@dataclass(eq=False)
class SequenceBlocks:
    """One sequence's share of the paged KV cache, and its TensorRT-LLM per-request KV figures."""

    # Keys of the whole blocks this sequence holds a reference on (shared with other sequences).
    keys: list[int] = field(default_factory=list)
    # Blocks only this sequence holds (the unfinished last block, or every block without reuse).
    private: int = 0
    reused: int = 0
    allocated: int = 0

    @property
    def new(self) -> int:
        return self.allocated - self.reused


@dataclass(frozen=True, slots=True)
class KvCacheStats:
    """The block figures TensorRT-LLM's backend exports as ``nv_trt_llm_kv_cache_block_metrics``."""

    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int
    reused_blocks: int

    @property
    def fraction_used(self) -> float:
        return self.used_blocks / self.max_blocks if self.max_blocks else 0.0


class KvCacheManager:
    """Paged KV-cache bookkeeping after TensorRT-LLM's block manager, for one engine loop thread.

    The cache has ``max_blocks`` blocks of ``tokens_per_block`` tokens. A sequence holds the blocks
    of its tokens. With reuse on, the whole blocks of a prompt are keyed by their chained hash once
    its context phase is done (so a request arriving meanwhile reuses them too), and the whole blocks
    a finished sequence computed stay cached, free but reusable, until evicted least recently used
    first when blocks are needed. A new request reuses its longest cached prefix of whole blocks
    within its first ``len(prompt) - 1`` tokens: the last prompt token is always computed, since its
    logits give the first output token (TensorRT-LLM never reuses it either). Without reuse a block
    is freed with its sequence. Used blocks are those referenced by running sequences; cached
    unreferenced blocks count as free, as TensorRT-LLM counts them.
    """

    def __init__(self, *, tokens_per_block: int, max_blocks: int, reuse: bool) -> None:
        if tokens_per_block < 1 or max_blocks < 1:
            raise ValueError("tokens_per_block and max_blocks must be >= 1")
        self.tokens_per_block = tokens_per_block
        self.max_blocks = max_blocks
        self.reuse = reuse
        self._refs: dict[int, int] = {}
        # Cached blocks nobody references, least recently used first.
        self._free_cached: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._private = 0
        self._reused_total = 0

    @property
    def used_blocks(self) -> int:
        return len(self._refs) + self._private

    def stats(self) -> KvCacheStats:
        used = self.used_blocks
        return KvCacheStats(
            max_blocks=self.max_blocks,
            free_blocks=max(self.max_blocks - used, 0),
            used_blocks=used,
            tokens_per_block=self.tokens_per_block,
            reused_blocks=self._reused_total,
        )

    def cached_prefix_blocks(self, prompt: Sequence[int], task_id: int = 0) -> int:
        """How many whole blocks of ``prompt`` a request starting now would reuse."""
        if not self.reuse:
            return 0
        count = 0
        for key in block_keys(prompt[: len(prompt) - 1], self.tokens_per_block, task_id):
            if key not in self._refs and key not in self._free_cached:
                break
            count += 1
        return count

    def blocks_for(self, length: int) -> int:
        return -(-length // self.tokens_per_block)

    def can_start(self, prompt: Sequence[int], task_id: int = 0) -> bool:
        """Whether the prompt's context blocks fit beside the running sequences' blocks."""
        needed = self.blocks_for(len(prompt)) - self.cached_prefix_blocks(prompt, task_id)
        return self.used_blocks + needed <= self.max_blocks

    def start(self, prompt: Sequence[int], task_id: int = 0) -> SequenceBlocks:
        """Take the blocks of a prompt's context phase: its reused prefix and new blocks for the rest."""
        reused = self.cached_prefix_blocks(prompt, task_id)
        total = self.blocks_for(len(prompt))
        keys = block_keys(prompt, self.tokens_per_block, task_id) if self.reuse else []
        # The reused blocks first, so that making room cannot evict them.
        for key in keys[:reused]:
            self._ref(key)
        self._make_room(total - reused)
        # The prompt's other whole blocks are computed by this context phase: keyed from now on.
        for key in keys[reused:]:
            self._ref(key)
        blocks = SequenceBlocks(keys=keys, private=total - len(keys), reused=reused, allocated=total)
        self._private += blocks.private
        self._reused_total += reused
        return blocks

    def grow(self, blocks: SequenceBlocks, length: int) -> None:
        """A generated token took the sequence to ``length`` tokens: a new block when it spills over."""
        needed = self.blocks_for(length) - len(blocks.keys) - blocks.private
        if needed > 0:
            self._make_room(needed)
            self._private += needed
            blocks.private += needed
            blocks.allocated += needed

    def release(self, blocks: SequenceBlocks, tokens: Sequence[int], task_id: int = 0) -> None:
        """A sequence ended. With reuse its computed whole blocks (``tokens`` but the last, whose KV
        was never computed) stay cached, the deepest evicted first; everything else is freed."""
        self._private -= blocks.private
        if self.reuse:
            computed = block_keys(tokens[: len(tokens) - 1], self.tokens_per_block, task_id)
            if len(computed) < len(blocks.keys):
                computed = blocks.keys
            for key in blocks.keys:
                self._unref(key)
            # Most recently used now, the deepest of them evicted first: a parent outlives its children.
            for key in reversed(computed):
                if key not in self._refs:
                    self._free_cached[key] = None
                    self._free_cached.move_to_end(key)
            self._make_room(0)
        blocks.keys, blocks.private = [], 0

    def _ref(self, key: int) -> None:
        self._free_cached.pop(key, None)
        self._refs[key] = self._refs.get(key, 0) + 1

    def _unref(self, key: int) -> None:
        count = self._refs.get(key, 0) - 1
        if count > 0:
            self._refs[key] = count
        else:
            self._refs.pop(key, None)
            self._free_cached[key] = None

    def _make_room(self, incoming: int) -> None:
        """Evict free cached blocks, least recently used first, until ``incoming`` new ones fit."""
        while self._free_cached and self.used_blocks + len(self._free_cached) + incoming > self.max_blocks:
            self._free_cached.popitem(last=False)


def _mix64(value: int) -> int:
    """SplitMix64 finalizer: a cheap, well-distributed 64-bit hash of an integer."""
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)


def ordinary_token_ids(tokenizer: Any) -> list[int]:
    """The ids synthetic mode emits: ordinary tokens only (not special, not added) that decode on
    their own to readable text (no replacement or control characters, not just blanks). The native
    engine's renderer uses the same rule, so both engines give the same tokens."""
    excluded = set(tokenizer.all_special_ids) | {int(i) for i in tokenizer.added_tokens_decoder}
    ids = []
    for token_id in range(len(tokenizer)):
        if token_id in excluded:
            continue
        text = tokenizer.decode([token_id])
        if text.strip() and "\ufffd" not in text and all(ch.isprintable() or ch in " \n" for ch in text):
            ids.append(token_id)
    return ids


def synthetic_token(candidates: Sequence[int], base: int, position: int) -> int:
    """The synthetic engine's token at ``position`` (0-based among generated tokens).

    ``base`` is ``synthetic_base(prompt, seed, sequence_index)``; the token is
    ``candidates[splitmix64(base + position) % len(candidates)]``, so it depends only on the prompt,
    the seed, the sequence index and the position.
    """
    return candidates[_mix64(base + position) % len(candidates)]


def synthetic_base(prompt: Sequence[int], seed: int, sequence_index: int) -> int:
    digest = hashlib.blake2b(
        np.asarray(prompt, dtype="<i4").tobytes() + int(seed).to_bytes(8, "little", signed=False),
        digest_size=8,
        person=sequence_index.to_bytes(4, "little"),
    ).digest()
    return int.from_bytes(digest, "little")


ENGINE_DEVICES = ("cpu", "cuda")
# Padded prompt tokens in one batched context phase on a GPU.
PREFILL_BATCH_TOKENS = 16384
ENGINE_DTYPES = ("float32", "bfloat16", "float16")


def check_engine_device(device: str, dtype: str) -> None:
    """Refuse a device or dtype the runner cannot use here, in one line (EngineError)."""
    if device not in ENGINE_DEVICES:
        raise EngineError(f"engine_device must be one of {', '.join(ENGINE_DEVICES)}, got {device!r}")
    if dtype not in ENGINE_DTYPES:
        raise EngineError(f"engine_dtype must be one of {', '.join(ENGINE_DTYPES)}, got {dtype!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            build = torch.version.cuda
            raise EngineError(
                f"engine_device=cuda but torch {torch.__version__} sees no CUDA GPU ("
                + (f"built for CUDA {build}: no device or driver visible" if build else "a CPU-only build")
                + "); use engine_device=cpu"
            )


def _hash32(x: Any) -> Any:
    """A 32-bit integer hash of each element of an int64 tensor holding values in [0, 2**32).

    Both multipliers are below 2**31, so no product overflows int64 (the same bits on CPU and GPU).
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & 0xFFFFFFFF
    return x ^ (x >> 16)


def sequence_noise_key(seed: int, index: int, position: int) -> int:
    """The 32-bit key of one sequence's sampling noise at one position (device sampling)."""
    return _mix64(((seed + index * 0x9E3779B1) % 2**63) + position) & 0xFFFFFFFF


def sample_on_device(
    logits: Any, rows: Sequence[int], params: Sequence[SamplingParams], noise_keys: Sequence[int]
) -> tuple[list[int], list[float]]:
    """Pick the next token of several rows of ``logits`` ([rows, vocab] float32 on any device) at once.

    For rows with no bias, penalty, ban, grammar or logits output: greedy rows take the argmax;
    sampling rows divide by their temperature, keep their top_k and top_p (the same truncation as
    ``Engine._sample``) and draw by the Gumbel-max trick, whose noise is a hash of the row's key and
    each vocabulary id: reproducible for a seed, independent of the batch, with no per-row generator.
    The log prob is log_softmax(scores / temperature)[token], as on the host. One transfer to the
    host for the whole batch.
    """
    import torch

    device = logits.device
    index = torch.tensor(list(rows), dtype=torch.long).to(device, non_blocking=True)
    scores = logits.index_select(0, index)
    greedy_rows = [p.greedy for p in params]
    if all(greedy_rows):
        tokens = torch.argmax(scores, dim=-1)
        log_probs = torch.log_softmax(scores, dim=-1)
    else:
        vocab = scores.shape[-1]
        host = torch.tensor(
            [
                (
                    1.0 if p.greedy else p.temperature,
                    float(min(p.top_k, vocab)) if p.top_k > 0 else 0.0,
                    p.top_p if 0.0 < p.top_p < 1.0 else 2.0,
                    float(g),
                )
                for p, g in zip(params, greedy_rows, strict=True)
            ],
            dtype=torch.float32,
        )
        knobs = host.to(device, non_blocking=True)
        keys = torch.tensor(list(noise_keys), dtype=torch.long).to(device, non_blocking=True)
        scaled = scores / knobs[:, 0:1]
        log_probs = torch.log_softmax(scaled, dim=-1)
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        top_k = knobs[:, 1].long()
        kth = ordered.gather(1, (top_k - 1).clamp(min=0)[:, None])
        kept = scaled.masked_fill((top_k[:, None] > 0) & (scaled < kth), NEG_INF)
        probs = torch.softmax(kept, dim=-1)
        sorted_probs = probs.gather(1, order)
        drop_sorted = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= knobs[:, 2:3]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        kept = kept.masked_fill(drop, NEG_INF)
        ids = torch.arange(vocab, device=device, dtype=torch.long)
        bits = _hash32(_hash32((keys[:, None] + ids[None, :] * 0x9E3779B9) & 0xFFFFFFFF) ^ keys[:, None])
        uniform = ((bits >> 8).float() + 0.5) * (1.0 / 2**24)
        drawn = torch.argmax(kept - torch.log(-torch.log(uniform)), dim=-1)
        tokens = torch.where(knobs[:, 3] > 0, torch.argmax(scores, dim=-1), drawn)
    picked = log_probs.gather(1, tokens[:, None])[:, 0]
    both = torch.stack([tokens.double(), picked.double()]).cpu()
    return [int(t) for t in both[0].tolist()], both[1].tolist()


class TransformersRunner:
    """A transformers causal LM with one batched KV cache; rows are left-padded to a common length.

    Each row's cache holds its prompt and generated tokens except the last one, which is fed by the next
    decode step at its true position; the attention mask hides the left padding. A single sequence is
    computed exactly as ``model.generate`` computes it.
    """

    def __init__(self, model_dir: str, threads: int, *, device: str = "cpu", dtype: str = "float32") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        check_engine_device(device, dtype)
        torch.set_num_threads(threads)
        self._torch = torch
        self.device = torch.device(device)
        self.on_cpu = self.device.type == "cpu"
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        if not self.on_cpu:
            # PyTorch's cuDNN attention builds a cuDNN graph for each new shape, and the KV length
            # grows by one every decode step: profiled on an H100, 9.4 ms of host time a layer a
            # step (75 ms a step for 8 layers, whatever the batch). The flash and memory-efficient
            # kernels take any length at no such cost.
            torch.backends.cuda.enable_cudnn_sdp(False)
            self.model.to(self.device)
        self.model.eval()
        config = self.model.config
        self.vocab_size = int(config.get_text_config().vocab_size)
        self.max_positions: int | None = getattr(config.get_text_config(), "max_position_embeddings", None)
        self._keys: list[Any] = []
        self._values: list[Any] = []
        self._uids: list[int] = []
        self._pads: list[int] = []
        # Each row's LoRA adapter (None: the base model), in ``_uids`` order.
        self._row_adapters: list[LoraAdapter | None] = []
        # During a forward: (adapter, its rows) for the modules' hooks; empty when no row has one.
        self._lora_rows: list[tuple[LoraAdapter, Any]] = []
        self.lora_shapes: dict[tuple[int, int], tuple[int, int]] = {}

    def enable_lora(self, module_ids: Sequence[int]) -> None:
        """Hook the modules LoRA adapters may adapt (``lora_target_modules``) in every decoder layer;
        each adds its rows' low-rank updates, x A^T B^T, to its output."""
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if layers is None:
            raise EngineError("LoRA needs a decoder model with model.layers")
        for layer_index, layer in enumerate(layers):
            for module_id in module_ids:
                module: Any = layer
                for part in LORA_MODULES[module_id][1].split("."):
                    module = getattr(module, part, None)
                if module is None or not hasattr(module, "in_features"):
                    raise EngineError(
                        f"lora_target_modules names {LORA_MODULES[module_id][0]}, which this model "
                        "does not have"
                    )
                self.lora_shapes[(layer_index, module_id)] = (
                    int(module.in_features),
                    int(module.out_features),
                )
                module.register_forward_hook(self._lora_hook(layer_index, module_id))

    def lora_tensor(self, value: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(value)).to(self.device, dtype=self.model.dtype)

    def _lora_hook(self, layer: int, module_id: int) -> Callable[..., Any]:
        key = (layer, module_id)

        def hook(module: Any, inputs: tuple[Any, ...], output: Any) -> Any:
            if not self._lora_rows:
                return None
            x = inputs[0]
            for adapter, rows in self._lora_rows:
                pair = adapter.modules.get(key)
                if pair is None:
                    continue
                a, b = pair
                if rows is None:
                    output = output + (x @ a.T) @ b.T
                else:
                    output = output.index_add(0, rows, (x.index_select(0, rows) @ a.T) @ b.T)
            return output

        return hook

    @contextlib.contextmanager
    def _lora(self, adapters: Sequence[LoraAdapter | None]) -> Any:
        """The rows of the next forward and their adapters (rows in batch order)."""
        if not any(a is not None for a in adapters):
            yield
            return
        distinct = {id(a): a for a in adapters if a is not None}
        if len(distinct) == 1 and all(a is not None for a in adapters):
            self._lora_rows = [(next(iter(distinct.values())), None)]
        else:
            torch = self._torch
            self._lora_rows = [
                (
                    adapter,
                    torch.tensor([i for i, a in enumerate(adapters) if a is adapter], dtype=torch.long).to(
                        self.device
                    ),
                )
                for adapter in distinct.values()
            ]
        try:
            yield
        finally:
            self._lora_rows = []

    @property
    def batch_size(self) -> int:
        return len(self._uids)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    def _image_inputs(self, ids: Any, prompt_table: np.ndarray) -> dict[str, Any]:
        """The prompt table's rows as the model's image features, in place of the ids that stand
        for them (rewritten in ``ids`` to the model's image token): what a vision-language model's
        forward takes after its vision tower, so the result is ``generate``'s for the same images.
        Image tokens get token type 1, which some models (Gemma 3) read to let an image's tokens
        attend to each other both ways."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        torch = self._torch
        image_token = getattr(self.model.config, "image_token_id", None)
        if image_token is None:
            raise EngineError(
                "prompt_embedding_table needs a vision-language model (its config has no image_token_id)"
            )
        fake = ids >= self.vocab_size
        rows = ids[fake] - self.vocab_size
        ids[fake] = int(image_token)
        table = torch.from_numpy(np.ascontiguousarray(prompt_table)).to(self.device, dtype=self.model.dtype)
        features = table[rows.to(self.device)][None]
        return {
            "token_type_ids": fake.long().to(self.device),
            "mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=features)},
        }

    def prefill(
        self,
        prompt: list[int],
        want_context_logits: bool,
        adapter: LoraAdapter | None = None,
        prompt_table: np.ndarray | None = None,
    ) -> tuple[Any, np.ndarray | None, Any]:
        torch = self._torch
        with torch.inference_mode(), self._lora([adapter]):
            ids = torch.tensor([prompt], dtype=torch.long)
            extra = {} if prompt_table is None else self._image_inputs(ids, prompt_table)
            out = self.model(input_ids=ids if self.on_cpu else ids.to(self.device), use_cache=True, **extra)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        context = out.logits[0].float().cpu().numpy().copy() if want_context_logits else None
        last = out.logits[0, -1].float()
        # A new sequence's first token is sampled on the host (one row, once per request), with the
        # same code as the CPU engine's; only decode steps sample on the device.
        return (last if self.on_cpu else last.cpu()), context, kv

    def prefill_batch(
        self,
        prompts: list[list[int]],
        want_context_logits: list[bool],
        adapters: Sequence[LoraAdapter | None] = (),
    ) -> tuple[Any, list[np.ndarray | None], Any, list[int]]:
        """One forward of several prompts, left-padded to the longest: their last logits ([n, vocab]
        float32 on the host, one transfer), context logits where asked, the KV cache ([n, ...], padded)
        and each row's padding."""
        torch = self._torch
        width = max(len(p) for p in prompts)
        pads = [width - len(p) for p in prompts]
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (prompt, pad) in enumerate(zip(prompts, pads, strict=True)):
            ids[row, pad:] = torch.tensor(prompt, dtype=torch.long)
            mask[row, pad:] = 1
        positions = (torch.arange(width)[None, :] - torch.tensor(pads)[:, None]).clamp(min=0)
        want_any = any(want_context_logits)
        with torch.inference_mode(), self._lora(adapters or [None] * len(prompts)):
            out = self.model(
                input_ids=ids.to(self.device, non_blocking=True),
                attention_mask=mask.to(self.device, non_blocking=True),
                position_ids=positions.to(self.device, non_blocking=True),
                use_cache=True,
                # Only the last position's logits unless a request wants the context's.
                logits_to_keep=0 if want_any else 1,
            )
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        lasts = out.logits[:, -1].float().cpu()
        contexts = [
            out.logits[row, pad:].float().cpu().numpy().copy() if want else None
            for row, (pad, want) in enumerate(zip(pads, want_context_logits, strict=True))
        ]
        return lasts, contexts, kv, pads

    def add_rows(
        self,
        rows: list[tuple[int, list[int]]],
        kv: list[tuple[Any, Any]],
        pads: list[int],
        adapters: Sequence[LoraAdapter | None] = (),
    ) -> None:
        """Join sequences to the batch from a ``prefill_batch``: (row of kv, the uids continuing it)."""
        torch = self._torch
        index = [row for row, uids in rows for _ in uids]
        if not index:
            return
        uids = [uid for _, group in rows for uid in group]
        self._row_adapters.extend(adapters[row] if adapters else None for row in index)
        new_pads = [pads[row] for row in index]
        picked = torch.tensor(index, dtype=torch.long).to(self.device)
        keys = [k.index_select(0, picked) for k, _ in kv]
        values = [v.index_select(0, picked) for _, v in kv]
        if not self._uids:
            self._keys, self._values, self._uids, self._pads = keys, values, uids, new_pads
            return
        pad = torch.nn.functional.pad
        current, length = int(self._keys[0].shape[2]), int(keys[0].shape[2])
        target = max(current, length)
        grow_old, grow_new = target - current, target - length
        self._keys = [
            torch.cat([pad(old, (0, 0, grow_old, 0)), pad(new, (0, 0, grow_new, 0))])
            for old, new in zip(self._keys, keys, strict=True)
        ]
        self._values = [
            torch.cat([pad(old, (0, 0, grow_old, 0)), pad(new, (0, 0, grow_new, 0))])
            for old, new in zip(self._values, values, strict=True)
        ]
        self._pads = [p + grow_old for p in self._pads] + [p + grow_new for p in new_pads]
        self._uids.extend(uids)

    def add(self, uids: list[int], kv: list[tuple[Any, Any]], adapter: LoraAdapter | None = None) -> None:
        torch = self._torch
        pad = torch.nn.functional.pad
        self._row_adapters.extend([adapter] * len(uids))
        length = int(kv[0][0].shape[2])
        if not self._uids:
            self._keys = [k.expand(len(uids), -1, -1, -1).contiguous() for k, _ in kv]
            self._values = [v.expand(len(uids), -1, -1, -1).contiguous() for _, v in kv]
            self._uids = list(uids)
            self._pads = [0] * len(uids)
            return
        current = int(self._keys[0].shape[2])
        target = max(current, length)
        grow_old, grow_new = target - current, target - length
        self._keys = [
            torch.cat(
                [pad(old, (0, 0, grow_old, 0)), pad(k, (0, 0, grow_new, 0)).expand(len(uids), -1, -1, -1)]
            )
            for old, (k, _) in zip(self._keys, kv, strict=True)
        ]
        self._values = [
            torch.cat(
                [pad(old, (0, 0, grow_old, 0)), pad(v, (0, 0, grow_new, 0)).expand(len(uids), -1, -1, -1)]
            )
            for old, (_, v) in zip(self._values, kv, strict=True)
        ]
        self._pads = [p + grow_old for p in self._pads] + [grow_new] * len(uids)
        self._uids.extend(uids)

    def remove(self, uids: Iterable[int]) -> None:
        gone = set(uids)
        keep = [i for i, uid in enumerate(self._uids) if uid not in gone]
        if len(keep) == len(self._uids):
            return
        if not keep:
            self._keys, self._values, self._uids, self._pads = [], [], [], []
            self._row_adapters = []
            return
        self._row_adapters = [self._row_adapters[i] for i in keep]
        torch = self._torch
        index = torch.tensor(keep, dtype=torch.long)
        if not self.on_cpu:
            index = index.to(self.device)
        self._uids = [self._uids[i] for i in keep]
        self._pads = [self._pads[i] for i in keep]
        # Columns that are padding in every remaining row are dead weight in every later step.
        trim = min(self._pads)
        self._keys = [k.index_select(0, index)[:, :, trim:] for k in self._keys]
        self._values = [v.index_select(0, index)[:, :, trim:] for v in self._values]
        self._pads = [p - trim for p in self._pads]

    @property
    def uids(self) -> list[int]:
        """The sequences in the batch, in the order of the rows ``decode_batch`` returns."""
        return self._uids

    def decode(self, feed: dict[int, int]) -> dict[int, Any]:
        """One batched forward of every row's pending token; returns each row's next-token logits."""
        logits = self.decode_batch(feed)
        return {uid: logits[row] for row, uid in enumerate(self._uids)}

    def decode_batch(self, feed: dict[int, int]) -> Any:
        """One batched forward of every row's pending token: the next-token logits, [rows, vocab]
        float32 on the runner's device, rows in ``uids`` order."""
        from transformers import DynamicCache

        torch = self._torch
        length = int(self._keys[0].shape[2])
        input_ids = torch.tensor([[feed[uid]] for uid in self._uids], dtype=torch.long)
        if self.on_cpu:
            mask = torch.ones((len(self._uids), length + 1), dtype=torch.long)
            for row, pad in enumerate(self._pads):
                mask[row, :pad] = 0
            positions = torch.tensor([[length - pad] for pad in self._pads], dtype=torch.long)
        else:
            # Three small host-to-device copies a step; the mask is built on the device.
            pads = torch.tensor(self._pads, dtype=torch.long).to(self.device, non_blocking=True)
            input_ids = input_ids.to(self.device, non_blocking=True)
            columns = torch.arange(length + 1, device=self.device)
            mask = (columns[None, :] >= pads[:, None]).long()
            positions = (length - pads)[:, None]
        cache = DynamicCache(ddp_cache_data=list(zip(self._keys, self._values, strict=True)))
        with torch.inference_mode(), self._lora(self._row_adapters):
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
        self._keys = [layer.keys for layer in out.past_key_values.layers]
        self._values = [layer.values for layer in out.past_key_values.layers]
        return out.logits[:, -1].float()


def _prefill_chunks(pending: list[Any], budget: int) -> Iterable[list[Any]]:
    """Consecutive runs of (group, prompt, params, seqs) whose padded width x count fits ``budget``
    (a prompt longer than the budget runs alone)."""
    chunk: list[Any] = []
    width = 0
    for item in pending:
        wider = max(width, len(item[1]))
        if chunk and wider * (len(chunk) + 1) > budget:
            yield chunk
            chunk, wider = [], len(item[1])
        chunk.append(item)
        width = wider
    if chunk:
        yield chunk


def _samples_on_device(seq: _Sequence) -> bool:
    """Whether ``sample_on_device`` computes this sequence's next token as ``_sample_and_accept`` would."""
    params = seq.params
    return (
        (params.embedding_bias is None or not params.embedding_bias.size)
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
        and not params.bad_words
        and not (params.end_id is not None and len(seq.generated) < params.min_tokens)
        and seq.grammar is None
        and not seq.group.options.return_generation_logits
    )


def _ends_with(tokens: list[int], word: tuple[int, ...]) -> bool:
    return len(tokens) >= len(word) and tuple(tokens[-len(word) :]) == word


class Engine:
    """The in-flight batching loop. ``submit`` and ``stop_request`` may be called from any thread."""

    def __init__(
        self,
        *,
        runner: TransformersRunner | None,
        synthetic_candidates: Sequence[int] = (),
        synthetic_step_s: float = 0.0,
        max_active: int = 1024,
        on_step: Callable[[StepStats], None] | None = None,
        kv_cache: KvCacheManager | None = None,
        synthetic_prefill_s_per_token: float = 0.0,
        lora_cache: LoraCache | None = None,
    ) -> None:
        if runner is None and not synthetic_candidates:
            raise ValueError("synthetic mode needs candidate token ids")
        self._runner = runner
        self._candidates = list(synthetic_candidates)
        self._step_s = synthetic_step_s
        self._max_active = max_active
        self._on_step = on_step
        self._kv = kv_cache
        self._prefill_s_per_token = synthetic_prefill_s_per_token
        self.lora_cache = lora_cache
        self._rejected = 0
        self._lock = threading.Condition()
        self._pending: collections.deque[RequestGroup] = collections.deque()
        self._stop_ids: set[str] = set()
        self._active: list[_Sequence] = []
        self._groups: dict[int, RequestGroup] = {}
        # Context phases waiting for this step's batched prefill (GPU runners only).
        self._deferred: list[tuple[RequestGroup, list[int], SamplingParams, list[_Sequence]]] = []
        self._next_uid = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self._steps = 0
        self._tokens = 0
        self._batched_tokens = 0
        self._completed = 0
        self._cancelled = 0
        self._max_batch = 0

    @property
    def vocab_size(self) -> int | None:
        return self._runner.vocab_size if self._runner is not None else None

    @property
    def max_positions(self) -> int | None:
        return self._runner.max_positions if self._runner is not None else None

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="cpu-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._running = False
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        leftovers = {id(s.group): s.group for s in self._active}
        leftovers.update({id(g): g for g in self._pending})
        for group in leftovers.values():
            self._fail(group, "the engine is shutting down")

    def submit(self, group: RequestGroup) -> None:
        table_rows = 0
        if group.prompt_table is not None:
            if self._runner is None:
                raise EngineError(
                    "prompt_embedding_table needs engine_mode=model (synthetic mode has no model)"
                )
            if group.prompt_table.ndim != 2 or group.prompt_table.shape[1] != self._runner.hidden_size:
                raise EngineError(
                    f"prompt_embedding_table must be [rows, {self._runner.hidden_size}], "
                    f"got {list(group.prompt_table.shape)}"
                )
            table_rows = int(group.prompt_table.shape[0])
        for prompt, params in zip(group.prompts, group.params, strict=True):
            self._check_request(prompt, params, table_rows)
        if group.lora is not None:
            if self.lora_cache is None:
                raise EngineError("LoRA is not enabled on this model (set its lora_target_modules parameter)")
            try:
                group.adapter = self.lora_cache.acquire(group.lora)
            except EngineError as exc:
                # The executor's wrapping of a request it cannot enqueue (TensorRT-LLM v0.19 and later).
                self._rejected += 1
                raise EngineError(
                    f"Executor failed process requestId {self._rejected} due to the following error: {exc}"
                ) from None
        group.unfinished = group.unsent_results = len(group.prompts) * group.num_return_sequences
        with self._lock:
            # Waiting requests start by priority, first come first served within one (as the
            # executor's scheduler orders its queue); behind every equal or higher one.
            place = len(self._pending)
            while place > 0 and self._pending[place - 1].priority < group.priority:
                place -= 1
            self._pending.insert(place, group)
            self._lock.notify_all()

    def stop_request(self, request_id: str) -> None:
        """The ``stop`` input: finish the in-flight requests with this id at the next step."""
        with self._lock:
            self._stop_ids.add(request_id)
            self._lock.notify_all()

    def _check_request(self, prompt: list[int], params: SamplingParams, table_rows: int = 0) -> None:
        if not prompt:
            raise EngineError("input_ids must not be empty")
        if params.max_new_tokens < 1:
            raise EngineError(f"request_output_len must be >= 1, got {params.max_new_tokens}")
        vocab = self.vocab_size
        if vocab is not None:
            bad = [t for t in prompt if not 0 <= t < vocab + table_rows]
            if bad:
                raise EngineError(
                    f"input_ids out of the vocabulary range [0, {vocab}) and the prompt table's "
                    f"[{vocab}, {vocab + table_rows}): {bad[:5]}"
                )
            if params.embedding_bias is not None and params.embedding_bias.size > vocab:
                raise EngineError(
                    f"embedding_bias has {params.embedding_bias.size} entries, vocabulary is {vocab}"
                )
        limit = self.max_positions
        if limit is not None and len(prompt) + params.max_new_tokens > limit:
            raise EngineError(
                f"input length {len(prompt)} + request_output_len {params.max_new_tokens} exceeds the "
                f"model's maximum sequence length {limit}"
            )
        if params.temperature < 0 or params.top_k < 0 or not 0.0 <= params.top_p <= 1.0:
            raise EngineError("temperature and runtime_top_k must be >= 0 and runtime_top_p in [0, 1]")
        if params.repetition_penalty <= 0:
            raise EngineError("repetition_penalty must be > 0")
        if params.guide is not None and self._runner is None:
            raise EngineError("guided decoding needs engine_mode=model (synthetic mode has no logits)")

    # ---- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        next_step = time.monotonic()
        while True:
            idle = False
            with self._lock:
                while self._running and not self._active and not self._pending:
                    idle = True
                    self._lock.wait()
                if not self._running:
                    return
            if self._runner is None and self._step_s > 0:
                # Synthetic pacing: a fixed step interval, like a real engine's per-iteration latency.
                if idle:
                    # An idle engine starts its next step when a request arrives, so the first
                    # token comes one step after it. Keeping the interval of the steps before the
                    # idle time would make time to first token depend on when the previous
                    # request ended: a client that is slower between requests would wait less.
                    next_step = time.monotonic() + self._step_s
                delay = next_step - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_step = max(next_step + self._step_s, time.monotonic())
            try:
                self._step()
            except Exception:
                logger.exception("engine step failed; failing the active requests")
                for group in {id(s.group): s.group for s in self._active}.values():
                    self._fail(group, "internal engine error (see the server log)")
                self._purge_finished()

    def _step(self) -> None:
        with self._lock:
            stop_ids, self._stop_ids = self._stop_ids, set()
        tokens_before = self._tokens
        self._drop_cancelled(stop_ids)
        running = [s for s in self._active if not s.finished]
        if running:
            self._decode(running)
        admitted, context_tokens, context_requests = self._admit(stop_ids)
        now = time.time_ns()
        scheduled = running + admitted
        for seq in scheduled:
            if seq.unsent:
                seq.last_token_ns = now
                if not seq.first_token_ns:
                    seq.first_token_ns = now
        self._emit(scheduled)
        self._steps += 1
        self._max_batch = max(self._max_batch, len(scheduled))
        if len(scheduled) > 1:
            self._batched_tokens += self._tokens - tokens_before
        self._purge_finished()
        if self._on_step is not None:
            with self._lock:
                waiting = sum(len(g.prompts) * g.num_return_sequences for g in self._pending)
            self._report(
                StepStats(
                    active_requests=len({id(s.group) for s in self._active}) + len(self._pending),
                    waiting_requests=waiting,
                    scheduled_sequences=len(scheduled),
                    context_requests=context_requests,
                    context_tokens=context_tokens,
                    generation_sequences=len(running),
                    steps_total=self._steps,
                    generated_tokens_total=self._tokens,
                    batched_tokens_total=self._batched_tokens,
                    completed_requests_total=self._completed,
                    cancelled_requests_total=self._cancelled,
                    max_batch_size=self._max_batch,
                    kv_cache=self._kv.stats() if self._kv is not None else None,
                )
            )

    def _purge_finished(self) -> None:
        done = [s for s in self._active if s.finished or s.group.closed]
        if done:
            if self._kv is not None:
                for seq in done:
                    if seq.blocks is not None:
                        self._kv.release(seq.blocks, seq.prompt + seq.generated, seq.group.kv_key)
            if self._runner is not None:
                self._runner.remove(s.uid for s in done if s.in_runner)
            self._active = [s for s in self._active if not (s.finished or s.group.closed)]

    def _report(self, stats: StepStats) -> None:
        # Observability must never take requests down with it.
        try:
            if self._on_step is not None:
                self._on_step(stats)
        except Exception:
            logger.exception("reporting engine statistics failed")

    def _drop_cancelled(self, stop_ids: set[str]) -> None:
        groups = {id(s.group): s.group for s in self._active}
        for group in groups.values():
            if group.closed:
                continue
            if group.sink.is_cancelled():
                self._cancelled += 1
                self._close(group, error="request cancelled")
            elif group.request_id and group.request_id in stop_ids:
                self._stop_group(group)
        self._purge_finished()

    def _stop_group(self, group: RequestGroup) -> None:
        """Finish a request early (``stop`` input), sending what it generated so far."""
        unfinished = [s for s in self._active if s.group is group and not s.finished]
        for seq in unfinished:
            self._finish(seq)
        if group.options.streaming:
            self._send(group, None, final=True)
        else:
            for seq in unfinished:
                group.unsent_results -= 1
                tensors = self._tensors(seq, self._full_output(seq), streamed=False)
                self._send(group, tensors, final=group.unsent_results == 0)
        self._mark_closed(group)
        self._completed += 1

    def _admit(self, stop_ids: set[str]) -> tuple[list[_Sequence], int, int]:
        admitted: list[_Sequence] = []
        context_tokens = context_requests = 0
        while True:
            with self._lock:
                if not self._pending:
                    break
                group = self._pending[0]
                size = len(group.prompts) * group.num_return_sequences
                # An oversized group still runs alone rather than waiting forever.
                busy = bool(self._active or admitted)
                if busy and len(self._active) + len(admitted) + size > self._max_active:
                    break
                # Like TensorRT-LLM's guaranteed_no_evict scheduler: wait for KV blocks to free up.
                if (
                    busy
                    and self._kv is not None
                    and not all(self._kv.can_start(p, group.kv_key) for p in group.prompts)
                ):
                    break
                self._pending.popleft()
            if group.sink.is_cancelled():
                self._cancelled += 1
                self._close(group, error="request cancelled")
                continue
            if group.request_id and group.request_id in stop_ids:
                self._close(group, error=None)
                continue
            context_requests += 1
            try:
                for row, (prompt, params) in enumerate(zip(group.prompts, group.params, strict=True)):
                    admitted.extend(self._start_row(group, row, prompt, params))
                    context_tokens += len(prompt)
            except Exception as exc:
                logger.exception("prefill failed")
                for seq in admitted:
                    if seq.group is group and seq.in_runner and self._runner is not None:
                        self._runner.remove([seq.uid])
                    if seq.group is group and seq.blocks is not None and self._kv is not None:
                        self._kv.release(seq.blocks, seq.prompt, seq.group.kv_key)
                admitted = [s for s in admitted if s.group is not group]
                self._deferred = [d for d in self._deferred if d[0] is not group]
                self._fail(group, f"prefill failed: {exc}")
        if self._deferred:
            admitted = self._prefill_deferred(admitted)
        self._active.extend(admitted)
        return admitted, context_tokens, context_requests

    def _start_row(
        self, group: RequestGroup, row: int, prompt: list[int], params: SamplingParams
    ) -> list[_Sequence]:
        now = time.time_ns()
        seqs = []
        for index in range(group.num_return_sequences):
            self._next_uid += 1
            seq = _Sequence(self._next_uid, group, row, index, prompt, params, first_scheduled_ns=now)
            seqs.append(seq)
        if self._kv is not None:
            for seq in seqs:
                seq.blocks = self._kv.start(prompt, group.kv_key)
        if self._runner is None:
            if self._prefill_s_per_token > 0:
                # The context phase computes the prompt tokens whose KV cache was not reused.
                first = seqs[0].blocks
                cached = 0 if first is None or self._kv is None else first.reused * self._kv.tokens_per_block
                time.sleep((len(prompt) - cached) * self._prefill_s_per_token)
            for seq in seqs:
                seq.synthetic_base = synthetic_base(prompt, params.seed, seq.index)
                self._accept(seq, synthetic_token(self._candidates, seq.synthetic_base, 0), 0.0, None)
            return seqs
        if not self._runner.on_cpu and group.prompt_table is None:
            # On a GPU the context phases of a step run as one batched forward (_prefill_deferred).
            self._deferred.append((group, prompt, params, seqs))
            return seqs
        last_logits, context, kv = self._runner.prefill(
            prompt, group.options.return_context_logits, group.adapter, group.prompt_table
        )
        self._first_tokens(params, seqs, last_logits, context)
        live = [s for s in seqs if not s.finished]
        if live:
            self._runner.add([s.uid for s in live], kv, group.adapter)
            for seq in live:
                seq.in_runner = True
        return seqs

    def _first_tokens(
        self, params: SamplingParams, seqs: list[_Sequence], last_logits: Any, context: np.ndarray | None
    ) -> None:
        """Sample each new sequence's first token from its prompt's last logits (on the host)."""
        import torch

        for seq in seqs:
            seq.context_logits = context
            if params.guide is not None:
                # Each sequence (num_return_sequences > 1 too) walks the grammar on its own.
                seq.grammar = params.guide.matcher(params.end_id)
            if not params.greedy:
                # Sequences of one request sample independently: each index gets its own stream.
                seq.generator = torch.Generator().manual_seed((params.seed + seq.index * 0x9E3779B1) % 2**63)
            self._sample_and_accept(seq, last_logits)

    def _prefill_deferred(self, admitted: list[_Sequence]) -> list[_Sequence]:
        """The step's context phases on a GPU: left-padded prompts in batched forwards of at most
        PREFILL_BATCH_TOKENS (padded) tokens, one transfer of their last logits to the host each; a
        request whose prefill fails gets an error and leaves the batch, the others go on."""
        assert self._runner is not None
        pending, self._deferred = self._deferred, []
        failed: dict[int, tuple[RequestGroup, str]] = {}
        for chunk in _prefill_chunks(pending, PREFILL_BATCH_TOKENS):
            try:
                lasts, contexts, kv, pads = self._runner.prefill_batch(
                    [prompt for _, prompt, _, _ in chunk],
                    [group.options.return_context_logits for group, _, _, _ in chunk],
                    [group.adapter for group, _, _, _ in chunk],
                )
            except Exception as exc:
                logger.exception("prefill failed")
                for group, _, _, _ in chunk:
                    failed.setdefault(id(group), (group, f"prefill failed: {exc}"))
                continue
            rows: list[tuple[int, list[_Sequence]]] = []
            for i, (group, _, params, seqs) in enumerate(chunk):
                if id(group) in failed:
                    continue
                try:
                    self._first_tokens(params, seqs, lasts[i], contexts[i])
                except Exception as exc:
                    logger.exception("prefill failed")
                    failed[id(group)] = (group, f"prefill failed: {exc}")
                    continue
                rows.append((i, [s for s in seqs if not s.finished]))
            self._runner.add_rows(
                [(i, [s.uid for s in live]) for i, live in rows],
                kv,
                pads,
                [group.adapter for group, _, _, _ in chunk],
            )
            for _, live in rows:
                for seq in live:
                    seq.in_runner = True
        if not failed:
            return admitted
        for seq in admitted:
            if id(seq.group) in failed:
                if seq.in_runner:
                    self._runner.remove([seq.uid])
                if seq.blocks is not None and self._kv is not None:
                    self._kv.release(seq.blocks, seq.prompt, seq.group.kv_key)
        for group, message in failed.values():
            self._fail(group, message)
        return [s for s in admitted if id(s.group) not in failed]

    def _decode(self, running: list[_Sequence]) -> None:
        if self._runner is None:
            for seq in running:
                self._accept(
                    seq, synthetic_token(self._candidates, seq.synthetic_base, len(seq.generated)), 0.0, None
                )
            return
        feed = {s.uid: s.generated[-1] for s in running}
        if self._runner.on_cpu:
            logits = self._runner.decode(feed)
            for seq in running:
                self._sample_and_accept(seq, logits[seq.uid])
            return
        # On a GPU: plain rows are sampled there in one batch; the rest (penalties, bans, grammar,
        # logits outputs) get their rows copied to the host in one transfer and the CPU engine's code.
        batch = self._runner.decode_batch(feed)
        row_of = {uid: row for row, uid in enumerate(self._runner.uids)}
        plain = [s for s in running if _samples_on_device(s)]
        other = [s for s in running if not _samples_on_device(s)]
        if plain:
            tokens, log_probs = sample_on_device(
                batch,
                [row_of[s.uid] for s in plain],
                [s.params for s in plain],
                [sequence_noise_key(s.params.seed, s.index, len(s.generated)) for s in plain],
            )
            for seq, token, log_prob in zip(plain, tokens, log_probs, strict=True):
                self._accept(seq, token, log_prob, None)
        if other:
            import torch

            index = torch.tensor([row_of[s.uid] for s in other], dtype=torch.long).to(batch.device)
            host = batch.index_select(0, index).cpu()
            for i, seq in enumerate(other):
                self._sample_and_accept(seq, host[i])

    def _sample_and_accept(self, seq: _Sequence, logits: Any) -> None:
        """Pick the next token from ``logits`` (the model's raw row) and record its log prob.

        scores = logits + embedding_bias -> repetition/presence/frequency penalties -> bad words and
        min_tokens bans -> grammar mask (-inf outside the grammar) -> / temperature (sampling only).
        The log prob is log_softmax(scores)[token], before top-k/top-p truncation: for greedy decoding
        or temperature 1 with no bias, penalty or ban it is exactly log_softmax(logits)[token].
        """
        import torch

        params = seq.params
        scores = logits.clone()
        if params.embedding_bias is not None and params.embedding_bias.size:
            bias = torch.from_numpy(np.asarray(params.embedding_bias, dtype=np.float32))
            scores[: bias.numel()] += bias
        self._apply_penalties(seq, scores)
        unbanned = scores.clone() if seq.grammar is not None else None
        for word in params.bad_words:
            if len(word) == 1 or _ends_with(seq.generated, word[:-1]):
                scores[word[-1]] = NEG_INF
        if (
            params.end_id is not None
            and 0 <= params.end_id < scores.numel()
            and len(seq.generated) < params.min_tokens
        ):
            scores[params.end_id] = NEG_INF
        if seq.grammar is not None and unbanned is not None:
            seq.grammar.fill()
            seq.grammar.mask(scores)
            if not bool(torch.isfinite(scores).any()):
                # Bad words or min_tokens forbid everything the grammar allows: the grammar wins.
                scores = unbanned
                seq.grammar.mask(scores)
                if not bool(torch.isfinite(scores).any()):
                    logger.warning("the grammar allows no token of the vocabulary; ending the sequence")
                    self._finish(seq)
                    return
        if params.greedy:
            token = int(torch.argmax(scores))
            log_probs = torch.log_softmax(scores, dim=-1)
        else:
            scores = scores / params.temperature
            log_probs = torch.log_softmax(scores, dim=-1)
            token = self._sample(scores, params, seq.generator)
        raw = logits.numpy().copy() if seq.group.options.return_generation_logits else None
        if seq.grammar is not None:
            seq.grammar.accept(token)
            if seq.grammar.terminated:
                if token in seq.grammar.stop_token_ids:
                    # The grammar is complete and its stop token was chosen: like end_id, not emitted.
                    self._finish(seq)
                else:
                    self._accept(seq, token, float(log_probs[token]), raw)
                    self._finish(seq)
                return
        self._accept(seq, token, float(log_probs[token]), raw)

    @staticmethod
    def _apply_penalties(seq: _Sequence, scores: Any) -> None:
        import torch

        params = seq.params
        if params.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.prompt) | set(seq.generated)), dtype=torch.long)
            picked = scores[seen]
            scores[seen] = torch.where(
                picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty
            )
        if (params.presence_penalty or params.frequency_penalty) and seq.generated:
            ids, counts = np.unique(np.asarray(seq.generated), return_counts=True)
            index = torch.from_numpy(ids.astype(np.int64))
            penalty = params.presence_penalty + params.frequency_penalty * torch.from_numpy(
                counts.astype(np.float32)
            )
            scores[index] -= penalty

    @staticmethod
    def _sample(scores: Any, params: SamplingParams, generator: Any) -> int:
        import torch

        if params.top_k > 0:
            k = min(params.top_k, scores.numel())
            threshold = torch.topk(scores, k).values[-1]
            scores = scores.masked_fill(scores < threshold, NEG_INF)
        probs = torch.softmax(scores, dim=-1)
        if 0.0 < params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = cumulative - sorted_probs >= params.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=generator))

    def _accept(self, seq: _Sequence, token: int, log_prob: float, logits: np.ndarray | None) -> None:
        params = seq.params
        if params.end_id is not None and token == params.end_id:
            # Like TensorRT-LLM, the end token is not part of the output.
            self._finish(seq)
            return
        seq.generated.append(token)
        seq.log_probs.append(log_prob)
        if logits is not None:
            seq.generation_logits.append(logits)
        seq.unsent += 1
        self._tokens += 1
        if seq.blocks is not None and self._kv is not None:
            self._kv.grow(seq.blocks, len(seq.prompt) + len(seq.generated))
        if len(seq.generated) >= params.max_new_tokens or any(
            _ends_with(seq.generated, w) for w in params.stop_words
        ):
            self._finish(seq)

    def _finish(self, seq: _Sequence) -> None:
        if not seq.finished:
            seq.finished = True
            seq.group.unfinished -= 1

    # ---- responses --------------------------------------------------------------------------------

    def _emit(self, scheduled: list[_Sequence]) -> None:
        for seq in scheduled:
            group = seq.group
            if group.closed:
                continue
            if group.options.streaming:
                if seq.unsent:
                    self._send(
                        group, self._tensors(seq, seq.generated[-seq.unsent :], streamed=True), final=False
                    )
            elif seq.finished:
                group.unsent_results -= 1
                tensors = self._tensors(seq, self._full_output(seq), streamed=False)
                self._send(group, tensors, final=group.unsent_results == 0)
            seq.unsent = 0
        for group in {id(s.group): s.group for s in scheduled}.values():
            if not group.closed and group.unfinished == 0:
                # Streaming ends with an empty final response once every sequence of the request is done.
                if group.options.streaming:
                    self._send(group, None, final=True)
                self._mark_closed(group)
                self._completed += 1

    def _full_output(self, seq: _Sequence) -> list[int]:
        return seq.generated if seq.group.options.exclude_input else seq.prompt + seq.generated

    def _tensors(self, seq: _Sequence, tokens: list[int], *, streamed: bool) -> dict[str, np.ndarray]:
        group, options, declared = seq.group, seq.group.options, seq.group.declared_outputs
        count = len(tokens)
        new = len(tokens) if streamed else len(seq.generated)
        tensors = {
            "output_ids": np.asarray(tokens, dtype=np.int32).reshape(1, 1, count),
            "sequence_length": np.asarray([[count]], dtype=np.int32),
        }
        if options.return_log_probs:
            span = seq.log_probs[-new:] if new else []
            tensors["cum_log_probs"] = np.asarray([[sum(seq.log_probs)]], dtype=np.float32)
            tensors["output_log_probs"] = np.asarray(span, dtype=np.float32).reshape(1, 1, len(span))
        if options.return_generation_logits and seq.generation_logits:
            rows = seq.generation_logits[-new:] if new else []
            if rows:
                tensors["generation_logits"] = np.stack(rows)[None, None].astype(np.float32)
        first_response = not streamed or len(seq.generated) == new
        if options.return_context_logits and seq.context_logits is not None and first_response:
            tensors["context_logits"] = seq.context_logits[None].astype(np.float32)
        if len(group.prompts) > 1:
            tensors["batch_index"] = np.asarray([[seq.row]], dtype=np.int32)
        if group.num_return_sequences > 1:
            tensors["sequence_index"] = np.asarray([[seq.index]], dtype=np.int32)
        # Streaming counts are per response, so a client summing them gets the totals.
        if options.return_num_input_tokens and first_response:
            tensors["num_input_tokens"] = np.asarray([[len(seq.prompt)]], dtype=np.int32)
        if options.return_num_output_tokens:
            tensors["num_output_tokens"] = np.asarray([[new]], dtype=np.int32)
        if options.return_perf_metrics:
            # The sequence's KV blocks so far (zero without a block manager); no speculative decoding.
            blocks = seq.blocks or SequenceBlocks()
            tensors["kv_cache_alloc_new_blocks"] = np.asarray([[blocks.new]], dtype=np.int32)
            tensors["kv_cache_reused_blocks"] = np.asarray([[blocks.reused]], dtype=np.int32)
            tensors["kv_cache_alloc_total_blocks"] = np.asarray([[blocks.allocated]], dtype=np.int32)
            tensors["arrival_time_ns"] = np.asarray([[group.arrival_ns]], dtype=np.int64)
            tensors["first_scheduled_time_ns"] = np.asarray([[seq.first_scheduled_ns]], dtype=np.int64)
            tensors["first_token_time_ns"] = np.asarray([[seq.first_token_ns]], dtype=np.int64)
            tensors["last_token_time_ns"] = np.asarray([[seq.last_token_ns]], dtype=np.int64)
            tensors["acceptance_rate"] = np.zeros((1, 1), dtype=np.float32)
            tensors["total_accepted_draft_tokens"] = np.zeros((1, 1), dtype=np.int32)
            tensors["total_draft_tokens"] = np.zeros((1, 1), dtype=np.int32)
        return {name: value for name, value in tensors.items() if name in declared}

    def _send(self, group: RequestGroup, tensors: dict[str, np.ndarray] | None, *, final: bool) -> None:
        if final:
            # Before the client can see the end: its next request may need the cache slot.
            self._release_lora(group)
        try:
            group.sink.send(tensors, final=final)
        except Exception:
            # The client is gone or the response is malformed; the request cannot continue either way.
            logger.exception("sending a response failed; dropping the request")
            if not final:
                self._close(group, error=None)

    def _close(self, group: RequestGroup, *, error: str | None) -> None:
        """End a request now: mark its sequences finished and send the final response."""
        if group.closed:
            return
        self._mark_closed(group)
        for seq in self._active:
            if seq.group is group and not seq.finished:
                seq.finished = True
        group.unfinished = group.unsent_results = 0
        try:
            group.sink.send(None, final=True, error=error)
        except Exception:
            logger.exception("sending the final response failed")

    def _mark_closed(self, group: RequestGroup) -> None:
        group.closed = True
        self._release_lora(group)

    def _release_lora(self, group: RequestGroup) -> None:
        """The request is over: its LoRA adapter may be evicted again once no other request uses it."""
        if group.adapter is not None and self.lora_cache is not None:
            self.lora_cache.release(group.adapter)
            group.adapter = None

    def _fail(self, group: RequestGroup, message: str) -> None:
        self._close(group, error=message)
