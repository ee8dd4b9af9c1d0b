"""Render a Triton model repository (preprocessing, tensorrt_llm, postprocessing, ensemble) from templates.

Backend ``native`` renders the ``tensorrt_llm`` model alone, served by the native engine (a synthetic
token clock in C, ``engines/native/``), for the gateway's engine route.

``python -m deploy.model_repo render --backend {cpu,tensorrtllm,native} --variant {current,legacy} --out DIR
--set key=value ...`` and ``python -m deploy.model_repo variables``. Every rendered ``config.pbtxt`` is
parsed into Triton's ``ModelConfig`` protobuf and the ensemble wiring is checked before anything is
moved into place.

``python -m deploy.model_repo render-llmapi --model HF_MODEL --out DIR ...`` renders a repository for
TensorRT-LLM's llmapi Python model instead (config.pbtxt and model.yaml; ``--multimodal`` for a
vision-language model).

``python -m deploy.model_repo render-multimodal --upstream ALL_MODELS --engine-dir E --visual-engine-dir V
--hf-model-dir M --out DIR`` assembles upstream's C++ multimodal repository (preprocessing ->
multimodal_encoders -> tensorrt_llm -> postprocessing) and fills in its parameters.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Final, Literal

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

logger = logging.getLogger(__name__)

TEMPLATES_DIR: Final = Path(__file__).resolve().parent.parent / "model_repo_templates"


def lora_modules_of(model_dir: Path, wanted: str) -> str:
    """The LoRA modules of `wanted` (comma-separated) that the model in `model_dir` has, read from
    its weights' names: the default names the Llama modules, which other architectures (DeepSeek V3's
    attention, gpt-oss's experts) lack, and the CPU engine refuses to load with a module it cannot
    hook. A directory without safetensors weights (a tokenizer alone, the synthetic engine) keeps
    `wanted`; the engine says so at load time if it is wrong."""
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights or not wanted:
        return wanted
    from safetensors import safe_open

    names: set[str] = set()
    for path in weights:
        with safe_open(str(path), framework="numpy") as f:
            names.update(f.keys())
    # Every decoder layer must have the module (DeepSeek V3's later layers are experts).
    layers: dict[str, set[str]] = {}
    for n in names:
        match = re.search(r"layers\.(\d+)\.(.+)\.weight$", n)
        if match:
            layers.setdefault(match.group(1), set()).add(match.group(2))
    paths = dict(load_reference_engine().LORA_MODULES.values())
    kept = [
        name
        for name in wanted.split(",")
        if name in paths and layers and all(paths[name] in held for held in layers.values())
    ]
    return ",".join(kept)


def _publish(staging: Path, out_dir: Path) -> None:
    """Put a fully rendered repository in place of `out_dir`, whole: an old one is moved aside
    first and removed only once the new one is there."""
    staging.chmod(0o755)
    if out_dir.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        out_dir.rename(retired / "repo")
        staging.rename(out_dir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(out_dir)


def load_reference_engine() -> ModuleType:
    """The CPU reference engine's `engine.py` (no Triton in it) as a module, loaded once from the
    templates: for the benchmarks and tests that drive it directly, and the native engine's renderer,
    which takes its synthetic token rule from it."""
    name = "cpu_reference_engine"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, TEMPLATES_DIR / "tensorrt_llm" / "1" / "engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


BACKENDS: Final = ("cpu", "tensorrtllm", "native")
VARIANTS: Final = ("current", "legacy")
MODELS: Final = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")
# The backends that render the four models (the native engine renders the engine model alone).
BOTH: Final = frozenset({"cpu", "tensorrtllm"})
ALL: Final = frozenset(BACKENDS)
CPU: Final = frozenset({"cpu"})
TRTLLM: Final = frozenset({"tensorrtllm"})
NATIVE: Final = frozenset({"native"})
# What each backend renders by default, and the template directory of a model where it is not the model's.
BACKEND_MODELS: Final = {"cpu": MODELS, "tensorrtllm": MODELS, "native": ("tensorrt_llm",)}
_TEMPLATE_OF: Final = {("native", "tensorrt_llm"): "native_engine"}

VariableKind = Literal["str", "path", "int", "float", "bool", "choice"]


class ModelRepoError(Exception):
    """Base class of every rendering failure; the message says what to fix."""


class TemplateVariableError(ModelRepoError):
    """A variable is unknown, missing, malformed or not applicable; ``variable`` names it."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"template variable {variable!r}: {message}")
        self.variable = variable


class TemplateSyntaxError(ModelRepoError):
    """A template file is malformed (bad directive, unbalanced ``@if``, leftover ``${...}``)."""


