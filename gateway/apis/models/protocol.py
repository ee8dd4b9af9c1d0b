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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
