"""CPU stand-in for TensorRT-LLM's ``llmapi`` Triton model: our own code behind upstream's exact
inputs and outputs (``../config.pbtxt``), generating with the CPU reference engine (``engine.py``,
copied beside this file when the repository is rendered) and a tiny transformers model.

Faithful to what a client of the real model sees: the prompt is tokenized here with the tokenizer's
special tokens (BOS) added; ``text_output`` is the cumulative text in every streamed response;
``finish_reason``/``stop_reason`` are strings (``"None"`` until the end); 32 max tokens and the
prompt echoed when the request leaves them out; ``sampling_param_stop`` matched on token ids; a
``stop`` request cancels the request with its id and is itself answered with a CANCELLED error;
cancellation polled every ``cancellation_check_period_ms`` (100); errors INTERNAL with the prefix
``Error generating request: ``. ``model.yaml``'s ``cpu_stand_in.profile`` picks the model.py
version: ``current`` streams per step and answers nothing for errors raised before a request is
registered (streaming on a model that is not decoupled, ``best_of`` under greedy sampling, a bad LoRA,
a too-long prompt: logged only); ``v1.2`` answers a streaming request with one response holding the whole
text, a stopped request not at all, and every error.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml
from engine import (
    LORA_MODULES,
    Engine,
    EngineError,
    KvCacheManager,
    LoraCache,
    LoraInput,
    OutputOptions,
    RequestGroup,
    SamplingParams,
    TransformersRunner,
    read_peft_adapter,
)

ERROR_PREFIX = "Error generating request: "
CANCELLED = "Request cancelled by client"
DEFAULT_MAX_TOKENS = 32
PROFILES = ("current", "v1.2")


def _input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request: Any, name: str) -> Any:
    """A scalar input (shape [1], no batch dimension), or None when absent."""
    value = _input(request, name)
    if value is None:
        return None
    if value.size != 1:
        raise ValueError(f"Expected a scalar tensor for tensor {name}")
    item = value.item(0)
    return item.decode("utf-8") if isinstance(item, bytes) else item


def stop_words(values: np.ndarray | None, tokenizer: Any) -> list[tuple[str, tuple[int, ...]]]:
    """``sampling_param_stop``'s strings (bytes as they reach the model, or str), each with its ids
    tokenized alone: the LLM API matches stop strings on token ids, not on the text. Empty strings
    stop nothing."""
    out = []
    for item in [] if values is None else values.reshape(-1).tolist():
        word = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        if word:
            out.append((word, tuple(tokenizer.encode(word, add_special_tokens=False))))
    return out


def match_stop(ids: list[int], stops: list[tuple[str, tuple[int, ...]]]) -> tuple[str, list[int]] | None:
    """The first stop string whose ids end the generated ids, and the ids without it (the stop
    string is not part of the output); None when none does. A stop string present in the text but
    generated as other tokens does not match, as in the LLM API."""
    for word, word_ids in stops:
        if word_ids and len(ids) >= len(word_ids) and tuple(ids[-len(word_ids) :]) == word_ids:
            return word, ids[: -len(word_ids)]
    return None


class _Unanswered(Exception):
    """A request refused before it is registered (the current model.py logs these, answers none)."""


@dataclass(eq=False)
class _Request:
    """One registered request: its Triton request, what it asked for, what it generated."""

    triton_request: Any
    sender: Any
    user_id: str
    internal_id: str
    prompt: str
    streaming: bool
    exclude_input: bool
    return_finish_reason: bool
    return_stop_reason: bool
    max_tokens: int
    stops: list[tuple[str, tuple[int, ...]]]
    perf_metrics: bool = False
    # The prompt's KV cache blocks the engine reused (with perf metrics).
    reused_blocks: int = 0
    generated: list[int] = field(default_factory=list)
    stop_reason: str | None = None
    # Set by the cancellation loop (the client went away) or a `stop` request.
    cancelled: bool = False
    stopped: bool = False
    done: bool = False


class _Sink:
    """The engine's responses for one request, turned into the llmapi model's."""

    def __init__(self, model: TritonPythonModel, state: _Request) -> None:
        self._model = model
        self._state = state

    def is_cancelled(self) -> bool:
        return self._state.cancelled

    def send(self, tensors: dict[str, np.ndarray] | None, *, final: bool, error: str | None = None) -> None:
        self._model.on_engine_response(self._state, tensors, final=final, error=error)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.inputs = {t["name"] for t in config["input"]}
        settings_file = os.path.join(args["model_repository"], args["model_version"], "model.yaml")
        with open(settings_file, encoding="utf-8") as f:
            settings = yaml.safe_load(f)
        stand_in = settings.get("cpu_stand_in") or {}
        self.profile = str(stand_in.get("profile", "current"))
        if self.profile not in PROFILES:
            raise pb_utils.TritonModelException(f"cpu_stand_in.profile must be one of {PROFILES}")
        triton_config = settings.get("triton_config") or {}
        self.cancellation_period_s = int(triton_config.get("cancellation_check_period_ms", 100)) / 1000.0
        model_dir = str(settings["model"])
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        runner = TransformersRunner(model_dir, int(stand_in.get("engine_threads", 1)))
        self.runner = runner
        # model.yaml's triton_config.multimodal: image_url is read, and the chat template rendered
        # here around text_input and the images' placeholders (upstream: the LLM API's
        # default_multimodal_input_loader); without it image_url is ignored, as upstream does.
        self.processor: Any = None
        if triton_config.get("multimodal"):
            from transformers import AutoProcessor

            self.processor = AutoProcessor.from_pretrained(model_dir)
        self.max_positions = runner.max_positions
        self._setup_metrics(args["model_name"], args["model_version"])
        self.lora_cache: LoraCache | None = None
        if "lora_id" in self.inputs:
            # As the LLM API's PEFT cache: adapters loaded from lora_path, reloaded after eviction.
            try:
                runner.enable_lora(sorted(m for m in LORA_MODULES if m != 0))
            except EngineError as exc:
                pb_utils.Logger.log_warn(f"LoRA off: {exc}")
            else:
                capacity = int(stand_in.get("lora_cache_adapters", 8))
                self.lora_cache = LoraCache(capacity, runner.lora_shapes, runner.lora_tensor)
        kv_cache = settings.get("kv_cache_config") or {}
        tokens_per_block = int(kv_cache.get("tokens_per_block", 32))
        self.engine = Engine(
            runner=runner,
            kv_cache=KvCacheManager(
                tokens_per_block=tokens_per_block,
                max_blocks=262144 // tokens_per_block,
                reuse=bool(kv_cache.get("enable_block_reuse", True)),
            ),
            lora_cache=self.lora_cache,
        )
        self.engine.start()
        self.lock = threading.Lock()
        self.requests: dict[str, _Request] = {}
        self.by_user_id: dict[str, set[str]] = {}
        self.next_id = 0
        self.running = True
        self.cancellation_thread = threading.Thread(target=self._cancellation_loop, daemon=True)
        self.cancellation_thread.start()
        pb_utils.Logger.log_info(
            f"llmapi CPU stand-in ready: profile={self.profile} decoupled={self.decoupled} model={model_dir}"
        )

    # ---- metrics (the tests' view of the stand-in's own state) -----------------------------------

    def _setup_metrics(self, model: str, version: str) -> None:
        labels = {"model": model, "version": version}
        active = pb_utils.MetricFamily(
            name="llmapi_stand_in_active_requests",
            description="Requests the llmapi stand-in is generating",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        cancelled = pb_utils.MetricFamily(
            name="llmapi_stand_in_cancelled_requests_total",
            description="Requests the llmapi stand-in stopped because their client cancelled them",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        completed = pb_utils.MetricFamily(
            name="llmapi_stand_in_completed_requests_total",
            description="Requests the llmapi stand-in finished",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self._families = [active, cancelled, completed]
        self._active = active.Metric(labels=labels)
        self._cancelled = cancelled.Metric(labels=labels)
        self._completed = completed.Metric(labels=labels)

    def _update_active(self) -> None:
        self._active.set(len(self.requests))

    # ---- requests ---------------------------------------------------------------------------------

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                if _scalar(request, "stop"):
                    self._stop(request, sender)
                    continue
                self._start(request, sender)
            except _Unanswered as exc:
                pb_utils.Logger.log_error(f"[trtllm] Error generating request: {exc}")
                if self.profile == "v1.2":
                    self._send_error(sender, str(exc))
            except Exception as exc:  # an error after registration is always answered
                pb_utils.Logger.log_error(f"[trtllm] Error generating request: {exc}")
                self._send_error(sender, str(exc))
        return None

    def _send_error(self, sender: Any, message: str, *, cancelled: bool = False) -> None:
        if cancelled:
            error = pb_utils.TritonError(CANCELLED, pb_utils.TritonError.CANCELLED)
        else:
            error = pb_utils.TritonError(ERROR_PREFIX + message)
        sender.send(
            pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        )

    def _stop(self, request: Any, sender: Any) -> None:
        user_id = request.request_id()
        if not user_id:
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("A request id must be provided for request cancellation")
                ),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        with self.lock:
            for internal_id in self.by_user_id.pop(user_id, set()):
                state = self.requests.get(internal_id)
                if state is not None:
                    state.stopped = True
                    self.engine.stop_request(internal_id)
        self._send_error(sender, "", cancelled=True)

    def _start(self, request: Any, sender: Any) -> None:
        text = _input(request, "text_input")
        if text is None:
            raise _Unanswered("text_input is missing from the request")
        if text.ndim > 1:
            raise _Unanswered("The current implementation only supports text_input being a 1D tensor.")
        prompt = text[0].decode("utf-8") if isinstance(text[0], bytes) else str(text[0])
        streaming = bool(_scalar(request, "streaming") or False)
        if streaming and not self.decoupled:
            raise _Unanswered("Streaming is only supported in decoupled mode.")
        temperature = _scalar(request, "sampling_param_temperature")
        top_k = _scalar(request, "sampling_param_top_k")
        top_p = _scalar(request, "sampling_param_top_p")
        best_of = _scalar(request, "sampling_param_best_of") or 1
        # The LLM API's greedy decoding: top_k unset or 1, top_p unset or 0.
        greedy = (not top_k or top_k == 1) and not top_p
        if best_of > 1 and greedy:
            raise _Unanswered(f"Greedy decoding in the LLM API does not allow best_of ({best_of}) > 1")
        max_tokens = _scalar(request, "sampling_param_max_tokens")
        max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
        # The LLM API tokenizes a text prompt itself, adding the tokenizer's special tokens (BOS).
        ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        limit = self.max_positions
        if limit is not None and len(ids) + max_tokens > limit:
            raise _Unanswered(
                f"The sum of prompt length ({len(ids)}) and max_tokens ({max_tokens}) should not exceed "
                f"max_seq_len ({limit})"
            )
        stops = stop_words(_input(request, "sampling_param_stop"), self.tokenizer)
        table = None
        urls = _input(request, "image_url") if self.processor is not None else None
        if urls is not None and urls.size:
            ids, table = self._multimodal(prompt, urls)
            if limit is not None and len(ids) + max_tokens > limit:
                raise _Unanswered(
                    f"The sum of prompt length ({len(ids)}) and max_tokens ({max_tokens}) should not "
                    f"exceed max_seq_len ({limit})"
                )
        try:
            lora = self._lora(request)
        except (ValueError, OSError) as exc:
            # The LoRA request is built before the request is registered: never answered.
            raise _Unanswered(str(exc)) from None
        if top_k:
            sampled_k, sampled_p = int(top_k), float(top_p or 0.0)
        else:
            sampled_k, sampled_p = 0, float(top_p or 0.0)
        params = SamplingParams(
            max_new_tokens=max_tokens,
            end_id=self.tokenizer.eos_token_id,
            temperature=1.0 if temperature is None else float(temperature),
            top_k=sampled_k,
            top_p=sampled_p,
            seed=int(_scalar(request, "sampling_param_seed") or 0),
            presence_penalty=float(_scalar(request, "sampling_param_presence_penalty") or 0.0),
            frequency_penalty=float(_scalar(request, "sampling_param_frequency_penalty") or 0.0),
            stop_words=tuple(word_ids for _, word_ids in stops if word_ids),
        )
        with self.lock:
            self.next_id += 1
            internal_id = str(self.next_id)
            user_id = request.request_id() or ""
            state = _Request(
                triton_request=request,
                sender=sender,
                user_id=user_id,
                internal_id=internal_id,
                prompt=prompt,
                streaming=streaming,
                exclude_input=bool(_scalar(request, "sampling_param_exclude_input_from_output") or False),
                return_finish_reason=bool(_scalar(request, "return_finish_reason") or False),
                return_stop_reason=bool(_scalar(request, "return_stop_reason") or False),
                max_tokens=max_tokens,
                stops=stops,
                perf_metrics=bool(_scalar(request, "sampling_param_return_perf_metrics") or False),
            )
            self.requests[internal_id] = state
            if user_id:
                self.by_user_id.setdefault(user_id, set()).add(internal_id)
            self._update_active()
        self.engine.submit(
            RequestGroup(
                prompts=[ids],
                params=[params],
                options=OutputOptions(
                    streaming=True, exclude_input=True, return_perf_metrics=state.perf_metrics
                ),
                sink=_Sink(self, state),
                declared_outputs=frozenset({"output_ids", "kv_cache_reused_blocks"}),
                request_id=internal_id,
                lora=lora,
                prompt_table=table,
            )
        )

    def _multimodal(self, question: str, urls: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The prompt ids and image features of a question with images: one user message of each
        image's placeholder then the question, joined by newlines (the LLM API's placement for
        Gemma 3: before the text), through the chat template with its generation prompt; the
        processor expands the placeholders and the model's vision tower gives the features the
        engine reads for the image ids (vocabulary size + k)."""
        import base64
        import io

        import torch
        from PIL import Image

        images = []
        for url in urls.reshape(-1).tolist():
            text = url.decode("utf-8") if isinstance(url, bytes) else str(url)
            head, comma, payload = text.partition(",")
            if not (head.startswith("data:image/") and head.endswith(";base64") and comma):
                raise ValueError("image_url: the CPU stand-in takes base64 data: URIs only")
            images.append(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))
        placeholder = self.processor.boi_token
        content = "\n".join([placeholder] * len(images) + [question])
        prompt = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        encoded = self.processor(text=prompt, images=images, add_special_tokens=False, return_tensors="pt")
        model = self.runner.model
        image_token = int(model.config.image_token_id)
        vocab = self.runner.vocab_size
        ids = [int(t) for t in encoded["input_ids"][0]]
        rows = iter(range(vocab, vocab + len(ids)))
        with torch.inference_mode():
            features = model.model.get_image_features(encoded["pixel_values"]).pooler_output
        table = features.reshape(-1, features.shape[-1]).float().numpy()
        return [next(rows) if t == image_token else t for t in ids], table

    def _lora(self, request: Any) -> LoraInput | None:
        """lora_id, lora_name and lora_path together, as the LLM API's LoRARequest takes them: the
        adapter from the cache, else loaded from the path (again after an eviction)."""
        values = {name: _scalar(request, name) for name in ("lora_id", "lora_name", "lora_path")}
        if all(v is None for v in values.values()):
            return None
        if any(v is None for v in values.values()) or self.lora_cache is None:
            raise ValueError("lora_id, lora_name and lora_path must be given together")
        task_id = int(values["lora_id"])
        if task_id in self.lora_cache:
            return LoraInput(task_id)
        return read_peft_adapter(str(values["lora_path"]), task_id)

    def _cancellation_loop(self) -> None:
        """Like the model's own loop: every period, requests whose client went away are cancelled."""
        while self.running:
            time.sleep(self.cancellation_period_s)
            with self.lock:
                for state in self.requests.values():
                    if not state.cancelled and state.triton_request.is_cancelled():
                        state.cancelled = True

    # ---- responses --------------------------------------------------------------------------------

    def on_engine_response(
        self, state: _Request, tensors: dict[str, np.ndarray] | None, *, final: bool, error: str | None
    ) -> None:
        if state.done:
            return
        if tensors is not None and "output_ids" in tensors:
            state.generated.extend(int(t) for t in tensors["output_ids"].reshape(-1))
        if tensors is not None and "kv_cache_reused_blocks" in tensors:
            state.reused_blocks = int(tensors["kv_cache_reused_blocks"].reshape(-1)[0])
        if error is not None:
            self._forget(state)
            if state.cancelled:
                self._cancelled.increment(1)
                self._send_error(state.sender, "", cancelled=True)
            else:
                self._send_error(state.sender, error)
            return
        ids = state.generated
        matched = match_stop(ids, state.stops)
        if matched is not None:
            state.stop_reason, ids = matched
        if not final:
            if state.streaming and self.profile == "current" and state.stop_reason is None:
                self._respond(state, ids, finish_reason=None, final=False)
            return
        self._forget(state)
        self._completed.increment(1)
        if state.stopped and self.profile == "v1.2":
            return  # 1.2.x leaves a request stopped by a `stop` request without a reply
        if state.stopped:
            reason = "cancelled"
        elif state.stop_reason is not None or len(state.generated) < state.max_tokens:
            reason = "stop"
        else:
            reason = "length"
        self._respond(state, ids, finish_reason=reason, final=True)

    def _respond(self, state: _Request, ids: list[int], *, finish_reason: str | None, final: bool) -> None:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if final and not state.streaming and not state.exclude_input:
            text = state.prompt + text
        outputs = [pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=np.object_))]
        if state.return_finish_reason:
            outputs.append(
                pb_utils.Tensor("finish_reason", np.asarray([str(finish_reason)], dtype=np.object_))
            )
        if state.return_stop_reason:
            stop_reason = state.stop_reason if final else None
            outputs.append(pb_utils.Tensor("stop_reason", np.asarray([str(stop_reason)], dtype=np.object_)))
        if state.perf_metrics:
            # As the model sends its perf outputs: strings, whatever the config declares.
            reused = np.asarray([str(state.reused_blocks).encode()], dtype=np.object_)
            outputs.append(pb_utils.Tensor("kv_cache_reused_block", reused))
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        state.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)

    def _forget(self, state: _Request) -> None:
        state.done = True
        with self.lock:
            self.requests.pop(state.internal_id, None)
            if state.user_id:
                ids = self.by_user_id.get(state.user_id)
                if ids is not None:
                    ids.discard(state.internal_id)
                    if not ids:
                        self.by_user_id.pop(state.user_id, None)
            self._update_active()

    def finalize(self) -> None:
        self.running = False
        self.engine.shutdown()
