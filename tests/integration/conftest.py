"""One real tritonserver for the whole test session, serving several rendered CPU repositories.

``triton_stack`` starts it once (free ports, a private temporary directory) and describes what it
serves: for each repository, its Triton model names, tokenizer directory, contract variant and
whether the ensemble exposes ``output_ids``. ``stream_infer`` sends one request on its own gRPC
stream, the way a gateway does.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deploy.devstack import DEV_TOKENS_PER_BLOCK, TritonServer
from deploy.families import FAMILIES, build_family_model
from deploy.model_repo import LlmapiSettings, render_llmapi_repository, render_repository
from deploy.tiny_model import build_tiny_model
from tests.support.redis_server import redis_server, redis_url  # noqa: F401

STARTUP_TIMEOUT_S = 600.0
SYNTHETIC_STEP_MS = 20.0
LORA_CACHE_ADAPTERS = 2


@dataclass(frozen=True, slots=True)
class StackModel:
    """One rendered repository served by the session's tritonserver."""

    key: str
    ensemble: str
    engine: str
    preprocessing: str
    postprocessing: str
    tokenizer_dir: Path
    tokenizer_kind: str
    variant: str
    engine_mode: str
    output_ids: bool
    # Rendered like upstream's repository (see STOCK below).
    stock: bool = False
    decoupled: bool = True
    # The real model family whose tokenizer this repository serves (deploy.families), if any.
    family: str | None = None


@dataclass(frozen=True, slots=True)
class LlmapiModel:
    """One CPU stand-in of TensorRT-LLM's llmapi model served by the session's tritonserver."""

    key: str
    # Its Triton model name: anything, as users name it (upstream's is tensorrt_llm).
    name: str
    tokenizer_dir: Path
    profile: str
    decoupled: bool


@dataclass(frozen=True, slots=True)
class TritonStack:
    """The running server and the models it serves, keyed like ``bpe_current``."""

    server: TritonServer
    models: Mapping[str, StackModel]
    llmapi: Mapping[str, LlmapiModel] = field(default_factory=dict)

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    @property
    def http_url(self) -> str:
        return self.server.http_url

    @property
    def metrics_url(self) -> str:
        return self.server.metrics_url

    def metric(self, name: str, **labels: str) -> float:
        """Current value of one Prometheus sample on Triton's metrics port (0 if absent)."""
        wanted = {k: v for k, v in labels.items()}
        for line in self.server.metrics_text().splitlines():
            match = _SAMPLE.match(line)
            if match is None or match.group("name") != name:
                continue
            found = dict(_LABEL.findall(match.group("labels") or ""))
            if all(found.get(k) == v for k, v in wanted.items()):
                return float(match.group("value"))
        return 0.0


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# key: (tokenizer kind, variant, engine mode, ensemble exposes output_ids)
STACK_LAYOUT: dict[str, tuple[str, str, str, bool]] = {
    "bpe_current": ("bpe", "current", "model", True),
    "bpe_legacy": ("bpe", "legacy", "model", True),
    "metaspace_current": ("metaspace", "current", "model", True),
    "bpe_stock": ("bpe", "current", "model", False),
    "bpe_synthetic": ("bpe", "current", "synthetic", True),
}
# Stock-faithful ensembles, as users run upstream's repositories: postprocessing decoding each
# response alone (one per tokenizer, shared), text-only outputs, the tokenizer's preprocessing of
# the repositories above. key: (tokenizer kind, variant, decoupled, the engine: a repository above
# whose engine it composes, or None for its own). Engines are what a stack pays for (a torch
# process each), so the decoupled ones are shared with the repositories above; the others are
# rendered as upstream's quick start leaves them (guided_decoding_backend unset), legacy ones with
# exclude_input_in_output as upstream's guides set it.
STOCK_LAYOUT: dict[str, tuple[str, str, bool, str | None]] = {
    "stock_bpe_current_decoupled": ("bpe", "current", True, "bpe_current"),
    "stock_bpe_legacy_decoupled": ("bpe", "legacy", True, "bpe_legacy"),
    "stock_metaspace_current_decoupled": ("metaspace", "current", True, "metaspace_current"),
    "stock_metaspace_legacy_decoupled": ("metaspace", "legacy", True, None),
    "stock_bpe_current_whole": ("bpe", "current", False, None),
    "stock_bpe_legacy_whole": ("bpe", "legacy", False, None),
    "stock_metaspace_current_whole": ("metaspace", "current", False, None),
    "stock_metaspace_legacy_whole": ("metaspace", "legacy", False, None),
}
PREPROCESSING_OF = {"bpe": "bpe_current", "metaspace": "metaspace_current"}
# CPU stand-ins of TensorRT-LLM's llmapi model, in one repository of their own (one torch process
# each). key: (model.py profile, decoupled).
LLMAPI_LAYOUT: dict[str, tuple[str, bool]] = {
    "llmapi_current": ("current", True),
    "llmapi_current_whole": ("current", False),
    "llmapi_v12": ("v1.2", True),
    "llmapi_v12_whole": ("v1.2", False),
}
# The real families (deploy.families): each a tiny random model of the family's architecture around
# its own tokenizer. One engine each (a torch process apiece); an ensemble (two more Python
# processes, each holding the tokenizer) only where the text route differs in kind: a tokenizer
# that adds BOS, byte-level (Llama 3.1) and SentencePiece (Llama 2), and one that adds nothing
# (Qwen3). Its ensemble exposes output_ids, so both routes reach the same engine.
# key: (family, with an ensemble)
FAMILY_LAYOUT: dict[str, tuple[str, bool]] = {
    f"family_{name}": (name, name in ("llama3_1", "llama2", "qwen3")) for name in FAMILIES
}


