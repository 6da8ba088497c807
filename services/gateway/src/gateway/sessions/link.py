"""The runner's view of this node's model-API proxy: ``gateway.registry.SessionRegistry`` behind ``SessionGateway``.

The registry is in-process (tokens live in the proxy's memory), so the runner and the proxy share one process
per node and one registry object: ``RegistryGateway(app.state.registry, "http://127.0.0.1:8000")``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from contracts import SessionRequested
from gateway.registry import SessionRegistry
from gateway.sessions.runner import SessionStats

__all__ = ["RegistryGateway"]


class RegistryGateway:
    def __init__(self, registry: SessionRegistry, url: str, *, ttl_margin_s: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"gateway url must be http://host:port, got {url!r}")
        self.registry = registry
        self._address = (parts.hostname, parts.port)
        self._ttl_margin_s = ttl_margin_s

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    def open(self, request: SessionRequested) -> str:
        creds = self.registry.create(
            request.session_id,
            request.group_id,
            request.tokenization,
            request.sampling,
            request.model,
            ttl_s=request.session_timeout_s + self._ttl_margin_s,
        )
        return creds.token

    def stats(self, session_id: str) -> SessionStats:
        stats = self.registry.stats(session_id)
        ok, failed = stats.get("calls_ok", 0), stats.get("calls_failed", 0)
        return SessionStats(calls=ok + failed, turns=ok, failed=failed)

    def close(self, session_id: str) -> None:
        self.registry.close(session_id)
