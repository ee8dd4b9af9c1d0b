"""Admission is derived from the routes: every JsonBodyRoute (the generation routes) is admitted,
other routes are not, with no list of paths to keep up to date."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel

from gateway.apis import APIS
from gateway.http.routing import JsonBodyRoute, generation_paths


class _Body(BaseModel):
    x: int


def test_a_new_generation_route_is_admitted_without_naming_its_path() -> None:
    app = FastAPI()
    generation = APIRouter(route_class=JsonBodyRoute)

    @generation.post("/v1/new/things")
    async def create_thing(body: _Body, request: Request) -> _Body:
        return body

    other = APIRouter()

    @other.get("/v1/new/things")
    async def list_things() -> list[int]:
        return []

    app.include_router(generation)
    app.include_router(other)
    assert generation_paths(app.routes) == {"/v1/new/things"}


def test_the_registered_apis_generation_routes_are_the_admitted_paths() -> None:
    app = FastAPI()
    for api in APIS:
        app.include_router(api.router)
    # count_tokens and input_tokens take their JSON body the same way (and tokenizing an agent's
    # prompt is work worth bounding); the stored responses' GET/DELETE routes are not admitted.
    # The encoder APIs' work is bounded as generation's is (with vLLM's and Cohere's aliases).
    assert generation_paths(app.routes) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/score",
        "/score",
    }