@pytest.fixture(scope="session")
def triton_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonStack]:
    root = tmp_path_factory.mktemp("triton_stack")
    model_dirs = {kind: build_tiny_model(kind) for kind in ("bpe", "metaspace")}
    models: dict[str, StackModel] = {}
    repositories = []
    for key, (kind, variant, mode, output_ids) in STACK_LAYOUT.items():
        prefix = f"{key}_"
        variables: dict[str, object] = {
            "tokenizer_dir": model_dirs[kind],
            "engine_mode": mode,
            "name_prefix": prefix,
            "ensemble_output_ids": output_ids,
            # As `make run` serves (and production configurations do): KV cache reuse on.
            "enable_kv_cache_reuse": True,
            "tokens_per_block": DEV_TOKENS_PER_BLOCK,
            # A LoRA cache this small makes evictions easy to reach (test_lora.py).
            "lora_cache_adapters": LORA_CACHE_ADAPTERS,
        }
        if mode == "synthetic":
            variables["synthetic_step_ms"] = SYNTHETIC_STEP_MS
        repositories.append(
            render_repository(root / key, backend="cpu", variant=variant, variables=variables)
        )
        models[key] = StackModel(
            key=key,
            ensemble=f"{prefix}ensemble",
            engine=f"{prefix}tensorrt_llm",
            preprocessing=f"{prefix}preprocessing",
            postprocessing=f"{prefix}postprocessing",
            tokenizer_dir=model_dirs[kind],
            tokenizer_kind=kind,
            variant=variant,
            engine_mode=mode,
            output_ids=output_ids,
        )
    for kind in ("bpe", "metaspace"):
        variables = {
            "tokenizer_dir": model_dirs[kind],
            "name_prefix": f"stock_{kind}_",
            "stock_postprocessing": True,
        }
        repositories.append(
            render_repository(
                root / f"stock_{kind}",
                backend="cpu",
                variant="current",
                variables=variables,
                models=("postprocessing",),
            )
        )
    for key, (kind, variant, decoupled, shared) in STOCK_LAYOUT.items():
        prefix = f"{key}_"
        engine = models[shared].engine if shared else f"{prefix}tensorrt_llm"
        variables = {
            "tokenizer_dir": model_dirs[kind],
            "name_prefix": prefix,
            "ensemble_output_ids": False,
            "decoupled": decoupled,
            "guided_decoding_backend": "",
            "exclude_input_in_output": variant == "legacy",
            "preprocessing_model": models[PREPROCESSING_OF[kind]].preprocessing,
            "postprocessing_model": f"stock_{kind}_postprocessing",
            "engine_model": engine,
        }
        repositories.append(
            render_repository(
                root / key,
                backend="cpu",
                variant=variant,
                variables=variables,
                models=("ensemble",) if shared else ("tensorrt_llm", "ensemble"),
                composed=[
                    d for d in repositories if d.name in (PREPROCESSING_OF[kind], f"stock_{kind}", shared)
                ],
            )
        )
        models[key] = StackModel(
            key=key,
            ensemble=f"{prefix}ensemble",
            engine=engine,
            preprocessing=models[PREPROCESSING_OF[kind]].preprocessing,
            postprocessing=f"stock_{kind}_postprocessing",
            tokenizer_dir=model_dirs[kind],
            tokenizer_kind=kind,
            variant=variant,
            engine_mode="model",
            output_ids=False,
            stock=True,
            decoupled=decoupled,
        )
    llmapi: dict[str, LlmapiModel] = {}
    for key, (profile, decoupled) in LLMAPI_LAYOUT.items():
        settings = LlmapiSettings(
            model=str(model_dirs["bpe"]),
            name=key,
            profile=profile,
            decoupled=decoupled,
            stand_in=True,
            tokens_per_block=DEV_TOKENS_PER_BLOCK,
        )
        repositories.append(render_llmapi_repository(root / key, settings))
        llmapi[key] = LlmapiModel(key, key, model_dirs["bpe"], profile, decoupled)
    for key, (family, ensemble) in FAMILY_LAYOUT.items():
        model_dir = build_family_model(family)
        prefix = f"{key}_"
        variables = {
            "tokenizer_dir": model_dir,
            "engine_mode": "model",
            "name_prefix": prefix,
            "ensemble_output_ids": True,
            "enable_kv_cache_reuse": True,
            "tokens_per_block": DEV_TOKENS_PER_BLOCK,
        }
        repositories.append(
            render_repository(
                root / key,
                backend="cpu",
                variant="current",
                variables=variables,
                models=None if ensemble else ("tensorrt_llm",),
            )
        )
        models[key] = StackModel(
            key=key,
            ensemble=f"{prefix}ensemble" if ensemble else "",
            engine=f"{prefix}tensorrt_llm",
            preprocessing=f"{prefix}preprocessing" if ensemble else "",
            postprocessing=f"{prefix}postprocessing" if ensemble else "",
            tokenizer_dir=model_dir,
            tokenizer_kind=FAMILIES[family].model_type,
            variant="current",
            engine_mode="model",
            output_ids=True,
            family=family,
        )
    # Some thirty Python models start at once; on a loaded machine a stub can take longer to come up
    # than the Python backend's default 30 s, which fails the whole server.
    stub_timeout = f"--backend-config=python,stub-timeout-seconds={int(STARTUP_TIMEOUT_S)}"
    server = TritonServer(repositories, work_dir=root / "server", extra_args=[stub_timeout])
    server.start()
    done = threading.Event()
    watchdog = threading.Thread(target=_stop_when_crashed, args=(server, done), daemon=True)
    watchdog.start()
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
        yield TritonStack(server=server, models=models, llmapi=llmapi)
    finally:
        done.set()
        server.stop()


