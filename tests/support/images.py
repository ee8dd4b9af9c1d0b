"""Small test images and transformers' own answer for them (the reference the stack must equal)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any


def image_bytes(kind: str, size: tuple[int, int], seed: int) -> bytes:
    """A deterministic picture with some structure (gradients and noise), PNG or JPEG encoded."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = size
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    base = np.concatenate([x + 0 * y, y + 0 * x, (x + y) / 2], axis=2)
    pixels = np.clip(base * rng.uniform(0.2, 1.0, 3) + rng.normal(0, 40, (height, width, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype("uint8"), "RGB").save(out, format=kind.upper())
    return out.getvalue()


def data_uri(data: bytes) -> str:
    kind = "png" if data.startswith(b"\x89PNG") else "jpeg"
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def reference_greedy(
    model_dir: Path, messages: list[dict[str, Any]], images: list[bytes], max_new_tokens: int
) -> tuple[str, int]:
    """transformers' greedy text for chat ``messages`` whose ``{"type": "image"}`` parts take
    ``images`` in order, and the processor's prompt token count: its processor and ``generate``."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()
    pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt, images=pictures or None, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    prompt_len = int(inputs["input_ids"].shape[1])
    return processor.decode(out[0][prompt_len:], skip_special_tokens=True), prompt_len
