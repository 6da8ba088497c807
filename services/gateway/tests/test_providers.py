"""One description per provider API (``contracts.PROVIDERS``), and the gateway serves exactly what it describes.

Forgetting any piece of a provider API fails here: its ``Protocol`` member without a description, a description
without a protocol module (``gateway.protocols.<value>``), a routes module (``gateway.routes.<name>``) that is missing,
unmounted, or has no error body for some error, or a path pattern that no mounted route has or that resolves to
another provider.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from fnmatch import fnmatchcase

import pytest
from fastapi.routing import APIRoute
from hypothesis import given
from hypothesis import strategies as st

import gateway.errors
import gateway.protocols
from contracts import PROVIDERS, Protocol, Provider, provider_for_path
from gateway import GatewaySettings, create_app
from gateway.routes import admin, provider_routes

from ._fakes import MemorySink

SERVED = set(Protocol) - {Protocol.ENGINE}  # the engine's own token-in API: no gateway route serves it


def routes(router) -> set[tuple[str, str]]:
    return {(r.path, m.lower()) for r in router.routes if isinstance(r, APIRoute) for m in r.methods}


def mounted(app) -> set[tuple[str, str]]:
    # What the app serves, as its OpenAPI document lists it (the same document schemathesis fuzzes).
    return {(path, method) for path, ops in app.openapi()["paths"].items() for method in ops}


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "m", path)


@pytest.fixture(scope="module")
def app():
    return create_app(GatewaySettings(engine_urls=["http://127.0.0.1:9"]), sink=MemorySink())


def test_every_served_protocol_has_exactly_one_provider() -> None:
    owned = [protocol for provider in PROVIDERS for protocol in provider.protocols]
    assert sorted(owned) == sorted(SERVED)
    assert len({p.name for p in PROVIDERS}) == len(PROVIDERS)
    assert all(p.name.isidentifier() for p in PROVIDERS)  # a module name and a template variable


@pytest.mark.parametrize("protocol", sorted(SERVED))
def test_protocol_module_is_used_by_its_providers_routes(protocol: Protocol) -> None:
    (provider,) = [p for p in PROVIDERS if protocol in p.protocols]
    module = importlib.import_module(f"gateway.protocols.{protocol.value}")
    assert module.PROTOCOL is protocol
    assert module in vars(provider_routes(provider)).values(), f"gateway.routes.{provider.name} never serves it"


def test_every_protocol_module_is_described() -> None:
    for info in pkgutil.iter_modules(gateway.protocols.__path__):
        module = importlib.import_module(f"gateway.protocols.{info.name}")
        if hasattr(module, "PROTOCOL"):
            assert module.PROTOCOL in SERVED and info.name == module.PROTOCOL.value


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_routes_are_mounted_and_their_paths_resolve_back(app, provider: Provider) -> None:
    mine = routes(provider_routes(provider).router)
    assert mine and mine <= mounted(app), f"gateway.routes.{provider.name} is not mounted"
    for path, _ in mine:
        assert provider_for_path(concrete(path)) is provider, path
    for pattern in provider.paths:
        assert provider_for_path(pattern.replace("*", "x")) is provider, pattern
        assert any(fnmatchcase(concrete(path), pattern) for path, _ in mine), f"no route for {pattern}"


def test_no_route_outside_the_provider_and_admin_routers(app) -> None:
    owned = routes(admin.router).union(*(routes(provider_routes(p).router) for p in PROVIDERS))
    assert mounted(app) == owned
    for path, _ in routes(admin.router):
        assert provider_for_path(path) is PROVIDERS[0]  # ops and admin errors are OpenAI-shaped


def one_of_each_error() -> list[gateway.errors.GatewayError]:
    errors: list[gateway.errors.GatewayError] = []
    for name in gateway.errors.__all__:
        cls = getattr(gateway.errors, name)
        if isinstance(cls, type) and issubclass(cls, gateway.errors.GatewayError):
            errors.append(cls(1000, 10) if cls is gateway.errors.ContextOverflow else cls("boom"))
    return errors


@pytest.mark.parametrize("provider", PROVIDERS, ids=lambda p: p.name)
def test_error_body_renders_every_error(provider: Provider) -> None:
    error_body = provider_routes(provider).error_body
    for err in one_of_each_error():
        body = error_body(err)
        assert isinstance(body, dict) and body, (provider.name, type(err).__name__)
        json.dumps(body)


def _old_ladder(path: str) -> str:
    # The if-ladder PROVIDERS replaced (auth.provider_for_path): kept here as the oracle of error shapes by path.
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1beta") or (path.startswith("/v1/models/") and ":" in path):
        return "google"
    return "openai"


PIECES = [
    "/v1",
    "/v1beta",
    "/models",
    "/messages",
    "/count_tokens",
    "/chat/completions",
    "/responses",
    "/",
    ":",
    "g",
    "x",
]


@given(st.lists(st.sampled_from(PIECES), max_size=6))
def test_path_resolution_matches_the_old_rule(pieces: list[str]) -> None:
    path = "".join(pieces) or "/"
    assert provider_for_path(path).name == _old_ladder(path)


def test_every_provider_call_runs_in_the_front_doors_fast_lane() -> None:
    """The fast lane (``gateway.front``) is derived from the provider routers; a call route it skipped would silently
    run through FastAPI's whole stack again (slower, and no test of the lane would notice)."""
    from gateway.front import _calls

    posted = {
        (r.path_regex.pattern, r.endpoint)
        for p in PROVIDERS
        for r in provider_routes(p).router.routes
        if isinstance(r, APIRoute) and "POST" in r.methods
    }
    lane = {(c.regex.pattern, c.endpoint) for c in _calls()}
    assert posted and lane == posted