class ModelConfigValidationError(ModelRepoError):
    """A rendered config.pbtxt does not parse or the ensemble wiring is inconsistent."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


_REQUIRED: Final = object()


@dataclass(frozen=True, slots=True)
class Variable:
    """One template variable: its type, default (or required), applicability and meaning."""

    name: str
    kind: VariableKind
    description: str
    default: object = _REQUIRED
    backends: frozenset[str] = BOTH
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = None
    # Name of another variable whose value is the default (model_dir defaults to tokenizer_dir).
    default_from: str | None = None
    # Backends whose default differs from ``default``, as (backend, default) pairs.
    backend_defaults: tuple[tuple[str, object], ...] = ()

    def default_for(self, backend: str) -> object:
        return dict(self.backend_defaults).get(backend, self.default)

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED and self.default_from is None


_OPTIONAL_INT_LIST = r"^(\d+(,\d+)*)?$"

VARIABLES: Final[tuple[Variable, ...]] = (
    Variable(
        "tokenizer_dir",
        "path",
        "HF tokenizer directory read by preprocessing and postprocessing (native: the engine's token ids "
        "are taken from it when rendering).",
        backends=ALL,
    ),
    Variable(
        "engine_dir",
        "path",
        "TensorRT-LLM engine directory (the backend's gpt_model_path).",
        backends=TRTLLM,
    ),
    Variable(
        "model_dir",
        "path",
        "HF causal LM directory the CPU reference engine loads (engine_mode=model).",
        backends=CPU,
        default_from="tokenizer_dir",
    ),
    Variable(
        "engine_mode",
        "choice",
        "CPU engine mode: 'model' runs the transformers model; 'synthetic' emits deterministic token ids "
        "at synthetic_step_ms intervals without model compute (load tests measure the gateway).",
        default="model",
        backends=CPU,
        choices=("model", "synthetic"),
    ),
    Variable(
        "synthetic_step_ms",
        "float",
        "Synthetic mode and the native engine: milliseconds per engine step (one token per active "
        "sequence per step).",
        default=20.0,
        backends=CPU | NATIVE,
        minimum=0.0,
    ),
    Variable(
        "max_active_requests",
        "int",
        "CPU engine: sequences stepped together at most; further requests wait in the engine queue.",
        default=1024,
        backends=CPU,
        minimum=1,
    ),
    Variable(
        "engine_threads",
        "int",
        "CPU engine: torch intra-op threads (small models run best on one).",
        default=1,
        backends=CPU,
        minimum=1,
    ),
    Variable(
        "engine_device",
        "choice",
        "CPU reference engine, engine_mode=model: where torch runs the model, 'cpu' or 'cuda' (the same "
        "engine on a GPU: batched decode there, still the Python backend, not TensorRT-LLM); the model "
        "refuses to load when cuda is asked for and torch sees no GPU.",
        default="cpu",
        backends=CPU,
        choices=("cpu", "cuda"),
    ),
    Variable(
        "engine_dtype",
        "choice",
        "CPU reference engine: the model's weights and compute dtype; 'auto' is float32 on the CPU and "
        "bfloat16 on cuda.",
        default="auto",
        backends=CPU,
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    Variable(
        "name_prefix",
        "str",
        "Prefix of every model name, e.g. 'bpe_' -> bpe_ensemble composing bpe_preprocessing, ...; lets "
        "one tritonserver serve several rendered repositories.",
        default="",
        backends=ALL,
        pattern=r"^[A-Za-z0-9_-]*$",
    ),
    *(
        Variable(
            f"{step}_model",
            "str",
            f"Model the ensemble calls as its {step} step; empty: this repository's own "
            f"(name_prefix + '{default}'). With render_repository(models=...) an ensemble can "
            "compose models of another repository served by the same Triton.",
            default="",
            pattern=r"^[A-Za-z0-9_-]*$",
        )
        for step, default in (
            ("preprocessing", "preprocessing"),
            ("engine", "tensorrt_llm"),
            ("postprocessing", "postprocessing"),
        )
    ),
    Variable(
        "max_batch_size",
        "int",
        "Triton max_batch_size of all four models.",
        default=64,
        minimum=1,
        backends=ALL,
    ),
    Variable(
        "decoupled",
        "bool",
        "Decoupled transaction policy of tensorrt_llm (required for streaming).",
        default=True,
    ),
    Variable(
        "max_queue_delay_microseconds",
        "int",
        "Dynamic batcher delay of preprocessing and tensorrt_llm.",
        default=0,
        minimum=0,
        backends=ALL,
    ),
    Variable(
        "max_queue_size",
        "int",
        "Dynamic batcher queue limit of preprocessing and tensorrt_llm (0: unlimited).",
        default=0,
        minimum=0,
        backends=ALL,
    ),
    Variable("preprocessing_instance_count", "int", "Instances of preprocessing.", default=1, minimum=1),
    Variable(
        "postprocessing_instance_count",
        "int",
        "Instances of postprocessing (more than one may reorder streamed responses).",
        default=1,
        minimum=1,
    ),
    Variable(
        "engine_instance_count",
        "int",
        "Instances of tensorrt_llm (native: each runs its own generation thread).",
        default=1,
        minimum=1,
        backends=ALL,
    ),
    Variable(
        "add_special_tokens",
        "bool",
        "Preprocessing: let the tokenizer add its special tokens (e.g. BOS) to the prompt.",
        default=True,
    ),
    Variable(
        "skip_special_tokens",
        "bool",
        "Postprocessing: drop special tokens from text_output.",
        default=True,
    ),
    Variable(
        "stock_postprocessing",
        "bool",
        "Postprocessing as upstream's: each response's tokens decoded alone with tokenizer.decode "
        "(skip_special_tokens), so a streamed text loses SentencePiece spaces and splits characters "
        "into U+FFFD; false (ours): text_output holds each token's exact bytes.",
        default=False,
    ),
    Variable(
        "exclude_input_in_output",
        "bool",
        "Engine parameter: leave the prompt out of non-streaming output_ids (the stock default false "
        "echoes the prompt).",
        default=False,
        backends=ALL,
    ),
    Variable("max_beam_width", "int", "Engine parameter max_beam_width.", default=1, minimum=1),
    Variable(
        "logits_datatype",
        "choice",
        "Data type of context_logits and generation_logits.",
        default="TYPE_FP32",
        choices=("TYPE_FP32", "TYPE_FP16", "TYPE_BF16"),
    ),
    Variable(
        "ensemble_output_ids",
        "bool",
        "Ensemble also outputs the engine's output_ids and sequence_length (false: stock outputs only).",
        default=True,
    ),
    Variable(
        "batching_strategy",
        "choice",
        "Engine parameter gpt_model_type.",
        default="inflight_fused_batching",
        backends=TRTLLM,
        choices=("inflight_fused_batching", "inflight_batching", "V1"),
    ),
    Variable(
        "batch_scheduler_policy",
        "choice",
        "Engine parameter batch_scheduler_policy.",
        default="guaranteed_no_evict",
        backends=TRTLLM,
        choices=("guaranteed_no_evict", "max_utilization"),
    ),
    Variable(
        "kv_cache_free_gpu_mem_fraction",
        "float",
        "Fraction of free GPU memory the KV cache may take.",
        default=0.9,
        backends=TRTLLM,
        minimum=0.0,
        maximum=1.0,
    ),
    Variable(
        "enable_kv_cache_reuse",
        "bool",
        "Reuse KV cache blocks across requests sharing a prefix (the CPU engine models TensorRT-LLM's "
        "block reuse and reports it in the perf-metrics outputs).",
        default=False,
    ),
    Variable(
        "tokens_per_block",
        "str",
        "Tokens per KV cache block: the engine's (trtllm-build --tokens_per_block), rendered as a model "
        "parameter the gateway reads to count cached prompt tokens (tensorrtllm: empty leaves it out); "
        "the CPU engine pages its KV cache by it.",
        default="",
        backend_defaults=(("cpu", "32"),),
        pattern=r"^([1-9]\d*)?$",
    ),
    Variable(
        "gather_context_logits",
        "bool",
        "Whether the engine returns the prompt's logits (context_logits): for tensorrtllm, true only for "
        "an engine built with trtllm-build --gather_context_logits; rendered as a model parameter the "
        "gateway reads to score prompts (echo with logprobs, prompt_logprobs). The CPU engine always can.",
        default=False,
        backend_defaults=(("cpu", True),),
    ),
    Variable(
        "synthetic_prefill_ms_per_token",
        "float",
        "CPU engine, synthetic mode: milliseconds of context phase per prompt token not reused from the "
        "KV cache (0: prefill is free).",
        default=0.0,
        backends=CPU,
        minimum=0.0,
    ),
    Variable(
        "lora_target_modules",
        "str",
        "CPU engine, engine_mode=model: the TensorRT-LLM LoRA modules adapters may adapt, comma-separated "
        "(attn_q, attn_k, attn_v, attn_dense, mlp_h_to_4h, mlp_4h_to_h, mlp_gate: the Llama modules); "
        "empty: LoRA off. Rendered as the model parameter the gateway reads, like an engine's "
        "trtllm-build --lora_target_modules.",
        default="attn_q,attn_k,attn_v,attn_dense,mlp_h_to_4h,mlp_4h_to_h,mlp_gate",
        backends=CPU,
        pattern=r"^[a-z0-9_,]*$",
    ),
    Variable(
        "lora_cache_adapters",
        "int",
        "CPU engine: LoRA adapters its cache holds; a further one evicts the least recently used adapter "
        "no request is using (TensorRT-LLM's cache rules and errors).",
        default=8,
        backends=CPU,
        minimum=1,
    ),
    Variable("enable_chunked_context", "bool", "Chunked prefill.", default=False, backends=TRTLLM),
    Variable(
        "normalize_log_probs",
        "bool",
        "Normalize output log probs.",
        default=True,
        backends=TRTLLM,
    ),
    Variable(
        "cancellation_check_period_ms",
        "int",
        "How often the backend checks for cancelled requests.",
        default=100,
        backends=TRTLLM,
        minimum=1,
    ),
    Variable(
        "max_tokens_in_paged_kv_cache",
        "str",
        "KV cache size limit in tokens; empty: leave the parameter out (backend default; the CPU "
        "engine's is 262144 tokens).",
        default="",
        pattern=r"^\d*$",
    ),
    Variable(
        "max_attention_window_size",
        "str",
        "Comma-separated attention window sizes; empty: leave the parameter out.",
        default="",
        backends=TRTLLM,
        pattern=_OPTIONAL_INT_LIST,
    ),
    Variable(
        "gpu_device_ids",
        "str",
        "Comma-separated GPU ids for the engine; empty: leave the parameter out.",
        default="",
        backends=TRTLLM,
        pattern=_OPTIONAL_INT_LIST,
    ),
    Variable(
        "decoding_mode",
        "choice",
        "Engine decoding_mode; empty: leave the parameter out.",
        default="",
        backends=TRTLLM,
        choices=("", "auto", "top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "lookahead", "eagle"),
    ),
    Variable(
        "guided_decoding_backend",
        "choice",
        "Guided decoding backend (variant current); empty: none. The CPU engine compiles grammars with "
        "xgrammar against the tokenizer in model_dir, so it is on by default there.",
        default="",
        backend_defaults=(("cpu", "xgrammar"),),
        choices=("", "xgrammar"),
    ),
)
VARIABLES_BY_NAME: Final = {v.name: v for v in VARIABLES}
# Set by the renderer itself, usable in templates and directives but not settable.
_BUILTINS: Final = ("backend", "variant")

_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})
_FORBIDDEN_CHARS: Final = re.compile(r'["\\\n\r]|\$\{')
_PLACEHOLDER: Final = re.compile(r"\$\{([^}]*)\}")
_DIRECTIVE: Final = re.compile(r"^\s*#\s*@(\w+)\s*(.*?)\s*$")
_CONDITION: Final = re.compile(r"^(?:(not)\s+(\w+)|(\w+)\s*(==|!=)\s*(\"\"|\S+)|(\w+))$")


def _convert(var: Variable, raw: object) -> object:
    """Check ``raw`` against ``var`` and return the typed value (strings from the CLI are parsed)."""
    if var.kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise TemplateVariableError(var.name, f"expected a boolean (true/false), got {raw!r}")
    if var.kind in ("int", "float"):
        value: int | float
        try:
            if isinstance(raw, bool):
                raise ValueError
            if var.kind == "int":
                if isinstance(raw, float) and not raw.is_integer():
                    raise ValueError
                value = int(raw) if isinstance(raw, int | float) else int(str(raw).strip(), 10)
            else:
                value = float(raw) if isinstance(raw, int | float) else float(str(raw).strip())
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError
        except ValueError:
            raise TemplateVariableError(
                var.name, f"expected {'an integer' if var.kind == 'int' else 'a number'}, got {raw!r}"
            ) from None
        if var.minimum is not None and value < var.minimum:
            raise TemplateVariableError(var.name, f"must be >= {var.minimum:g}, got {value!r}")
        if var.maximum is not None and value > var.maximum:
            raise TemplateVariableError(var.name, f"must be <= {var.maximum:g}, got {value!r}")
        return value
    if var.kind == "str" and isinstance(raw, int) and not isinstance(raw, bool):
        # Numeric settings kept as strings only so that they can be left empty (max_tokens_in_paged_kv_cache).
        raw = str(raw)
    if not isinstance(raw, str | os.PathLike):
        raise TemplateVariableError(var.name, f"expected a string, got {type(raw).__name__} {raw!r}")
    text = os.fspath(raw)
    if _FORBIDDEN_CHARS.search(text):
        raise TemplateVariableError(
            var.name, f"must not contain quotes, backslashes, newlines or '${{': {text!r}"
        )
    if var.kind == "choice" and text not in var.choices:
        raise TemplateVariableError(
            var.name, f"must be one of {', '.join(map(repr, var.choices))}, got {text!r}"
        )
    if var.kind == "path" and not text:
        raise TemplateVariableError(var.name, "must not be empty")
    if var.pattern is not None and not re.fullmatch(var.pattern, text):
        raise TemplateVariableError(var.name, f"malformed value {text!r} (expected to match {var.pattern})")
    return text


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


def resolve_variables(backend: str, variant: str, variables: Mapping[str, object]) -> dict[str, object]:
    """Validate ``variables`` for ``backend``/``variant`` and return every applicable variable's typed value.

    Raises TemplateVariableError naming the first unknown, inapplicable, malformed or missing variable.
    """
    if backend not in BACKENDS:
        raise TemplateVariableError("backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if variant not in VARIANTS:
        raise TemplateVariableError("variant", f"must be one of {', '.join(VARIANTS)}, got {variant!r}")
    for name in variables:
        var = VARIABLES_BY_NAME.get(name)
        if var is None:
            hint = " (set by --backend/--variant)" if name in _BUILTINS else ""
            raise TemplateVariableError(
                name, f"unknown variable{hint}; see `python -m deploy.model_repo variables`"
            )
        if backend not in var.backends:
            only = ", ".join(sorted(var.backends))
            raise TemplateVariableError(name, f"does not apply to backend {backend!r} (only {only})")
    values: dict[str, object] = {"backend": backend, "variant": variant}
    deferred: list[Variable] = []
    for var in VARIABLES:
        if backend not in var.backends:
            continue
        if var.name in variables:
            values[var.name] = _convert(var, variables[var.name])
        elif var.default_from is not None:
            deferred.append(var)
        elif var.required:
            raise TemplateVariableError(var.name, f"required for backend {backend!r} but not given")
        else:
            values[var.name] = var.default_for(backend)
    for var in deferred:
        values[var.name] = values[var.default_from] if var.default_from else var.default
    for step, model in (
        ("preprocessing", "preprocessing"),
        ("engine", "tensorrt_llm"),
        ("postprocessing", "postprocessing"),
    ):
        if f"{step}_model" in values and not values[f"{step}_model"]:
            values[f"{step}_model"] = f"{values['name_prefix']}{model}"
    return values


def _evaluate(condition: str, values: Mapping[str, object], where: str, *, skipped: bool) -> bool:
    match = _CONDITION.match(condition)
    if match is None:
        raise TemplateSyntaxError(f"{where}: malformed condition {condition!r}")
    negated_name, cmp_name, op, literal, bare_name = (match.group(i) for i in (2, 3, 4, 5, 6))
    name = negated_name or cmp_name or bare_name
    if name not in VARIABLES_BY_NAME and name not in _BUILTINS:
        raise TemplateSyntaxError(f"{where}: condition uses unknown variable {name!r}")
    if skipped:
        # Inside a branch that is not rendered: the variable may not apply to this backend at all.
        return False
    if name not in values:
        raise TemplateSyntaxError(f"{where}: condition uses {name!r}, which does not apply to this backend")
    value = values[name]
    if cmp_name is not None:
        expected = "" if literal == '""' else literal
        return (_as_text(value) == expected) == (op == "==")
    if not isinstance(value, bool):
        raise TemplateSyntaxError(f"{where}: {name!r} is not a boolean; compare it with == or !=")
    return value != bool(negated_name)


def render_text(text: str, values: Mapping[str, object], *, source: str = "<template>") -> str:
    """Apply ``# @if/@else/@endif`` directives, then substitute ``${name}`` placeholders.

    Unknown names in placeholders or conditions, unbalanced directives and anything left looking like
    ``${...}`` are errors: a rendered file is either complete or not written at all.
    """
    out: list[str] = []
    # Each frame: (this branch active, any enclosing frame inactive, seen @else, line of @if).
    stack: list[tuple[bool, bool, bool, int]] = []
    for lineno, line in enumerate(text.splitlines(keepends=True), start=1):
        where = f"{source}:{lineno}"
        directive = _DIRECTIVE.match(line)
        if directive is not None:
            keyword, argument = directive.groups()
            parent_off = bool(stack) and not (stack[-1][0] and not stack[-1][1])
            if keyword == "if":
                stack.append(
                    (_evaluate(argument, values, where, skipped=parent_off), parent_off, False, lineno)
                )
            elif keyword == "else":
                if not stack or stack[-1][2] or argument:
                    raise TemplateSyntaxError(f"{where}: unexpected @else")
                active, off, _, start = stack.pop()
                stack.append((not active, off, True, start))
            elif keyword == "endif":
                if not stack or argument:
                    raise TemplateSyntaxError(f"{where}: unexpected @endif")
                stack.pop()
            else:
                raise TemplateSyntaxError(f"{where}: unknown directive @{keyword}")
            continue
        if stack and not (stack[-1][0] and not stack[-1][1]):
            continue
        out.append(line)
    if stack:
        raise TemplateSyntaxError(f"{source}:{stack[-1][3]}: @if without @endif")

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise TemplateVariableError(name, f"used in {source} but not defined for this backend")
        return _as_text(values[name])

    rendered = _PLACEHOLDER.sub(substitute, "".join(out))
    if "${" in rendered:
        raise TemplateSyntaxError(f"{source}: unterminated '${{' left after rendering")
    return rendered


def parse_model_config(text: str, *, source: str) -> model_config_pb2.ModelConfig:
    """Parse a config.pbtxt into Triton's ModelConfig, raising ModelConfigValidationError on failure."""
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigValidationError(source, f"does not parse as ModelConfig: {exc}") from None


