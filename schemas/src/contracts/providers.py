"""The provider APIs floe's gateway speaks, described once: the ``Protocol`` enum and one ``Provider`` per vendor.

A ``Provider`` is a vendor's family of wire APIs that share an error shape, credentials and the way a harness is
pointed at them (OpenAI: Chat Completions and Responses; Anthropic: Messages; Google: Gemini). It is data only, read
by both sides of a gateway node, which never import each other:

- the gateway (``services/gateway``): which error shape a request path speaks (``provider_for_path``), where the
  API key may come from (``key_header``, ``key_query``), the base URLs and env vars of session credentials, and the
  routes module serving it (``gateway.routes.<name>``, which also holds its error body);
- the session runner (``services/sessions``): the ``${<name>_base_url}`` template variables of harness presets.

``Protocol.ENGINE`` (the engine's own token-in API) is recorded on calls made straight to an engine; no gateway
route serves it, so no ``Provider`` lists it.

Invariants (checked by ``services/gateway/tests/test_providers.py``): every other ``Protocol`` member belongs to
exactly one provider, has a protocol module ``gateway.protocols.<value>`` and is served by the provider's mounted
routes module; every path pattern is matched by a mounted route and resolves back to its provider.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["PROVIDERS", "Protocol", "Provider", "provider_for_path"]


class Protocol(enum.StrEnum):
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    ANTHROPIC_MESSAGES = "anthropic_messages"
    GOOGLE_GENERATE = "google_generate"
    ENGINE = "engine"  # the engine's own token-in API (tests, minimal agents)


@dataclass(frozen=True)
class Provider:
    """One vendor's API family, as the gateway serves it and as harnesses are pointed at it."""

    name: str  # key of the credentials' base_urls; routes module gateway.routes.<name>; preset ${<name>_base_url}
    protocols: tuple[Protocol, ...]
    # fnmatch patterns (``*`` spans ``/``) of the request paths that answer in this provider's error shape, before
    # routing too (413s, unknown routes); a path matching none is OpenAI's, like every non-provider route.
    paths: tuple[str, ...]
    base_path: str  # what the vendor's SDK appends to the gateway URL: OpenAI's clients expect ".../v1"
    key_header: str  # the vendor's API-key header; "authorization" means "Bearer <key>"
    key_env: tuple[str, ...]  # env vars the vendor's SDKs and CLIs read the API key, base URL and model from
    base_url_env: tuple[str, ...]
    model_env: tuple[str, ...]
    key_query: str | None = None  # query parameter carrying the key (Gemini's ?key=)

    @property
    def template_var(self) -> str:
        """The harness-preset variable holding this provider's base URL inside the sandbox."""
        return f"{self.name}_base_url"

    def base_url(self, gateway_url: str) -> str:
        return gateway_url.rstrip("/") + self.base_path


PROVIDERS: tuple[Provider, ...] = (
    Provider(
        name="openai",
        protocols=(Protocol.OPENAI_CHAT, Protocol.OPENAI_RESPONSES),
        paths=("/v1/chat/completions*", "/v1/responses*", "/v1/models"),
        base_path="/v1",
        key_header="authorization",
        key_env=("OPENAI_API_KEY",),
        base_url_env=("OPENAI_BASE_URL",),
        model_env=("OPENAI_MODEL",),
    ),
    Provider(
        name="anthropic",
        protocols=(Protocol.ANTHROPIC_MESSAGES,),
        paths=("/v1/messages*",),
        base_path="",
        key_header="x-api-key",
        key_env=("ANTHROPIC_API_KEY",),
        base_url_env=("ANTHROPIC_BASE_URL",),
        model_env=("ANTHROPIC_MODEL",),
    ),
    Provider(
        name="google",
        protocols=(Protocol.GOOGLE_GENERATE,),
        # Gemini's methods are "models/{model}:method"; without a ":" a /v1/models path is OpenAI's model list.
        paths=("/v1beta*", "/v1/models/*:*"),
        base_path="",
        key_header="x-goog-api-key",
        key_query="key",
        key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        base_url_env=("GOOGLE_GEMINI_BASE_URL",),
        model_env=("GEMINI_MODEL",),
    ),
)


def provider_for_path(path: str) -> Provider:
    """The provider whose error shape ``path`` speaks (OpenAI's for a path no provider claims)."""
    for provider in PROVIDERS:
        if any(fnmatchcase(path, pattern) for pattern in provider.paths):
            return provider
    return PROVIDERS[0]
