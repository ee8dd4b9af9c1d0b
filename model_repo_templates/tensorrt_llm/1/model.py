"""Triton Python-backend model serving the CPU reference engine under the ``tensorrt_llm`` contract.

Reads request tensors (either contract variant: the model config says which names exist), hands them
to the in-flight batching loop in ``engine.py`` and turns its results into responses. Exports the
TensorRT-LLM backend's ``nv_trt_llm_request_metrics`` gauges plus engine counters on the metrics port.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from engine import (
    DEFAULT_PRIORITY,
    CompiledGuide,
    Engine,
    EngineError,
    GuidedDecoding,
    KvCacheManager,
    LoraCache,
    LoraInput,
    OutputOptions,
    RequestGroup,
    SamplingParams,
    StepStats,
    TransformersRunner,
    check_engine_device,
    ordinary_token_ids,
    parse_lora_target_modules,
)

# Inputs the stock contract declares that this engine cannot honour: a request using them gets an error.
_TRUE = ("true", "1", "yes", "on")
_METRICS_PERIOD_S = 0.01
_LOG_PERIOD_S = 1.0
_DEFAULT_KV_CACHE_TOKENS = 262144


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value and not value.startswith("${") else default


def _input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request: Any, name: str, row: int, default: Any) -> Any:
    """Row ``row``'s value of a per-row scalar, whether it arrives as [B] (reshaped) or [B, 1]."""
    value = _input(request, name)
    if value is None or value.size == 0:
        return default
    flat = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    return flat[row if flat.shape[0] > row else 0, 0].item()


def _text(request: Any, name: str, row: int) -> str:
    """Row ``row``'s value of a per-row STRING scalar as text ("" when absent)."""
    value = _input(request, name)
    if value is None or value.size == 0:
        return ""
    flat = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    item = flat[row if flat.shape[0] > row else 0, 0]
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def _word_lists(request: Any, name: str, row: int) -> tuple[tuple[int, ...], ...]:
    """Decode the [2, -1] word-list format: row 0 concatenated ids, row 1 cumulative end offsets (-1 pads)."""
    value = _input(request, name)
    if value is None or value.size == 0:
        return ()
    if value.ndim == 2:
        value = value[None]
    if value.ndim != 3 or value.shape[1] != 2:
        raise EngineError(f"{name} must have shape [batch, 2, N], got {list(value.shape)}")
    ids, offsets = value[row if value.shape[0] > row else 0]
    words, start = [], 0
    for end in offsets.tolist():
        if end < 0:
            break
        if end > start:
            words.append(tuple(int(t) for t in ids[start:end]))
        start = end
    return tuple(words)


class _TritonLogHandler(logging.Handler):
    """Routes the engine's ``logging`` records into Triton's log."""

    def emit(self, record: logging.LogRecord) -> None:
        message = self.format(record)
        if record.levelno >= logging.ERROR:
            pb_utils.Logger.log_error(message)
        elif record.levelno >= logging.WARNING:
            pb_utils.Logger.log_warn(message)
        else:
            pb_utils.Logger.log_info(message)


def _output_tensors(tensors: dict[str, np.ndarray], dtypes: dict[str, Any]) -> list[Any]:
    """The response's tensors in the data types the config declares (logits may be FP16, as
    ``logits_datatype`` sets them; the engine computes them in float32)."""
    return [
        pb_utils.Tensor(name, value if name not in dtypes else value.astype(dtypes[name]))
        for name, value in tensors.items()
    ]


class _DecoupledSink:
    def __init__(self, request: Any, dtypes: dict[str, Any]) -> None:
        self._sender = request.get_response_sender()
        self._dtypes = dtypes

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())

    def send(self, tensors: dict[str, np.ndarray] | None, *, final: bool, error: str | None = None) -> None:
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if error is not None:
            code = (
                pb_utils.TritonError.CANCELLED
                if error == "request cancelled"
                else pb_utils.TritonError.INTERNAL
            )
            self._sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(error, code)), flags=flags
            )
        elif tensors is None:
            # The real backend's end of stream: the final flag alone (clients may ask for an empty response).
            self._sender.send(flags=flags)
        else:
            outputs = _output_tensors(tensors, self._dtypes)
            self._sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)