def load_model_configs(repo_dir: Path) -> dict[str, model_config_pb2.ModelConfig]:
    """Every model's parsed config.pbtxt in a repository, by directory name."""
    configs = {}
    for config_file in sorted(Path(repo_dir).glob("*/config.pbtxt")):
        configs[config_file.parent.name] = parse_model_config(
            config_file.read_text(), source=str(config_file)
        )
    return configs


def validate_repository(
    repo_dir: Path, *, composed: Sequence[Path] = ()
) -> dict[str, model_config_pb2.ModelConfig]:
    """Parse every config.pbtxt and check names, Python model files and ensemble wiring.

    `composed`: other repositories (served by the same Triton) whose models an ensemble here may call.
    """
    repo_dir = Path(repo_dir)
    configs = load_model_configs(repo_dir)
    if not configs:
        raise ModelConfigValidationError(str(repo_dir), "no */config.pbtxt found")
    available = dict(configs)
    for other in composed:
        for name, config in load_model_configs(Path(other)).items():
            available.setdefault(name, config)
    for name, config in configs.items():
        source = f"{name}/config.pbtxt"
        if config.name and config.name != name:
            raise ModelConfigValidationError(
                source, f"name {config.name!r} differs from its directory {name!r}"
            )
        if config.backend == "python" and not (repo_dir / name / "1" / "model.py").is_file():
            raise ModelConfigValidationError(source, "python backend but no 1/model.py")
        if config.platform == "ensemble":
            _validate_ensemble(name, config, available)
    return configs


