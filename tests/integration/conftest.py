"""One real tritonserver for the whole test session, serving several rendered CPU repositories.

``triton_stack`` starts it once (free ports, a private temporary directory) and describes what it
serves: for each repository, its Triton model names, tokenizer directory, contract variant and
whether the ensemble exposes ``output_ids``. ``stream_infer`` sends one request on its own gRPC
stream, the way a gateway does.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deploy.devstack import TritonServer
from deploy.model_repo import render_repository
from deploy.tiny_model import build_tiny_model

STARTUP_TIMEOUT_S = 300.0
SYNTHETIC_STEP_MS = 20.0


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


@dataclass(frozen=True, slots=True)
class TritonStack:
    """The running server and the models it serves, keyed like ``bpe_current``."""

    server: TritonServer
    models: Mapping[str, StackModel]

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
# Stock-faithful repositories, as users run upstream's: postprocessing decoding each response
# alone, ensembles with text only, guided decoding not set up (the quick start leaves
# guided_decoding_backend unset) and the prompt excluded by the engine parameter (as upstream's
# guides set it). key: (tokenizer kind, variant, decoupled).
STOCK_LAYOUT: dict[str, tuple[str, str, bool]] = {
    f"stock_{kind}_{variant}_{'decoupled' if decoupled else 'whole'}": (kind, variant, decoupled)
    for kind in ("bpe", "metaspace")
    for variant in ("current", "legacy")
    for decoupled in (True, False)
}
STOCK_VARIABLES: dict[str, object] = {
    "ensemble_output_ids": False,
    "stock_postprocessing": True,
    "guided_decoding_backend": "",
    "exclude_input_in_output": True,
}


@pytest.fixture(scope="session")
def triton_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonStack]:
    root = tmp_path_factory.mktemp("triton_stack")
    model_dirs = {kind: build_tiny_model(kind) for kind in ("bpe", "metaspace")}
    models: dict[str, StackModel] = {}
    repositories = []
    layouts = [
        (key, kind, variant, mode, output_ids, False, True)
        for key, (kind, variant, mode, output_ids) in STACK_LAYOUT.items()
    ]
    layouts += [
        (key, kind, variant, "model", False, True, decoupled)
        for key, (kind, variant, decoupled) in STOCK_LAYOUT.items()
    ]
    for key, kind, variant, mode, output_ids, stock, decoupled in layouts:
        prefix = f"{key}_"
        variables: dict[str, object] = {
            "tokenizer_dir": model_dirs[kind],
            "engine_mode": mode,
            "name_prefix": prefix,
            "ensemble_output_ids": output_ids,
            "decoupled": decoupled,
        }
        if stock:
            variables.update(STOCK_VARIABLES)
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
            stock=stock,
            decoupled=decoupled,
        )
    server = TritonServer(repositories, work_dir=root / "server")
    server.start()
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
        yield TritonStack(server=server, models=models)
    finally:
        server.stop()


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