class _BlockingSink:
    """Non-decoupled mode: execute() waits for the one response and returns it."""

    def __init__(self, request: Any, dtypes: dict[str, Any]) -> None:
        self._request = request
        self._dtypes = dtypes
        self.done = threading.Event()
        self.response: Any = None

    def is_cancelled(self) -> bool:
        return bool(self._request.is_cancelled())

    def send(self, tensors: dict[str, np.ndarray] | None, *, final: bool, error: str | None = None) -> None:
        if error is not None:
            self.response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
        elif tensors is not None:
            self.response = pb_utils.InferenceResponse(output_tensors=_output_tensors(tensors, self._dtypes))
        if final:
            if self.response is None:
                self.response = pb_utils.InferenceResponse(output_tensors=[])
            self.done.set()


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        engine_logger = logging.getLogger("engine")
        if not any(isinstance(h, _TritonLogHandler) for h in engine_logger.handlers):
            engine_logger.addHandler(_TritonLogHandler())
            engine_logger.setLevel(logging.INFO)
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.inputs = {t["name"] for t in config["input"]}
        self.outputs = frozenset(t["name"] for t in config["output"])
        # Logits declared FP16 are sent as FP16 (numpy has no bfloat16: BF16 stays float32).
        self.output_dtypes = {
            t["name"]: np.float16
            for t in config["output"]
            if t["name"] in ("context_logits", "generation_logits") and t["data_type"] == "TYPE_FP16"
        }
        self.exclude_input_default = _parameter(config, "exclude_input_in_output", "false").lower() in _TRUE
        self.max_beam_width = int(_parameter(config, "max_beam_width", "1"))
        mode = _parameter(config, "engine_mode", "model")
        model_dir = _parameter(config, "model_dir", "")
        if not model_dir:
            raise pb_utils.TritonModelException("parameter model_dir is required")
        max_active = int(_parameter(config, "max_active_requests", "1024"))
        self.synthetic = mode == "synthetic"
        self._setup_metrics(args["model_name"], args["model_version"], max_active)
        if self.synthetic:
            runner = None
            candidates = self._synthetic_candidates(model_dir)
            step_s = float(_parameter(config, "synthetic_step_ms", "20")) / 1000.0
        elif mode == "model":
            device, dtype = self._device(config)
            try:
                check_engine_device(device, dtype)
            except EngineError as exc:
                raise pb_utils.TritonModelException(str(exc)) from None
            runner = TransformersRunner(
                model_dir, int(_parameter(config, "engine_threads", "1")), device=device, dtype=dtype
            )
            candidates, step_s = [], 0.0
        else:
            raise pb_utils.TritonModelException(f"engine_mode must be 'model' or 'synthetic', got {mode!r}")
        guided_backend = _parameter(config, "guided_decoding_backend", "")
        if guided_backend not in ("", "xgrammar"):
            raise pb_utils.TritonModelException(
                f"guided_decoding_backend must be 'xgrammar' or empty, got {guided_backend!r}"
            )
        self.guided_backend = guided_backend
        self.guided: GuidedDecoding | None = None
        self.guided_unavailable = ""
        if guided_backend and runner is not None:
            from transformers import AutoTokenizer

            try:
                self.guided = GuidedDecoding(AutoTokenizer.from_pretrained(model_dir), runner.vocab_size)
            except ImportError as exc:
                # Serve everything else; guided requests get an error saying why.
                self.guided_unavailable = f"xgrammar is not installed ({exc})"
                pb_utils.Logger.log_warn(f"guided decoding disabled: {self.guided_unavailable}")
        self.kv_cache = self._kv_cache(config)
        # The block counts from the start, as the backend's statistics report them before any request
        # (an endpoint picker reads the block size and count from them).
        self._set_gauges(self._kv_values(self.kv_cache.stats()))
        lora_cache = self._lora_cache(config, runner)
        self.engine = Engine(
            runner=runner,
            synthetic_candidates=candidates,
            synthetic_step_s=step_s,
            max_active=max_active,
            on_step=self._publish,
            kv_cache=self.kv_cache,
            synthetic_prefill_s_per_token=float(_parameter(config, "synthetic_prefill_ms_per_token", "0"))
            / 1000.0,
            lora_cache=lora_cache,
        )
        self.engine.start()
        where = "" if runner is None else f" device={runner.device} dtype={runner.dtype}"
        pb_utils.Logger.log_info(
            f"CPU reference engine ready: mode={mode}{where} model_dir={model_dir} "
            f"decoupled={self.decoupled} "
            f"max_active_requests={max_active} guided_decoding_backend={guided_backend or 'none'} "
            f"kv_cache_reuse={self.kv_cache.reuse} tokens_per_block={self.kv_cache.tokens_per_block} "
            f"kv_cache_blocks={self.kv_cache.max_blocks} "
            f"lora_cache_adapters={lora_cache.capacity if lora_cache is not None else 'off'}"
        )

    @staticmethod
    def _device(config: dict[str, Any]) -> tuple[str, str]:
        """engine_device (cpu | cuda) and engine_dtype; "auto": float32 on the CPU, bfloat16 on a GPU."""
        device = _parameter(config, "engine_device", "cpu").strip().lower() or "cpu"
        dtype = _parameter(config, "engine_dtype", "auto").strip().lower() or "auto"
        if dtype == "auto":
            dtype = "float32" if device == "cpu" else "bfloat16"
        return device, dtype

    @staticmethod
    def _kv_cache(config: dict[str, Any]) -> KvCacheManager:
        try:
            tokens_per_block = int(_parameter(config, "tokens_per_block", "32"))
            max_tokens = int(
                _parameter(config, "max_tokens_in_paged_kv_cache", str(_DEFAULT_KV_CACHE_TOKENS))
            )
        except ValueError as exc:
            raise pb_utils.TritonModelException(f"KV cache parameters must be integers: {exc}") from None
        if tokens_per_block < 1 or max_tokens < tokens_per_block:
            raise pb_utils.TritonModelException(
                f"tokens_per_block ({tokens_per_block}) must be >= 1 and max_tokens_in_paged_kv_cache "
                f"({max_tokens}) at least one block"
            )
        return KvCacheManager(
            tokens_per_block=tokens_per_block,
            max_blocks=max_tokens // tokens_per_block,
            reuse=_parameter(config, "enable_kv_cache_reuse", "false").lower() in _TRUE,
        )

    @staticmethod
    def _lora_cache(config: dict[str, Any], runner: TransformersRunner | None) -> LoraCache | None:
        """LoRA on the modules ``lora_target_modules`` names (empty: off), with a cache of
        ``lora_cache_adapters`` adapters (small values make evictions easy to see in tests)."""
        try:
            modules = parse_lora_target_modules(_parameter(config, "lora_target_modules", ""))
            capacity = int(_parameter(config, "lora_cache_adapters", "8"))
        except (EngineError, ValueError) as exc:
            raise pb_utils.TritonModelException(f"LoRA parameters: {exc}") from None
        if not modules or runner is None:
            return None
        if capacity < 1:
            raise pb_utils.TritonModelException("lora_cache_adapters must be >= 1")
        try:
            runner.enable_lora(modules)
        except EngineError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        return LoraCache(capacity, runner.lora_shapes, runner.lora_tensor)

    @staticmethod
    def _synthetic_candidates(model_dir: str) -> list[int]:
        # Synthetic mode never runs a model, and this process is this model's alone: its tokenizer
        # is loaded without torch, which transformers would otherwise import with it (seconds of
        # CPU at every start where torch is installed). Only before transformers is first imported.
        if "torch" not in sys.modules and "transformers" not in sys.modules:
            sys.modules["torch"] = None  # type: ignore[assignment]
        from transformers import AutoTokenizer

        candidates = ordinary_token_ids(AutoTokenizer.from_pretrained(model_dir))
        if not candidates:
            raise pb_utils.TritonModelException(f"no ordinary tokens in the tokenizer of {model_dir}")
        return candidates

    # ---- metrics ----------------------------------------------------------------------------------

    def _setup_metrics(self, model: str, version: str, max_active: int) -> None:
        labels = {"model": model, "version": version}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # The families must outlive their metrics (Triton deletes a family's metrics with it).
        requests = pb_utils.MetricFamily(
            name="nv_trt_llm_request_metrics", description="TRT LLM request metrics", kind=gauge
        )
        inflight = pb_utils.MetricFamily(
            name="nv_trt_llm_inflight_batcher_metrics",
            description="TRT LLM inflight_batcher-specific metrics",
            kind=gauge,
        )
        general = pb_utils.MetricFamily(
            name="nv_trt_llm_general_metrics", description="General TRT LLM metrics", kind=gauge
        )
        kv_blocks = pb_utils.MetricFamily(
            name="nv_trt_llm_kv_cache_block_metrics", description="TRT LLM KV cache block metrics", kind=gauge
        )
        families = [requests, inflight, general, kv_blocks]
        self._gauges = {
            "active": requests.Metric(labels={"request_type": "active", **labels}),
            "max": requests.Metric(labels={"request_type": "max", **labels}),
            "scheduled": requests.Metric(labels={"request_type": "scheduled", **labels}),
            "context": requests.Metric(labels={"request_type": "context", **labels}),
            "waiting": requests.Metric(labels={"request_type": "waiting", **labels}),
            "generation": inflight.Metric(
                labels={"inflight_batcher_specific_metric": "generation_requests", **labels}
            ),
            "context_tokens": inflight.Metric(
                labels={"inflight_batcher_specific_metric": "total_context_tokens", **labels}
            ),
            "iterations": general.Metric(labels={"general_type": "iteration_counter", **labels}),
            "timestamp": general.Metric(labels={"general_type": "timestamp", **labels}),
        }
        for block_type in ("max", "free", "used", "tokens_per", "reused", "fraction"):
            self._gauges[f"kv:{block_type}"] = kv_blocks.Metric(
                labels={"kv_cache_block_type": block_type, **labels}
            )
        peak = pb_utils.MetricFamily(
            name="trtllm_cpu_engine_max_batch_size",
            description="Most sequences the CPU reference engine has stepped together",
            kind=gauge,
        )
        families.append(peak)
        self._gauges["max_batch_size"] = peak.Metric(labels=labels)
        self._counters = {}
        for name, text in (
            ("steps", "Engine loop steps (one token per active sequence each)"),
            ("generated_tokens", "Tokens generated by the CPU reference engine"),
            ("batched_tokens", "Tokens generated in steps shared by two or more sequences"),
            ("completed_requests", "Requests completed (not cancelled)"),
            ("cancelled_requests", "Requests dropped because the client cancelled them"),
            ("lora_loads", "LoRA adapters stored in the engine's cache (sent with their weights)"),
            ("lora_evictions", "LoRA adapters evicted from the engine's cache to make room"),
        ):
            family = pb_utils.MetricFamily(
                name=f"trtllm_cpu_engine_{name}_total", description=text, kind=counter
            )
            families.append(family)
            self._counters[name] = family.Metric(labels=labels)
        self._families = families
        self._gauges["max"].set(max_active)
        self._published: dict[str, float] = {}
        self._last_publish = 0.0
        self._last_log = 0.0
        self._logged_active = -1

    @staticmethod
    def _kv_values(kv: Any) -> dict[str, float]:
        return {
            "kv:max": kv.max_blocks,
            "kv:free": kv.free_blocks,
            "kv:used": kv.used_blocks,
            "kv:tokens_per": kv.tokens_per_block,
            "kv:reused": kv.reused_blocks,
            "kv:fraction": kv.fraction_used,
        }

    def _set_gauges(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            if self._published.get(name) != value:
                self._gauges[name].set(value)
                self._published[name] = value

    def _publish(self, stats: StepStats) -> None:
        """Called by the loop after each step: export the state, at most every few ms unless it changed."""
        now = time.monotonic()
        changed_activity = stats.active_requests != self._published.get("active")
        if not changed_activity and now - self._last_publish < _METRICS_PERIOD_S:
            return
        self._last_publish = now
        values = {
            "active": stats.active_requests,
            "scheduled": stats.scheduled_sequences,
            "context": stats.context_requests,
            "waiting": stats.waiting_requests,
            "generation": stats.generation_sequences,
            "context_tokens": stats.context_tokens,
            "iterations": stats.steps_total,
            "timestamp": int(time.time()),
            "max_batch_size": stats.max_batch_size,
        }
        if stats.kv_cache is not None:
            values.update(self._kv_values(stats.kv_cache))
        self._set_gauges(values)
        totals = {
            "steps": stats.steps_total,
            "generated_tokens": stats.generated_tokens_total,
            "batched_tokens": stats.batched_tokens_total,
            "completed_requests": stats.completed_requests_total,
            "cancelled_requests": stats.cancelled_requests_total,
        }
        lora = self.engine.lora_cache if hasattr(self, "engine") else None
        if lora is not None:
            totals["lora_loads"] = lora.loads
            totals["lora_evictions"] = lora.evictions
        for name, total in totals.items():
            delta = total - self._published.get(f"total:{name}", 0)
            if delta:
                self._counters[name].increment(delta)
                self._published[f"total:{name}"] = total
        if stats.active_requests != self._logged_active and now - self._last_log >= _LOG_PERIOD_S:
            self._last_log = now
            self._logged_active = stats.active_requests
            pb_utils.Logger.log_info(
                f"cpu engine: active_requests={stats.active_requests} batch={stats.scheduled_sequences} "
                f"waiting={stats.waiting_requests} steps={stats.steps_total}"
            )

    # ---- requests ---------------------------------------------------------------------------------

    def execute(self, requests: list[Any]) -> list[Any] | None:
        blocking: list[_BlockingSink] = []
        for request in requests:
            sink: Any = (
                _DecoupledSink(request, self.output_dtypes)
                if self.decoupled
                else _BlockingSink(request, self.output_dtypes)
            )
            if not self.decoupled:
                blocking.append(sink)
            try:
                if _scalar(request, "stop", 0, False):
                    self._stop(request, sink)
                    continue
                self.engine.submit(self._group(request, sink))
            except EngineError as exc:
                sink.send(None, final=True, error=str(exc))
            except Exception as exc:
                pb_utils.Logger.log_error(f"rejecting a malformed request: {exc!r}")
                sink.send(None, final=True, error=f"malformed request: {exc}")
        if self.decoupled:
            return None
        for sink in blocking:
            sink.done.wait()
        return [sink.response for sink in blocking]

    def _stop(self, request: Any, sink: Any) -> None:
        request_id = request.request_id()
        if not request_id:
            raise EngineError("a request id is required to stop a request")
        self.engine.stop_request(request_id)
        sink.send(None, final=True)

    def _group(self, request: Any, sink: Any) -> RequestGroup:
        input_ids = _input(request, "input_ids")
        if input_ids is None or input_ids.ndim != 2:
            raise EngineError("input_ids must have shape [batch, tokens]")
        batch = input_ids.shape[0]
        lengths = _input(request, "input_lengths")
        output_len = _input(request, "request_output_len")
        if lengths is None or output_len is None:
            raise EngineError("input_lengths and request_output_len are required")
        streaming = bool(_scalar(request, "streaming", 0, False))
        if streaming and not self.decoupled:
            raise EngineError("Streaming is only supported in decoupled mode.")
        options = OutputOptions(
            streaming=streaming,
            exclude_input=bool(_scalar(request, "exclude_input_in_output", 0, self.exclude_input_default)),
            return_log_probs=bool(_scalar(request, "return_log_probs", 0, False)),
            return_context_logits=bool(_scalar(request, "return_context_logits", 0, False)),
            return_generation_logits=bool(_scalar(request, "return_generation_logits", 0, False)),
            return_num_input_tokens=bool(_scalar(request, "return_num_input_tokens", 0, False)),
            return_num_output_tokens=bool(_scalar(request, "return_num_output_tokens", 0, False)),
            return_perf_metrics=bool(_scalar(request, "return_perf_metrics", 0, False)),
        )
        if self.synthetic and (options.return_context_logits or options.return_generation_logits):
            raise EngineError("logits are not available in synthetic mode (there is no model)")
        priority = float(_scalar(request, "priority", 0, DEFAULT_PRIORITY))
        if not 0.0 <= priority <= 1.0:
            raise EngineError(f"priority must be between 0.0 and 1.0, got {priority}")
        num_return_sequences = int(_scalar(request, "num_return_sequences", 0, 1))
        if num_return_sequences < 1:
            raise EngineError(f"num_return_sequences must be >= 1, got {num_return_sequences}")
        prompts, params = [], []
        guides: dict[tuple[str, str], CompiledGuide] = {}
        flat_lengths = lengths.reshape(batch, -1)[:, 0]
        for row in range(batch):
            beam_width = int(_scalar(request, "beam_width", row, 1))
            if beam_width != 1:
                raise EngineError(
                    f"beam_width {beam_width} requested: the CPU reference engine only does beam_width 1"
                )
            length = int(flat_lengths[row])
            if not 0 < length <= input_ids.shape[1]:
                raise EngineError(
                    f"input_lengths {length} does not fit input_ids of width {input_ids.shape[1]}"
                )
            prompts.append([int(t) for t in input_ids[row, :length]])
            params.append(self._sampling(request, row, guides))
        return RequestGroup(
            prompts=prompts,
            params=params,
            options=options,
            sink=sink,
            declared_outputs=self.outputs,
            num_return_sequences=num_return_sequences,
            request_id=request.request_id() or "",
            priority=priority,
            lora=self._lora(request),
            prompt_table=self._prompt_table(request, batch),
        )

    @staticmethod
    def _prompt_table(request: Any, batch: int) -> np.ndarray | None:
        """The multimodal encoder's features for the prompt's placeholder ids ([1, rows, hidden])."""
        table = _input(request, "prompt_embedding_table")
        if table is None:
            return None
        if batch != 1 or table.ndim != 3 or table.shape[0] != 1:
            raise EngineError("prompt_embedding_table goes with a single prompt: [1, rows, hidden]")
        return np.asarray(table[0], dtype=np.float32)

    @staticmethod
    def _lora(request: Any) -> LoraInput | None:
        """The LoRA inputs; weights without a task id are ignored, as the backend ignores them."""
        task_id = _scalar(request, "lora_task_id", 0, None)
        if task_id is None:
            return None
        weights = _input(request, "lora_weights")
        config = _input(request, "lora_config")
        if (weights is None) != (config is None):
            raise EngineError("lora_weights and lora_config must be sent together")
        return LoraInput(int(task_id), weights, config)

    def _guide(
        self, request: Any, row: int, compiled: dict[tuple[str, str], CompiledGuide]
    ) -> CompiledGuide | None:
        guide_type = _text(request, "guided_decoding_guide_type", row).strip()
        if not guide_type:
            return None
        if self.guided is None:
            if self.synthetic and self.guided_backend:
                reason = "synthetic mode has no logits to constrain"
            elif self.guided_unavailable:
                reason = self.guided_unavailable
            else:
                reason = "set the model parameter guided_decoding_backend=xgrammar"
            raise EngineError(f"guided decoding is not enabled on this model: {reason}")
        key = (guide_type, _text(request, "guided_decoding_guide", row))
        if key not in compiled:
            compiled[key] = self.guided.compile(*key)
        return compiled[key]

    def _sampling(
        self, request: Any, row: int, guides: dict[tuple[str, str], CompiledGuide]
    ) -> SamplingParams:
        end_id = _scalar(request, "end_id", row, None)
        seed = _scalar(request, "seed", row, None)
        if seed is None:
            seed = _scalar(request, "random_seed", row, 0)
        min_tokens = _scalar(request, "min_tokens", row, None)
        if min_tokens is None:
            min_tokens = _scalar(request, "min_length", row, 0)
        bias = _input(request, "embedding_bias")
        row_bias = None
        if bias is not None and bias.size:
            row_bias = np.asarray(
                bias.reshape(bias.shape[0], -1)[row if bias.shape[0] > row else 0], dtype=np.float32
            )
        return SamplingParams(
            max_new_tokens=int(_scalar(request, "request_output_len", row, 0)),
            end_id=None if end_id is None or int(end_id) < 0 else int(end_id),
            temperature=float(_scalar(request, "temperature", row, 1.0)),
            top_k=int(_scalar(request, "runtime_top_k", row, 0)),
            top_p=float(_scalar(request, "runtime_top_p", row, 0.0)),
            seed=int(seed),
            min_tokens=int(min_tokens),
            repetition_penalty=float(_scalar(request, "repetition_penalty", row, 1.0)),
            presence_penalty=float(_scalar(request, "presence_penalty", row, 0.0)),
            frequency_penalty=float(_scalar(request, "frequency_penalty", row, 0.0)),
            stop_words=_word_lists(request, "stop_words_list", row),
            bad_words=_word_lists(request, "bad_words_list", row),
            embedding_bias=row_bias,
            guide=self._guide(request, row, guides),
        )

    def finalize(self) -> None:
        self.engine.shutdown()