def _validate_ensemble(
    name: str, ensemble: model_config_pb2.ModelConfig, configs: Mapping[str, model_config_pb2.ModelConfig]
) -> None:
    source = f"{name}/config.pbtxt"
    dtype_name = model_config_pb2.DataType.Name
    # Tensor name -> (data type, where it comes from).
    available: dict[str, tuple[int, str]] = {t.name: (t.data_type, "ensemble input") for t in ensemble.input}
    consumed: set[str] = set()
    for index, step in enumerate(ensemble.ensemble_scheduling.step):
        where = f"step {index} ({step.model_name})"
        composing = configs.get(step.model_name)
        if composing is None:
            raise ModelConfigValidationError(
                source, f"{where}: model {step.model_name!r} is not in the repository"
            )
        inputs = {t.name: t for t in composing.input}
        outputs = {t.name: t for t in composing.output}
        for key, value in step.input_map.items():
            if key not in inputs:
                raise ModelConfigValidationError(
                    source, f"{where}: input_map key {key!r} is not an input of {step.model_name}"
                )
            if value not in available:
                raise ModelConfigValidationError(
                    source,
                    f"{where}: input_map value {value!r} is neither an ensemble input nor produced by an "
                    "earlier step",
                )
            produced_type, origin = available[value]
            if produced_type != inputs[key].data_type:
                raise ModelConfigValidationError(
                    source,
                    f"{where}: {value!r} ({origin}) is {dtype_name(produced_type)} but "
                    f"{step.model_name} input {key!r} is {dtype_name(inputs[key].data_type)}",
                )
            consumed.add(value)
        for key, tensor in inputs.items():
            if not tensor.optional and key not in step.input_map:
                raise ModelConfigValidationError(
                    source, f"{where}: required input {key!r} of {step.model_name} is not mapped"
                )
        for key, value in step.output_map.items():
            if key not in outputs:
                raise ModelConfigValidationError(
                    source, f"{where}: output_map key {key!r} is not an output of {step.model_name}"
                )
            if value in available:
                raise ModelConfigValidationError(source, f"{where}: tensor {value!r} is produced twice")
            available[value] = (outputs[key].data_type, f"output {key} of {step.model_name}")
    for tensor in ensemble.input:
        if tensor.name not in consumed:
            raise ModelConfigValidationError(
                source, f"ensemble input {tensor.name!r} is not used by any step"
            )
    seen_outputs: set[str] = set()
    for tensor in ensemble.output:
        if tensor.name in seen_outputs:
            raise ModelConfigValidationError(source, f"ensemble output {tensor.name!r} is declared twice")
        seen_outputs.add(tensor.name)
        produced = available.get(tensor.name)
        if produced is None or produced[1] == "ensemble input":
            raise ModelConfigValidationError(
                source, f"ensemble output {tensor.name!r} is not produced by any step"
            )
        if produced[0] != tensor.data_type:
            raise ModelConfigValidationError(
                source,
                f"ensemble output {tensor.name!r} is declared {dtype_name(tensor.data_type)} but "
                f"{produced[1]} is {dtype_name(produced[0])}",
            )