def _stop_when_crashed(server: TritonServer, done: threading.Event) -> None:
    """Stop the server once its log says a fatal signal reached it.

    Triton's handler prints "Signal (N) received." and a backtrace; after a crash that corrupted the
    heap (the CPU build has aborted with "double free or corruption" under heavy load), the handler
    itself can hang, leaving a server that accepts calls and answers none, so every later test on
    it would wait for its client's timeout. Stopped, the rest fail at once with the log's reason.
    """
    offset = 0
    while not done.wait(1.0):
        try:
            with server.log_file.open("rb") as log:
                log.seek(offset)
                chunk = log.read()
        except OSError:
            continue
        # A line cut at the end of this read is read again whole next time.
        complete = chunk.rfind(b"\n") + 1
        offset += complete
        if re.search(rb"^Signal \(\d+\) received", chunk[:complete], re.MULTILINE):
            server.stop(timeout=5.0)
            return


@dataclass(slots=True)
class StreamResponse:
    """One response of a request: its output tensors, whether it is final, or its error."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    final: bool = False
    error: str | None = None


def _infer_input(name: str, value: np.ndarray) -> grpcclient.InferInput:
    dtype = "BYTES" if value.dtype == object else grpcclient.np_to_triton_dtype(value.dtype)
    tensor = grpcclient.InferInput(name, list(value.shape), dtype)
    tensor.set_data_from_numpy(value)
    return tensor


def stream_infer(
    url: str,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    request_id: str = "",
    timeout: float = 60.0,
    on_response: Callable[[StreamResponse, grpcclient.InferenceServerClient], bool] | None = None,
) -> list[StreamResponse]:
    """Send one request on its own stream and collect its responses up to the final one.

    ``on_response`` sees each response with the client; returning True stops collecting and
    cancels the stream (the request is cancelled inside Triton).
    """
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    collected: list[StreamResponse] = []
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model,
            [_infer_input(name, value) for name, value in inputs.items()],
            request_id=request_id,
            enable_empty_final_response=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            result, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
            if error is not None:
                collected.append(StreamResponse(final=True, error=str(error)))
                break
            response = result.get_response()
            final_param = response.parameters.get("triton_final_response")
            item = StreamResponse(
                outputs={o.name: result.as_numpy(o.name) for o in response.outputs},
                final=bool(final_param is not None and final_param.bool_param),
            )
            collected.append(item)
            if item.final:
                break
            if on_response is not None and on_response(item, client):
                client.stop_stream(cancel_requests=True)
                return collected
        client.stop_stream()
    finally:
        client.close()
    return collected


def scalar(value: object, dtype: Any) -> np.ndarray:
    """A per-request scalar as Triton wants it with max_batch_size > 0: shape [1, 1]."""
    if dtype is object:
        return np.array([[value if isinstance(value, bytes) else str(value).encode()]], dtype=object)
    return np.array([[value]], dtype=dtype)


def family_routes(stack: TritonStack, family: str) -> tuple[str, ...]:
    """The routes the stack serves a family on (the engine route always)."""
    return ("ensemble", "engine") if stack.models[f"family_{family}"].ensemble else ("engine",)


def family_model_spec(stack: TritonStack, family: str, *, route: str = "engine", **fields: str) -> str:
    """A `--model` spec serving one family of the stack (name `FAMILY-ROUTE` unless given);
    `fields` adds or overrides spec fields (tool_parser, reasoning_parser, chat_template, ...)."""
    m = stack.models[f"family_{family}"]
    routes = family_routes(stack, family)
    if route not in routes:
        raise ValueError(f"the stack serves {family} on the {' and '.join(routes)} route only")
    spec = {
        "name": f"{family}-{route}",
        "tokenizer": str(m.tokenizer_dir),
        "route": route,
        "triton_model": m.ensemble or m.engine,
        "engine_model": m.engine,
        **fields,
    }
    return ",".join(f"{k}={v}" for k, v in spec.items())


def llmapi_model_spec(stack: TritonStack, name: str, key: str = "llmapi_current", **fields: str) -> str:
    """A `--model` spec serving one llmapi stand-in of the stack as a new user configures it (a
    name, a tokenizer, the Triton model); `fields` adds spec fields (tool_parser, ...)."""
    m = stack.llmapi[key]
    spec = {"name": name, "tokenizer": str(m.tokenizer_dir), "triton_model": m.name, **fields}
    return ",".join(f"{k}={v}" for k, v in spec.items())
