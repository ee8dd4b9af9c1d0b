"""Health, readiness and metrics endpoints (outside any API, open to probes)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.core.readiness import Readiness
from gateway.http.services import service
from gateway.metrics import GatewayMetrics
from gateway.modelserver import ModelServerCollector

router = APIRouter()


# HEAD too: probes and uptime checkers often send it.
@router.api_route("/health", methods=["GET", "HEAD"], include_in_schema=False)
async def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.api_route("/health/ready", methods=["GET", "HEAD"], include_in_schema=False)
async def ready(request: Request) -> JSONResponse:
    readiness = service(request, Readiness)
    models = await readiness.check()
    ok = bool(models) and all(models.values())
    body: dict[str, object] = {"status": "ready" if ok else "unavailable", "models": models}
    if readiness.reasons:
        body["reasons"] = readiness.reasons
    return JSONResponse(body, status_code=200 if ok else 503)


@router.api_route("/metrics", methods=["GET", "HEAD"], include_in_schema=False)
async def metrics(request: Request) -> Response:
    # Triton's gauges for the model-server metrics: read here (cached), as collecting is synchronous.
    await service(request, ModelServerCollector).refresh()
    return Response(service(request, GatewayMetrics).exposition(), media_type=CONTENT_TYPE_LATEST)
