"""The agent variant of the tiny vision-language model, loaded by transformers itself: its sampled
replies end on their own (what agent clients such as Claude Code need: they sample at temperature
1 and fail a reply cut at their output limit), while the image still counts. (The default model,
whose greedy answers the image tests compare for two pictures, is built as before.)"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from deploy.families import FAMILIES
from tests.support.images import image_bytes

QUESTION = {"type": "text", "text": "What is in this picture?"}
MESSAGES = [{"role": "user", "content": [{"type": "image"}, QUESTION]}]


@pytest.fixture(scope="module")
def tiny_gemma3_agent_vlm_dir() -> Path:
    from deploy.tiny_vlm import build_vlm_model

    return build_vlm_model("gemma3-agent")


@pytest.fixture(scope="module")
def agent(tiny_gemma3_agent_vlm_dir: Path) -> tuple[Any, Any, list[int]]:
    return _load(tiny_gemma3_agent_vlm_dir)


def _load(model_dir: Path) -> tuple[Any, Any, list[int]]:
    """transformers' processor and model for the directory, and the family's end-token ids."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()
    ends = [processor.tokenizer.convert_tokens_to_ids(t) for t in FAMILIES["gemma3"].end_tokens]
    return processor, model, ends


def _inputs(processor: Any, kind: str, seed: int) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(image_bytes(kind, (64, 48), seed)))
    prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return processor(text=prompt, images=[image], return_tensors="pt", add_special_tokens=False)


def _end_probabilities(model: Any, inputs: Any, ends: list[int]) -> list[float]:
    """The end tokens' probability at temperature 1 after the prompt and at each of 300 random
    tokens after it (a reply's worth of positions, teacher-forced)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    prompt = inputs["input_ids"]
    ids = torch.cat([prompt, torch.randint(3, 262_000, (1, 300), generator=generator)], dim=1)
    with torch.inference_mode():
        mask = torch.ones_like(ids)
        logits = model(input_ids=ids, pixel_values=inputs["pixel_values"], attention_mask=mask).logits
    probabilities = torch.softmax(logits[0, prompt.shape[1] - 1 :], dim=-1)[:, ends].sum(dim=-1)
    return [float(p) for p in probabilities]


def test_agent_variant_end_probability_is_a_few_percent_a_step(agent: tuple[Any, Any, list[int]]) -> None:
    processor, model, ends = agent
    probabilities = _end_probabilities(model, _inputs(processor, "png", 3), ends)
    # None right after the prompt (no empty reply), then a few percent at every step.
    assert probabilities[0] < 1e-3, probabilities[0]
    later = sorted(probabilities[1:])
    assert 0.01 <= later[len(later) // 2] <= 0.05, later[len(later) // 2]
    assert later[0] >= 0.002, later[0]


def test_agent_variant_answer_depends_on_the_image(agent: tuple[Any, Any, list[int]]) -> None:
    import torch

    processor, model, _ = agent
    with torch.inference_mode():
        first = model(**_inputs(processor, "png", 3)).logits[0, -1]
        second = model(**_inputs(processor, "jpeg", 2)).logits[0, -1]
    assert float((first - second).abs().max()) > 0.05


def test_build_command_builds_the_agent_variant(
    tiny_gemma3_agent_vlm_dir: Path, tiny_gemma3_vlm_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deploy.tiny_vlm import main

    assert main(["build", "gemma3-agent"]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_gemma3_agent_vlm_dir)
    # Its own directory in the cache, beside the default model's.
    assert re.fullmatch(r"vlm-gemma3-agent-[0-9a-f]{16}", tiny_gemma3_agent_vlm_dir.name), (
        tiny_gemma3_agent_vlm_dir
    )
    assert tiny_gemma3_agent_vlm_dir.parent == tiny_gemma3_vlm_dir.parent
