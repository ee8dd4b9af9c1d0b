"""The llmapi CPU stand-in's own code (model_repo_templates/llmapi), driven without Triton: a small
fake of the Python backend's utilities records what it sends. Stop strings are matched on token ids
as the LLM API matches them (and arrive as bytes); streamed responses carry the cumulative text with
"None" reasons until the end; errors raised before a request is registered are answered by 1.2.x's
model.py and by the current one not at all."""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar

import numpy as np
import pytest

from deploy import model_repo, tiny_model

MODEL_PY = model_repo.TEMPLATES_DIR / "llmapi" / "tensorrt_llm" / "1" / "model.py"
FINAL = 1


@dataclass
class _Tensor:
    name: str
    array: np.ndarray

    def as_numpy(self) -> np.ndarray:
        return self.array


@dataclass
class _Error:
    message: str
    code: int = 0
    CANCELLED = 7

    def __str__(self) -> str:
        return self.message


@dataclass
class _Response:
    output_tensors: list[_Tensor] = field(default_factory=list)
    error: _Error | None = None

    def outputs(self) -> dict[str, str]:
        out = {}
        for t in self.output_tensors:
            item = t.array.reshape(-1)[0]
            out[t.name] = item.decode() if isinstance(item, bytes) else str(item)
        return out


class _Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[_Response, int]] = []

    def send(self, response: _Response, flags: int = 0) -> None:
        self.sent.append((response, flags))


class _Request:
    def __init__(self, inputs: dict[str, np.ndarray], request_id: str = "") -> None:
        self.inputs = inputs
        self.sender = _Sender()
        self._id = request_id

    def get_response_sender(self) -> _Sender:
        return self.sender

    def request_id(self) -> str:
        return self._id

    def is_cancelled(self) -> bool:
        return False


class _Logger:
    errors: ClassVar[list[str]] = []

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.errors.append(message)

    @staticmethod
    def log_info(message: str) -> None:
        return None

    log_warn = log_info


class _Metric:
    def set(self, value: float) -> None:
        return None

    def increment(self, value: float) -> None:
        return None


def _fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _Tensor  # type: ignore[attr-defined]
    pb.TritonError = _Error  # type: ignore[attr-defined]
    pb.InferenceResponse = _Response  # type: ignore[attr-defined]
    pb.Logger = _Logger  # type: ignore[attr-defined]
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL  # type: ignore[attr-defined]

    def get_input_tensor_by_name(request: _Request, name: str) -> _Tensor | None:
        value = request.inputs.get(name)
        return None if value is None else _Tensor(name, value)

    pb.get_input_tensor_by_name = get_input_tensor_by_name  # type: ignore[attr-defined]
    return pb


@cache
def _stand_in() -> Any:
    """model.py loaded as Triton loads it: `engine` (the CPU reference engine, copied beside it when
    rendered) and the backend's utilities importable by name."""
    names = {"engine": model_repo.load_reference_engine(), "triton_python_backend_utils": _fake_pb_utils()}
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(names)
    try:
        spec = importlib.util.spec_from_file_location("llmapi_stand_in_model", MODEL_PY)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module


@cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.build_tiny_model("bpe"))


class _Engine:
    def __init__(self) -> None:
        self.groups: list[Any] = []

    def submit(self, group: Any) -> None:
        self.groups.append(group)

    def stop_request(self, request_id: str) -> None:
        return None


class _LoraCache:
    def __contains__(self, task_id: object) -> bool:
        return False


def _model(profile: str = "current", *, decoupled: bool = True, max_positions: int = 512) -> Any:
    """A TritonPythonModel as initialize() leaves it, with a recording engine in place of the
    reference engine."""
    module = _stand_in()
    model = object.__new__(module.TritonPythonModel)
    model.decoupled = decoupled
    model.profile = profile
    model.tokenizer = _tokenizer()
    model.max_positions = max_positions
    model.lora_cache = _LoraCache()
    # A text model (no `triton_config.multimodal`): initialize() loads no processor.
    model.processor = None
    model.engine = _Engine()
    model.lock = threading.Lock()
    model.requests = {}
    model.by_user_id = {}
    model.next_id = 0
    model._active = model._cancelled = model._completed = _Metric()
    return model


def _strings(*values: str | bytes) -> np.ndarray:
    return np.array([v if isinstance(v, bytes) else v.encode() for v in values], dtype=object)


