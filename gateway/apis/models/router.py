"""GET /v1/models and /v1/models/{model}: the served models."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.apis.models.protocol import Model, ModelList
from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.core.models import ModelRegistry, ModelRuntime
from gateway.errors import NotFoundError
from gateway.http.services import service

router = APIRouter(responses=ERROR_RESPONSES)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    registry = service(request, ModelRegistry)
    return ModelList(data=[_model(m) for m in [*registry, *registry.adapters]])


def _model(runtime: ModelRuntime) -> Model:
    return Model(
        id=runtime.name,
        created=runtime.created,
        owned_by="triton",
        root=runtime.parent or runtime.name,
        parent=runtime.parent,
        input_modalities=list(runtime.input_modalities),
    )


# HEAD as for GET (probes), kept out of the OpenAPI document, which describes OpenAI's API.
router.add_api_route("/v1/models", list_models, methods=["HEAD"], include_in_schema=False)


@router.get("/v1/models/{model:path}", response_model=Model)
async def retrieve_model(model: str, request: Request) -> Model:
    if not model:
        raise NotFoundError(
            "Unknown request URL: GET /v1/models/ names no model. "
            "List models with GET /v1/models, or retrieve one with GET /v1/models/{model}."
        )
    return _model(service(request, ModelRegistry).get(model))
