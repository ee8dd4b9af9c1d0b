"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's shapes and answers)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from gateway.apis.lora_adapters.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.config import Settings
from gateway.core.lora import Adapters
from gateway.errors import AuthenticationError, NotFoundError
from gateway.http.services import service

router = APIRouter(responses=ERROR_RESPONSES)


def _admin(request: Request) -> Settings:
    """The settings, once the request is known to come from an admin while dynamic loading is on."""
    settings = service(request, Settings)
    if not settings.lora_dynamic_roots or not settings.admin_api_keys:
        raise NotFoundError(
            f"Unknown request URL: POST {request.url.path}: loading LoRA adapters at run time is off "
            "(set lora_dynamic_roots and admin_api_keys)."
        )
    header = request.headers.get("authorization", "")
    given = header[7:].strip() if header[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    ok = False
    for key in settings.admin_api_keys:
        ok |= hmac.compare_digest(given.encode(), key.encode())
    if not ok:
        raise AuthenticationError("Loading and unloading LoRA adapters needs an admin API key.")
    return settings


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> str:
    settings = _admin(request)
    await service(request, Adapters).load(
        body.lora_name, body.lora_path, body.base_model, settings.lora_dynamic_roots, body.load_inplace
    )
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> str:
    _admin(request)
    service(request, Adapters).unload(body.lora_name)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
