"""The CPU engine's prompt table: a vision-language model's image features in place of the prompt's
placeholder ids give exactly transformers' greedy tokens for the same images."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy import model_repo
from tests.support.images import image_bytes

engine = model_repo.load_reference_engine()
DECLARED = frozenset({"output_ids", "sequence_length"})
MESSAGES = [
    {
        "role": "user",
        "content": [
            {"type": "image"},
            {"type": "text", "text": "Compare"},
            {"type": "image"},
            {"type": "text", "text": "with the first."},
        ],
    }
]


class _Collect:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.done = threading.Event()
        self.error: str | None = None

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        if tensors is not None:
            self.tokens.extend(int(t) for t in tensors["output_ids"].reshape(-1))
        if error is not None:
            self.error = error
        if final:
            self.done.set()


@pytest.fixture(scope="module")
def reference(tiny_gemma3_vlm_dir: Path) -> dict[str, Any]:
    """transformers' processor, vision tower and generate: the prompt with the placeholder ids the
    C++ path's preprocessing writes (vocabulary size + k), the features and the greedy tokens."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(tiny_gemma3_vlm_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_gemma3_vlm_dir)).eval()
    images = [Image.open(io.BytesIO(image_bytes(k, (40, 28), s))) for k, s in (("png", 1), ("jpeg", 2))]
    prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt, images=images, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=10, do_sample=False)
        features = model.model.get_image_features(inputs["pixel_values"]).pooler_output
    ids = inputs["input_ids"][0].tolist()
    vocab = model.config.text_config.vocab_size
    image_token = model.config.image_token_id
    fake = iter(range(vocab, vocab + 10_000))
    return {
        "prompt": [next(fake) if t == image_token else t for t in ids],
        "table": features.reshape(-1, features.shape[-1]).numpy(),
        "tokens": out[0][len(ids) :].tolist(),
    }


def _run(runner: Any, prompt: list[int], table: np.ndarray | None) -> _Collect:
    eng = engine.Engine(runner=runner, kv_cache=None)
    eng.start()
    try:
        sink = _Collect()
        eng.submit(
            engine.RequestGroup(
                prompts=[prompt],
                params=[engine.SamplingParams(max_new_tokens=10, temperature=0.0, end_id=-1)],
                options=engine.OutputOptions(streaming=True, exclude_input=True),
                sink=sink,
                declared_outputs=DECLARED,
                prompt_table=table,
            )
        )
        assert sink.done.wait(60)
        return sink
    finally:
        eng.shutdown()


def test_prompt_table_gives_transformers_greedy_tokens(
    tiny_gemma3_vlm_dir: Path, reference: dict[str, Any]
) -> None:
    runner = engine.TransformersRunner(str(tiny_gemma3_vlm_dir), 1)
    sink = _run(runner, reference["prompt"], reference["table"])
    assert sink.error is None
    assert sink.tokens == reference["tokens"]
    # The features matter: other images' features give another answer.
    other = _run(runner, reference["prompt"], reference["table"][::-1].copy())
    assert other.tokens != reference["tokens"]


def test_placeholder_ids_without_a_table_are_out_of_the_vocabulary(
    tiny_gemma3_vlm_dir: Path, reference: dict[str, Any]
) -> None:
    runner = engine.TransformersRunner(str(tiny_gemma3_vlm_dir), 1)
    eng = engine.Engine(runner=runner, kv_cache=None)
    with pytest.raises(engine.EngineError, match="out of the vocabulary"):
        eng.submit(
            engine.RequestGroup(
                prompts=[reference["prompt"]],
                params=[engine.SamplingParams(max_new_tokens=4, temperature=0.0)],
                options=engine.OutputOptions(streaming=True, exclude_input=True),
                sink=_Collect(),
                declared_outputs=DECLARED,
            )
        )