def _copy_model_files(src: Path, dst: Path, *, include_code: bool) -> None:
    version_dir = dst / "1"
    version_dir.mkdir(parents=True)
    if not include_code:
        return
    for file in sorted((src / "1").rglob("*")):
        if file.is_dir() or "__pycache__" in file.parts or file.suffix == ".pyc":
            continue
        target = version_dir / file.relative_to(src / "1")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)


def render_repository(
    out_dir: Path,
    *,
    backend: str,
    variant: str,
    variables: Mapping[str, object],
    overwrite: bool = False,
    templates_dir: Path | None = None,
    models: Sequence[str] | None = None,
    composed: Sequence[Path] = (),
) -> Path:
    """Render the four models into ``out_dir`` (created; replaced only with ``overwrite``) and return it.

    Everything is rendered and validated in a temporary sibling directory first and then renamed into
    place, so a failure never leaves a partial repository behind. ``models`` defaults to what the
    backend renders (``BACKEND_MODELS``).
    """
    templates = Path(templates_dir) if templates_dir is not None else TEMPLATES_DIR
    out_dir = Path(out_dir).absolute()
    values = resolve_variables(backend, variant, variables)
    if backend == "cpu" and "lora_target_modules" not in variables:
        values["lora_target_modules"] = lora_modules_of(
            Path(str(values["tokenizer_dir"])), str(values["lora_target_modules"])
        )
    if models is None:
        models = BACKEND_MODELS[backend]
    if backend == "native":
        from deploy.native_engine import NativeEngineError, token_id_ranges

        if set(models) - set(BACKEND_MODELS["native"]):
            raise ModelRepoError("backend 'native' renders the tensorrt_llm model alone")
        try:
            values["native_token_ids"] = token_id_ranges(str(values["tokenizer_dir"]))
        except (NativeEngineError, OSError, ValueError) as exc:
            raise TemplateVariableError(
                "tokenizer_dir", f"no token ids for the native engine: {exc}"
            ) from None
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelRepoError(f"{out_dir} exists and is not empty (pass overwrite=True / --overwrite)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.render-", dir=out_dir.parent))
    try:
        prefix = str(values["name_prefix"])
        unknown = set(models) - set(MODELS)
        if unknown or not models:
            raise ModelRepoError(f"models must be some of {', '.join(MODELS)}, got {list(models)}")
        for model in models:
            src = templates / _TEMPLATE_OF.get((backend, model), model)
            dst = staging / f"{prefix}{model}"
            template_file = src / "config.pbtxt"
            text = render_text(
                template_file.read_text(), values, source=str(template_file.relative_to(templates))
            )
            # The C++ tensorrtllm backend and the native engine need only config.pbtxt and an (empty)
            # version directory.
            _copy_model_files(src, dst, include_code=not (model == "tensorrt_llm" and backend != "cpu"))
            (dst / "config.pbtxt").write_text(text)
        validate_repository(staging, composed=composed)
        _publish(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("rendered %s/%s model repository in %s", backend, variant, out_dir)
    return out_dir


LLMAPI_PROFILES: Final = ("current", "v1.2")
LLMAPI_TEMPLATE: Final = TEMPLATES_DIR / "llmapi" / "tensorrt_llm"
_MODEL_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True, slots=True)
class LlmapiSettings:
    """One llmapi model repository: what model.yaml says (the LLM API's arguments, with Triton's
    `triton_config`) and how the repository is made."""

    # A Hugging Face model id or a local directory (the stand-in: a local directory).
    model: str
    name: str = "tensorrt_llm"
    # `current` (upstream main: LoRA by path, images) or `v1.2` (TensorRT-LLM 1.2.x's config).
    profile: str = "current"
    decoupled: bool = True
    backend: str = "pytorch"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # The LLM API's batch limit (model.yaml's max_batch_size; Triton's own stays 0: no batch dimension).
    max_batch_size: int = 64
    enable_kv_cache_reuse: bool = True
    free_gpu_memory_fraction: float = 0.9
    # The CPU stand-in (our model.py over the CPU reference engine) instead of upstream's model.py.
    stand_in: bool = False
    # The KV cache block size, written to model.yaml and as the config parameter the gateway reads
    # it from (to report cached prompt tokens); None: the LLM API's default, not reported.
    tokens_per_block: int | None = None
    # Images in: model.yaml's `triton_config.multimodal`, without which upstream's model.py ignores
    # the `image_url` input (a vision-language model then answers as if no image had been sent).
    multimodal: bool = False

    def model_yaml(self) -> str:
        data: dict[str, object] = {
            "model": self.model,
            "backend": self.backend,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "max_batch_size": self.max_batch_size,
            "kv_cache_config": {
                "enable_block_reuse": self.enable_kv_cache_reuse,
                "free_gpu_memory_fraction": self.free_gpu_memory_fraction,
                **({} if self.tokens_per_block is None else {"tokens_per_block": self.tokens_per_block}),
            },
            "triton_config": {
                "max_batch_size": 0,
                "decoupled": self.decoupled,
                **({"multimodal": True} if self.multimodal else {}),
            },
        }
        if self.stand_in:
            data["cpu_stand_in"] = {"profile": self.profile, "engine_threads": 1}
        import yaml

        return (
            "# The LLM API's arguments (tensorrt_llm.LLM) and Triton's (triton_config).\n"
            + yaml.safe_dump(data, sort_keys=False)
        )


