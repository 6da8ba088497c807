"""The gateway's HTTP routes: one module per provider of ``contracts.PROVIDERS``, named after it, plus ``admin``.

A provider's module, ``gateway.routes.<provider.name>``, is the gateway side of that provider: an ``APIRouter``
(``router``) with the routes of its APIs (parse -> ``Turn`` -> render; the shared steps are in ``calls``), and its
error body (``error_body``), used for every error on its paths (``contracts.provider_for_path``) and in its streams.
Handlers keep no state of their own; it is on ``app.state`` (``gateway``, ``registry``, ``settings``, ``metrics``).
"""

from __future__ import annotations

import importlib
import typing
from typing import Any, cast

from fastapi import APIRouter

from contracts import Provider
from gateway.errors import GatewayError

__all__ = ["ProviderRoutes", "provider_routes"]


class ProviderRoutes(typing.Protocol):
    """What a provider's routes module holds."""

    router: APIRouter

    def error_body(self, err: GatewayError) -> dict[str, Any]: ...


def provider_routes(provider: Provider) -> ProviderRoutes:
    """The routes module of ``provider``, found by its name, so that adding a provider adds no line here
    (``tests/test_providers.py`` checks that every provider has one)."""
    return cast(ProviderRoutes, importlib.import_module(f"{__name__}.{provider.name}"))