def _inputs(prompt: str = "Once upon a time", **extra: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "text_input": _strings(prompt),
        "sampling_param_temperature": np.array([0.0], dtype=np.float32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
        "return_finish_reason": np.array([True]),
        "return_stop_reason": np.array([True]),
        **extra,
    }


def _ids(text: str) -> list[int]:
    return list(_tokenizer().encode(text, add_special_tokens=False))


def test_stop_strings_arrive_as_bytes_or_str_and_are_tokenized_alone() -> None:
    module = _stand_in()
    tok = _tokenizer()
    as_bytes = module.stop_words(np.array([b" the", b"", "é".encode()], dtype=object), tok)
    as_str = module.stop_words(np.array([" the", "", "é"], dtype=object), tok)
    assert as_bytes == as_str == [(" the", tuple(_ids(" the"))), ("é", tuple(_ids("é")))]
    assert module.stop_words(None, tok) == []


def test_a_stop_string_matches_its_own_tokens_not_the_same_text_made_of_other_tokens() -> None:
    module = _stand_in()
    stops = module.stop_words(_strings(" weather", " the"), _tokenizer())
    head = _ids("Once upon a time")
    assert module.match_stop([*head, *_ids(" the")], stops) == (" the", head)
    # " the" spelled as four single-character tokens: the text ends with the stop string, its ids
    # do not end with the stop string's ids.
    spelled = [t for c in " the" for t in _ids(c)]
    assert len(spelled) == 4 and _tokenizer().decode([*head, *spelled]).endswith(" the")
    assert module.match_stop([*head, *spelled], stops) is None
    # Only the end of the generated ids counts.
    assert module.match_stop([*_ids(" the"), *head], stops) is None


def _run(model: Any, state_inputs: dict[str, np.ndarray], generated: list[int]) -> list[tuple[dict, int]]:
    """Send one request through execute(), then the engine's responses (one token a step, the
    last step final), and return what the model sent: (outputs, flags) per response."""
    request = _Request(state_inputs)
    model.execute([request])
    (group,) = model.engine.groups
    sink = group.sink
    for pos, token in enumerate(generated):
        last = pos == len(generated) - 1
        sink.send({"output_ids": np.array([[token]], dtype=np.int32)}, final=last)
    return [(r.outputs(), flags) for r, flags in request.sender.sent]


def test_a_stop_string_sent_as_bytes_cuts_the_streamed_output_with_none_reasons_until_the_end() -> None:
    model = _model()
    head = _ids("Once upon a time")
    stop = _ids(" the")
    inputs = _inputs(
        "Hello",
        streaming=np.array([True]),
        sampling_param_max_tokens=np.array([32], dtype=np.int32),
        sampling_param_stop=_strings(b" the"),
    )
    sent = _run(model, inputs, [*head, *stop])
    # The engine is asked to stop at the stop string's ids.
    assert model.engine.groups[0].params[0].stop_words == (tuple(stop),)
    tok = _tokenizer()
    *steps, (last, flags) = sent
    assert [s for s, _ in steps] == [
        {"text_output": tok.decode(head[: i + 1]), "finish_reason": "None", "stop_reason": "None"}
        for i in range(len(head))
    ]
    assert all(f == 0 for _, f in steps)
    assert flags == FINAL
    assert last == {"text_output": tok.decode(head), "finish_reason": "stop", "stop_reason": " the"}


def test_the_same_text_generated_as_other_tokens_does_not_stop() -> None:
    model = _model()
    head = _ids("Once upon a time")
    spelled = [t for c in " the" for t in _ids(c)]
    generated = [*head, *spelled]
    inputs = _inputs(
        "Hello",
        sampling_param_max_tokens=np.array([len(generated)], dtype=np.int32),
        sampling_param_stop=_strings(" the"),
        sampling_param_exclude_input_from_output=np.array([True]),
    )
    ((last, flags),) = _run(model, inputs, generated)
    assert flags == FINAL
    assert last == {
        "text_output": _tokenizer().decode(generated),
        "finish_reason": "length",
        "stop_reason": "None",
    }


@pytest.mark.parametrize(
    ("case", "extra", "message"),
    [
        ("streaming, not decoupled", {"streaming": np.array([True])}, "only supported in decoupled mode"),
        ("best_of, greedy", {"sampling_param_best_of": np.array([2], dtype=np.int32)}, "best_of (2) > 1"),
        (
            "a bad LoRA",
            {
                "lora_id": np.array([9], dtype=np.uint64),
                "lora_name": _strings("missing"),
                "lora_path": _strings("/nonexistent/adapter"),
            },
            "cannot load the LoRA adapter",
        ),
        ("too long", {"sampling_param_max_tokens": np.array([600], dtype=np.int32)}, "should not exceed"),
    ],
)
@pytest.mark.parametrize("profile", ["current", "v1.2"])
def test_errors_before_registration_are_answered_by_1_2_and_by_the_current_model_py_never(
    case: str, extra: dict[str, np.ndarray], message: str, profile: str
) -> None:
    model = _model(profile, decoupled=False)
    request = _Request(_inputs(**extra))
    logged = len(_Logger.errors)
    model.execute([request])
    assert model.engine.groups == [] and model.requests == {}
    # Logged in Triton either way, with the model's prefix.
    assert len(_Logger.errors) == logged + 1 and message in _Logger.errors[-1]
    assert _Logger.errors[-1].startswith("[trtllm] Error generating request: ")
    if profile == "current":
        assert request.sender.sent == []
        return
    ((response, flags),) = request.sender.sent
    assert flags == FINAL and response.error is not None
    assert str(response.error).startswith("Error generating request: ") and message in str(response.error)
