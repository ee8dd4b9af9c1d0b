"""/v1/models wire models."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # vLLM's fields: a LoRA adapter's base model (`parent`) and what it is built on (`root`).
    root: str | None = None
    parent: str | None = None
    # What a request may carry: ["text"], or ["text", "image"] for a model that takes images
    # (OpenRouter's and Hugging Face's name for it; OpenAI's model object has none).
    input_modalities: list[str] = ["text"]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