def render_llmapi_repository(
    out_dir: Path, settings: LlmapiSettings, *, upstream: Path | None = None, overwrite: bool = False
) -> Path:
    """Render an llmapi model repository: ``<name>/config.pbtxt`` and ``<name>/1/model.yaml``, with
    the stand-in's code, or upstream's model files copied unchanged from ``upstream`` (the
    ``tensorrt_llm`` directory of ``triton_backend/all_models/llmapi`` in a TensorRT-LLM checkout or
    container); without either, ``1/`` holds model.yaml alone for upstream's files to join. Returns
    the repository directory."""
    if settings.profile not in LLMAPI_PROFILES:
        raise ModelRepoError(f"profile must be one of {', '.join(LLMAPI_PROFILES)}, got {settings.profile!r}")
    if not _MODEL_NAME.match(settings.name):
        raise ModelRepoError(f"model name {settings.name!r} must be letters, digits, '_', '.' or '-'")
    if settings.tokens_per_block is not None and settings.tokens_per_block < 1:
        raise ModelRepoError("tokens_per_block must be >= 1")
    if (
        settings.tensor_parallel_size < 1
        or settings.pipeline_parallel_size < 1
        or settings.max_batch_size < 1
    ):
        raise ModelRepoError("tensor_parallel_size, pipeline_parallel_size and max_batch_size must be >= 1")
    if settings.stand_in and upstream is not None:
        raise ModelRepoError("the stand-in and upstream's model files exclude each other")
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelRepoError(f"{out_dir} exists and is not empty (pass overwrite=True / --overwrite)")
    if upstream is not None and not (Path(upstream) / "config.pbtxt").is_file():
        raise ModelRepoError(f"{upstream} has no config.pbtxt: not upstream's llmapi tensorrt_llm directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.render-", dir=out_dir.parent))
    try:
        model_dir = staging / settings.name
        if upstream is not None:
            shutil.copytree(upstream, model_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            config_file = model_dir / "config.pbtxt"
            config = parse_model_config(config_file.read_text(), source=str(config_file))
            # Renamed only when asked for another name; everything else stays upstream's.
            if config.name != settings.name:
                text = re.sub(
                    r'^name:\s*"[^"]*"',
                    f'name: "{settings.name}"',
                    config_file.read_text(),
                    count=1,
                    flags=re.M,
                )
                config_file.write_text(text)
        else:
            template = LLMAPI_TEMPLATE / "config.pbtxt"
            values = {"name": settings.name, "decoupled": settings.decoupled, "variant": settings.profile}
            text = render_text(template.read_text(), values, source="llmapi/tensorrt_llm/config.pbtxt")
            (model_dir / "1").mkdir(parents=True)
            (model_dir / "config.pbtxt").write_text(text)
            if settings.stand_in:
                shutil.copyfile(LLMAPI_TEMPLATE / "1" / "model.py", model_dir / "1" / "model.py")
                shutil.copyfile(
                    TEMPLATES_DIR / "tensorrt_llm" / "1" / "engine.py", model_dir / "1" / "engine.py"
                )
        (model_dir / "1").mkdir(exist_ok=True)
        (model_dir / "1" / "model.yaml").write_text(settings.model_yaml())
        if settings.tokens_per_block is not None:
            with (model_dir / "config.pbtxt").open("a") as config_file:
                block = settings.tokens_per_block
                config_file.write(
                    "\n# model.yaml's kv_cache_config.tokens_per_block, for the gateway.\n"
                    f'parameters {{ key: "tokens_per_block" value {{ string_value: "{block}" }} }}\n'
                )
        configs = load_model_configs(staging)
        if settings.multimodal and "image_url" not in {t.name for t in configs[settings.name].input}:
            # Without the input Triton refuses every request that carries images.
            raise ModelRepoError(
                f"{settings.name}/config.pbtxt declares no image_url input, so it cannot take images: "
                "use the current profile or an upstream model newer than TensorRT-LLM 1.2"
            )
        _publish(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("rendered llmapi (%s) model repository in %s", settings.profile, out_dir)
    return out_dir


# The C++ multimodal repository is upstream's own (TensorRT-LLM's triton_backend/all_models, which the
# NGC trtllm container and a TensorRT-LLM checkout both carry): its preprocessing model loads and
# processes the images with the model's transformers processor and its multimodal_encoders model runs
# the visual engine, code that must match the TensorRT-LLM release serving it. So it is assembled from
# that tree and filled in, as upstream's docs do with tools/fill_template.py, never re-templated here.
MULTIMODAL_MODELS: Final = {
    "preprocessing": "inflight_batcher_llm",
    "multimodal_encoders": "multimodal",
    "tensorrt_llm": "inflight_batcher_llm",
    "postprocessing": "inflight_batcher_llm",
    "ensemble": "multimodal",
}
# The parameters each model's template must have: a tree without them is another release's layout
# (or not the multimodal one), and filling it would leave the engine or the encoder unconfigured.
# `a|b`: either name (releases before 0.19 called the visual engine visual_model_path).
_MULTIMODAL_REQUIRED: Final = {
    "preprocessing": ("tokenizer_dir", "multimodal_model_path|visual_model_path", "engine_dir"),
    "multimodal_encoders": ("multimodal_model_path|visual_model_path",),
    "tensorrt_llm": ("engine_dir", "decoupled_mode"),
    "postprocessing": ("tokenizer_dir",),
    "ensemble": ("triton_max_batch_size",),
}
_TRITON_TYPES: Final = ("TYPE_FP16", "TYPE_BF16", "TYPE_FP32")


@dataclass(frozen=True, slots=True)
class MultimodalSettings:
    """One C++ multimodal repository: the paths as Triton will see them and the values upstream's
    templates ask for (upstream's docs' values where they give one)."""

    # The LLM engine (trtllm-build --max_multimodal_len ...) and the visual engine
    # (build_multimodal_engine.py's output directory, multimodal_model_path).
    engine_dir: str
    visual_engine_dir: str
    # The Hugging Face model directory: tokenizer, processor and config (hf_model_path).
    hf_model_dir: str
    tokenizer_dir: str | None = None
    max_batch_size: int = 8
    # Images per request the preprocessing model accepts (build the engine's max_multimodal_len for it).
    max_num_images: int = 1
    decoupled: bool = True
    # The prompt left out of whole (non-streaming) output ids, as the text repository renders it.
    exclude_input_in_output: bool = True
    kv_cache_free_gpu_mem_fraction: float = 0.9
    # Off by default: with reuse on, every request must send prompt_table_extra_id (one id per image
    # content), or a new image would reuse the KV blocks of another image's placeholder tokens.
    enable_kv_cache_reuse: bool = False
    batch_scheduler_policy: str = "guaranteed_no_evict"
    # Data type of the visual features (TYPE_BF16 for mllama, TYPE_FP16 for the others).
    encoder_input_features_data_type: str = "TYPE_FP16"
    prompt_embedding_table_data_type: str = "TYPE_FP16"
    # Encoder-decoder (mllama) models only: the share of the KV cache for cross attention.
    cross_kv_cache_fraction: float | None = None
    # 0: each image is encoded as soon as it arrives (upstream's example waits 20 ms to batch them).
    max_queue_delay_microseconds: int = 0
    preprocessing_instance_count: int = 1
    postprocessing_instance_count: int = 1
    # Further template values, by model (e.g. {"tensorrt_llm": {"enable_chunked_context": "true"}}).
    extra: Mapping[str, Mapping[str, str]] | None = None

    def values(self) -> dict[str, dict[str, str]]:
        """Every model's template values, as upstream's fill_template.py takes them."""

        def flag(value: bool) -> str:
            return "true" if value else "false"

        tokenizer = self.tokenizer_dir or self.hf_model_dir
        batch = str(self.max_batch_size)
        delay = str(self.max_queue_delay_microseconds)
        values = {
            "preprocessing": {
                "tokenizer_dir": tokenizer,
                "triton_max_batch_size": batch,
                "preprocessing_instance_count": str(self.preprocessing_instance_count),
                "multimodal_model_path": self.visual_engine_dir,
                "visual_model_path": self.visual_engine_dir,
                "engine_dir": self.engine_dir,
                "max_num_images": str(self.max_num_images),
                "max_queue_delay_microseconds": delay,
                "max_queue_size": "0",
                "add_special_tokens": "true",
            },
            "multimodal_encoders": {
                "triton_max_batch_size": batch,
                "multimodal_model_path": self.visual_engine_dir,
                "visual_model_path": self.visual_engine_dir,
                "hf_model_path": self.hf_model_dir,
                "encoder_input_features_data_type": self.encoder_input_features_data_type,
                "prompt_embedding_table_data_type": self.prompt_embedding_table_data_type,
                "max_queue_delay_microseconds": delay,
                "max_queue_size": "0",
            },
            "tensorrt_llm": {
                "triton_backend": "tensorrtllm",
                "triton_max_batch_size": batch,
                "decoupled_mode": flag(self.decoupled),
                "max_beam_width": "1",
                "engine_dir": self.engine_dir,
                "enable_kv_cache_reuse": flag(self.enable_kv_cache_reuse),
                "batching_strategy": "inflight_fused_batching",
                "batch_scheduler_policy": self.batch_scheduler_policy,
                "max_queue_delay_microseconds": "0",
                "max_queue_size": "0",
                "enable_chunked_context": "false",
                "encoder_input_features_data_type": self.encoder_input_features_data_type,
                "prompt_embedding_table_data_type": self.prompt_embedding_table_data_type,
                "logits_datatype": "TYPE_FP32",
                "kv_cache_free_gpu_mem_fraction": format(self.kv_cache_free_gpu_mem_fraction, "g"),
                "exclude_input_in_output": flag(self.exclude_input_in_output),
                **(
                    {}
                    if self.cross_kv_cache_fraction is None
                    else {"cross_kv_cache_fraction": format(self.cross_kv_cache_fraction, "g")}
                ),
            },
            "postprocessing": {
                "tokenizer_dir": tokenizer,
                "triton_max_batch_size": batch,
                "postprocessing_instance_count": str(self.postprocessing_instance_count),
                "skip_special_tokens": "true",
            },
            "ensemble": {"triton_max_batch_size": batch, "logits_datatype": "TYPE_FP32"},
        }
        for model, more in (self.extra or {}).items():
            if model not in values:
                raise ModelRepoError(f"no model {model!r} in the multimodal repository ({', '.join(values)})")
            values[model].update(more)
        return values


def _fill_upstream_template(text: str, values: Mapping[str, str], *, source: str) -> str:
    """`${key}` -> value, as upstream's fill_template.py does; what is left must be a parameter's
    string_value (the backend reads a `${...}` value as not set), never a field Triton parses."""
    for key, value in values.items():
        if _FORBIDDEN_CHARS.search(value):
            raise TemplateVariableError(
                key, f"must not contain quotes, backslashes, newlines or '${{': {value!r}"
            )
        text = text.replace("${" + key + "}", value)
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        left = _PLACEHOLDER.search(code)
        if left and "string_value" not in code:
            raise ModelConfigValidationError(source, f"${{{left.group(1)}}} is not filled in: {line.strip()}")
    return text


def render_multimodal_repository(
    out_dir: Path, settings: MultimodalSettings, *, upstream: Path, overwrite: bool = False
) -> Path:
    """Assemble the C++ multimodal repository (preprocessing -> multimodal_encoders -> tensorrt_llm ->
    postprocessing, and its ensemble) from ``upstream``, a TensorRT-LLM ``triton_backend/all_models``
    directory (tensorrtllm_backend's ``all_models`` up to v0.19), and fill in its parameters. Every
    config is parsed and the ensemble's wiring checked before the repository is put in place."""
    upstream = Path(upstream)
    if settings.max_batch_size < 1 or settings.max_num_images < 1:
        raise ModelRepoError("max_batch_size and max_num_images must be >= 1")
    if not 0.0 < settings.kv_cache_free_gpu_mem_fraction <= 1.0:
        raise ModelRepoError("kv_cache_free_gpu_mem_fraction must be in (0, 1]")
    for name in ("encoder_input_features_data_type", "prompt_embedding_table_data_type"):
        if getattr(settings, name) not in _TRITON_TYPES:
            raise ModelRepoError(f"{name} must be one of {', '.join(_TRITON_TYPES)}")
    if settings.batch_scheduler_policy not in ("guaranteed_no_evict", "max_utilization"):
        raise ModelRepoError("batch_scheduler_policy must be guaranteed_no_evict or max_utilization")
    for model, kind in MULTIMODAL_MODELS.items():
        if not (upstream / kind / model / "config.pbtxt").is_file():
            raise ModelRepoError(
                f"{upstream} has no {kind}/{model}/config.pbtxt: pass TensorRT-LLM's "
                "triton_backend/all_models (a release up to 1.2, which still ships all_models/multimodal)"
            )
    values = settings.values()
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelRepoError(f"{out_dir} exists and is not empty (pass overwrite=True / --overwrite)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.render-", dir=out_dir.parent))
    try:
        for model, kind in MULTIMODAL_MODELS.items():
            src = upstream / kind / model
            dst = staging / model
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            config_file = dst / "config.pbtxt"
            text = config_file.read_text()
            missing = [
                names
                for names in _MULTIMODAL_REQUIRED[model]
                if not any("${" + key + "}" in text for key in names.split("|"))
            ]
            if missing:
                raise ModelConfigValidationError(
                    f"{kind}/{model}/config.pbtxt",
                    f"has no ${{{missing[0].split('|')[0]}}}: not the multimodal layout this renderer fills "
                    "(TensorRT-LLM's triton_backend/all_models, up to 1.2)",
                )
            config_file.write_text(
                _fill_upstream_template(text, values[model], source=f"{model}/config.pbtxt")
            )
            (dst / "1").mkdir(exist_ok=True)
        configs = validate_repository(staging)
        inputs = {t.name for t in configs["ensemble"].input}
        if not inputs & {"image_url_input", "image_bytes_input"}:
            raise ModelConfigValidationError(
                "ensemble/config.pbtxt",
                "takes no image_url_input or image_bytes_input: not the multimodal ensemble",
            )
        _publish(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("rendered the C++ multimodal model repository in %s", out_dir)
    return out_dir


def parse_assignments(assignments: Sequence[str]) -> dict[str, str]:
    """``["key=value", ...]`` (the CLI's ``--set`` values) as a dict; a malformed item names itself."""
    result: dict[str, str] = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise TemplateVariableError(item, "expected --set key=value")
        result[name.strip()] = value
    return result


def _variables_table(backend: str | None) -> str:
    lines = []
    for var in VARIABLES:
        if backend is not None and backend not in var.backends:
            continue
        if var.required:
            default = "(required)"
        elif var.default_from is not None:
            default = f"(default: {var.default_from})"
        elif backend is None and var.backend_defaults:
            default = repr(_as_text(var.default)) + "".join(
                f", {name}: {_as_text(value)!r}" for name, value in var.backend_defaults
            )
        else:
            default = repr(_as_text(var.default if backend is None else var.default_for(backend)))
        scope = "" if var.backends == ALL else f" [{', '.join(sorted(var.backends))} only]"
        choices = f" One of: {', '.join(repr(c) for c in var.choices)}." if var.choices else ""
        lines.append(f"{var.name} = {default}{scope}\n    {var.description}{choices}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.model_repo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="render a model repository")
    render.add_argument("--backend", required=True, choices=BACKENDS)
    render.add_argument("--variant", default="current", choices=VARIANTS)
    render.add_argument("--out", required=True, type=Path, help="repository directory to create")
    render.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE")
    render.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    llmapi = sub.add_parser(
        "render-llmapi",
        help="render a repository for TensorRT-LLM's llmapi model (config.pbtxt and model.yaml)",
    )
    llmapi.add_argument(
        "--model", required=True, help="Hugging Face model id or local directory (model.yaml's model)"
    )
    llmapi.add_argument("--out", required=True, type=Path, help="repository directory to create")
    llmapi.add_argument(
        "--name", default="tensorrt_llm", help="the model's name in Triton (default: tensorrt_llm)"
    )
    llmapi.add_argument(
        "--profile", choices=LLMAPI_PROFILES, default="current", help="config.pbtxt of main or 1.2.x"
    )
    llmapi.add_argument(
        "--decoupled", action=argparse.BooleanOptionalAction, default=True, help="stream (default: on)"
    )
    llmapi.add_argument("--backend", default="pytorch", help="the LLM API backend (default: pytorch)")
    llmapi.add_argument("--tensor-parallel-size", type=int, default=1)
    llmapi.add_argument("--pipeline-parallel-size", type=int, default=1)
    llmapi.add_argument(
        "--max-batch-size", type=int, default=64, help="the LLM API's batch limit (default: 64)"
    )
    llmapi.add_argument("--kv-cache-reuse", action=argparse.BooleanOptionalAction, default=True)
    llmapi.add_argument("--free-gpu-memory-fraction", type=float, default=0.9)
    llmapi.add_argument(
        "--tokens-per-block",
        type=int,
        default=None,
        help="KV cache block size, also told to the gateway (which then reports cached prompt tokens)",
    )
    llmapi.add_argument(
        "--upstream",
        type=Path,
        default=None,
        help="upstream's llmapi/tensorrt_llm directory: its files are copied unchanged (else 1/ gets "
        "model.yaml alone)",
    )
    llmapi.add_argument(
        "--stand-in", action="store_true", help="the CPU stand-in instead of upstream's model.py"
    )
    llmapi.add_argument(
        "--multimodal",
        action="store_true",
        help="a vision-language model: model.yaml's triton_config.multimodal, so the model reads image_url",
    )
    llmapi.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    mm = sub.add_parser(
        "render-multimodal",
        help="assemble and fill upstream's C++ multimodal repository (vision-language models, GPU hosts)",
    )
    mm.add_argument(
        "--upstream",
        required=True,
        type=Path,
        help="TensorRT-LLM's triton_backend/all_models (a release up to 1.2), whose models are copied",
    )
    mm.add_argument("--out", required=True, type=Path, help="repository directory to create")
    mm.add_argument("--engine-dir", required=True, help="the LLM engine, as Triton will see it")
    mm.add_argument(
        "--visual-engine-dir", required=True, help="the visual engine (build_multimodal_engine.py's output)"
    )
    mm.add_argument(
        "--hf-model-dir", required=True, help="the Hugging Face model directory (processor, config)"
    )
    mm.add_argument("--tokenizer-dir", default=None, help="default: --hf-model-dir")
    mm.add_argument("--max-batch-size", type=int, default=8)
    mm.add_argument("--max-num-images", type=int, default=1, help="images per request (default 1)")
    mm.add_argument("--decoupled", action=argparse.BooleanOptionalAction, default=True)
    mm.add_argument("--kv-cache-reuse", action=argparse.BooleanOptionalAction, default=False)
    mm.add_argument("--kv-cache-free-gpu-mem-fraction", type=float, default=0.9)
    mm.add_argument(
        "--batch-scheduler-policy",
        default="guaranteed_no_evict",
        choices=("guaranteed_no_evict", "max_utilization"),
    )
    mm.add_argument(
        "--encoder-dtype", default="TYPE_FP16", choices=_TRITON_TYPES, help="TYPE_BF16 for mllama"
    )
    mm.add_argument("--prompt-table-dtype", default="TYPE_FP16", choices=_TRITON_TYPES)
    mm.add_argument("--cross-kv-cache-fraction", type=float, default=None, help="mllama only (e.g. 0.5)")
    mm.add_argument("--max-queue-delay-microseconds", type=int, default=0)
    mm.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="MODEL.KEY=VALUE",
        help="another template value, e.g. tensorrt_llm.enable_chunked_context=true",
    )
    mm.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    listing = sub.add_parser("variables", help="list template variables with defaults and descriptions")
    listing.add_argument("--backend", choices=BACKENDS, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "variables":
        sys.stdout.write(_variables_table(args.backend))
        return 0
    if args.command == "render-llmapi":
        settings = LlmapiSettings(
            model=args.model,
            name=args.name,
            profile=args.profile,
            decoupled=args.decoupled,
            backend=args.backend,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            max_batch_size=args.max_batch_size,
            enable_kv_cache_reuse=args.kv_cache_reuse,
            free_gpu_memory_fraction=args.free_gpu_memory_fraction,
            stand_in=args.stand_in,
            tokens_per_block=args.tokens_per_block,
            multimodal=args.multimodal,
        )
        try:
            out = render_llmapi_repository(
                args.out, settings, upstream=args.upstream, overwrite=args.overwrite
            )
        except ModelRepoError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
        sys.stdout.write(f"{out}\n")
        return 0
    if args.command == "render-multimodal":
        try:
            extra: dict[str, dict[str, str]] = {}
            for key, value in parse_assignments(args.assignments).items():
                model, dot, name = key.partition(".")
                if not dot or not name:
                    raise TemplateVariableError(key, "expected --set MODEL.KEY=VALUE")
                extra.setdefault(model, {})[name] = value
            mm_settings = MultimodalSettings(
                engine_dir=args.engine_dir,
                visual_engine_dir=args.visual_engine_dir,
                hf_model_dir=args.hf_model_dir,
                tokenizer_dir=args.tokenizer_dir,
                max_batch_size=args.max_batch_size,
                max_num_images=args.max_num_images,
                decoupled=args.decoupled,
                kv_cache_free_gpu_mem_fraction=args.kv_cache_free_gpu_mem_fraction,
                enable_kv_cache_reuse=args.kv_cache_reuse,
                batch_scheduler_policy=args.batch_scheduler_policy,
                encoder_input_features_data_type=args.encoder_dtype,
                prompt_embedding_table_data_type=args.prompt_table_dtype,
                cross_kv_cache_fraction=args.cross_kv_cache_fraction,
                max_queue_delay_microseconds=args.max_queue_delay_microseconds,
                extra=extra,
            )
            out = render_multimodal_repository(
                args.out, mm_settings, upstream=args.upstream, overwrite=args.overwrite
            )
        except ModelRepoError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
        sys.stdout.write(f"{out}\n")
        return 0
    try:
        out = render_repository(
            args.out,
            backend=args.backend,
            variant=args.variant,
            variables=parse_assignments(args.assignments),
            overwrite=args.overwrite,
        )
    except ModelRepoError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(f"{out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
