"""Typed access to the app's services: a route asks for a service by its class and gets that type
back, so mypy and a reader can follow a route into its service (no untyped `app.state.x`)."""

from __future__ import annotations

from typing import TypeVar, cast

from starlette.requests import HTTPConnection

T = TypeVar("T")


class Services:
    """One instance per class, registered at start-up."""

    __slots__ = ("_by_class",)

    def __init__(self) -> None:
        self._by_class: dict[type, object] = {}

    def add(self, service: object) -> None:
        self._by_class[type(service)] = service

    def get(self, kind: type[T]) -> T:
        try:
            return cast(T, self._by_class[kind])
        except KeyError:
            raise LookupError(f"no {kind.__name__} registered with the app") from None


def service(request: HTTPConnection, kind: type[T]) -> T:
    """The app's `kind` service (the app keeps its Services at `app.state.services`)."""
    services: Services = request.app.state.services
    return services.get(kind)
