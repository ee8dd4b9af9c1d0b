"""Routes get their services by class, typed (gateway.http.services)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from starlette.requests import Request

from gateway.http.services import Services, service


class _Chat:
    pass


class _Other:
    pass


def test_a_route_gets_the_service_registered_under_its_class() -> None:
    app = FastAPI()
    services = Services()
    chat = _Chat()
    services.add(chat)
    app.state.services = services
    request = Request({"type": "http", "app": app, "headers": []})
    assert service(request, _Chat) is chat
    with pytest.raises(LookupError, match="_Other"):
        service(request, _Other)
