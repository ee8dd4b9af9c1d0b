"""vLLM's request shapes for loading and unloading LoRA adapters."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(description="The model name the adapter is served as.")
    lora_path: str = Field(
        description="The adapter directory, inside one of the gateway's lora_dynamic_roots."
    )
    # An extension: the served model it adapts, where several are served.
    base_model: str | None = None
    load_inplace: bool = Field(
        default=False, description="Replace an adapter already loaded under this name."
    )


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    # vLLM's field; adapters are known here by name only.
    lora_int_id: int | None = None
