"""What an API registers with the app: its router and, for a generation API, its service class."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter

from gateway.core.generation import GenerationService
from gateway.http.middleware import ErrorShape
from gateway.ratelimit import HeaderFormat


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    router: APIRouter
    # Built once at start-up over the served models, limits and metrics; routes get it with
    # `gateway.http.services.service(request, ServiceClass)`.
    service: type[GenerationService] | None = None
    # An API with its own error body (not OpenAI's) claims the paths under this prefix, so that
    # errors outside its routes (middleware refusals, unknown methods) leave in its shape too.
    error_prefix: str | None = None
    error_shape: ErrorShape | None = None
    # Its own rate-limit headers on the same paths (Anthropic's `anthropic-ratelimit-*`); OpenAI's
    # `x-ratelimit-*` elsewhere.
    rate_limit_headers: HeaderFormat | None = None
