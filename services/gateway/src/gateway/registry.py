"""In-process session registry: who may call, under which session, with which policy.

Used by ``POST /admin/sessions`` (control-token protected) and in process by the session runner
(``sessions.gateway_node``)::

    creds = app.state.registry.create(session_id, group_id, TokenizationMode.EXACT, SamplingPolicy(), "floe-policy",
                                      ttl_s=1800)
    env = creds.env            # OPENAI_API_KEY/OPENAI_BASE_URL, ANTHROPIC_*, GEMINI_API_KEY/GOOGLE_GEMINI_BASE_URL
                               # (the variables of ``contracts.PROVIDERS``), FLOE_SESSION_TOKEN
    ...run the harness...
    registry.calls(session_id) # model calls recorded so far
    registry.close(session_id) # later calls with its token get 401

Attribution design (docs/polar-comparison.md, "Attribution"; style #5):

- A session token is 32 random bytes (``secrets.token_urlsafe``), prefixed ``floe-``; it is the harness's API key.
  The gateway accepts it from ``Authorization: Bearer``, ``x-api-key``, ``x-goog-api-key``, ``?key=``, or a URL
  prefix ``/s/{token}/...`` (for harnesses whose key cannot be set). Nothing in the body is trusted for identity.
- The token maps to exactly one session. Unknown (forged), expired and closed tokens get a provider-shaped 401
  and increment ``floe_gateway_rejected_credentials_total{reason}``; a call never creates a session.
- Tokens are looked up by their SHA-256 (constant-length keys; the raw token is never logged or kept in the index).
- The registry is per process. A gateway node runs the sessions it creates; routing a harness to the node that
  owns its session is the deployment's job (the runner starts the harness next to its gateway).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from contracts import PROVIDERS, SamplingPolicy, TokenizationMode
from gateway.errors import Unauthenticated

__all__ = ["ChainEntry", "Session", "SessionCredentials", "SessionRegistry"]


@dataclass(frozen=True)
class SessionCredentials:
    session_id: str
    token: str
    base_urls: dict[str, str]
    prefix_base_urls: dict[str, str]
    env: dict[str, str]
    expires_at: float

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "token": self.token,
            "base_urls": self.base_urls,
            "prefix_base_urls": self.prefix_base_urls,
            "env": self.env,
            "expires_at": self.expires_at,
        }


@dataclass
class ChainEntry:
    """One recorded call, kept for exact-mode chaining and delta encoding."""

    call_index: int
    messages: list[Any]  # canonical Messages of the request
    tools_key: str  # tokenization.tools_key of the request in exact mode; "" in canonical mode (unused there)
    reply: Any  # canonical assistant Message the client received
    prompt_ids: list[int]
    completion_ids: list[int]
    finish_reason: str
    # The full canonical request as a decoder rebuilds it (None when the record was truncated): the base of the next
    # call's request delta.
    request: dict[str, Any] | None = None

    @functools.cached_property
    def sequence(self) -> list[int]:
        # Built once: every later call of the session reads it (a delta base, the prefix check), and on a long agent
        # session that was eight copies of ~30K ids a call.
        return self.prompt_ids + self.completion_ids


@dataclass
class Session:
    session_id: str
    group_id: str
    tokenization: TokenizationMode
    sampling: SamplingPolicy
    model: str
    expires_at: float
    closed: bool = False
    next_call_index: int = 0
    calls_ok: int = 0
    calls_failed: int = 0
    last_error: str | None = None  # the last refused call's gateway error, "<kind>: <message>"
    unrecorded: dict[str, int] = field(default_factory=dict)  # why calls ended without a record -> how many
    chain: list[ChainEntry] = field(default_factory=list)
    # Calls of index next_call_index whose record went to the producer without an ack (it failed, timed out, or the
    # client left): they may still land, so the next recorded call supersedes them (ModelCallRecorded v4).
    unacked_call_ids: list[str] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SessionRegistry:
    def __init__(self, base_url: str, *, default_ttl_s: float = 7200.0) -> None:
        self._base_url = base_url.rstrip("/")
        self._default_ttl_s = default_ttl_s
        self._by_digest: dict[str, Session] = {}
        self._by_id: dict[str, tuple[Session, str]] = {}
        self._created = 0

    def create(
        self,
        session_id: str,
        group_id: str,
        tokenization_mode: TokenizationMode,
        sampling: SamplingPolicy,
        model: str,
        ttl_s: float | None = None,
    ) -> SessionCredentials:
        """Register a session and mint its token. Creating an id that is already open returns fresh credentials
        for the same session (the old token stays valid): a redelivered request must not fork a session."""
        now = time.time()
        self._created += 1
        if self._created % 256 == 0:
            self.sweep()
        existing = self._by_id.get(session_id)
        if existing is not None and not existing[0].closed:
            session = existing[0]
        else:
            session = Session(
                session_id=session_id,
                group_id=group_id,
                tokenization=tokenization_mode,
                sampling=sampling,
                model=model,
                expires_at=now + (ttl_s if ttl_s is not None else self._default_ttl_s),
            )
        token = "floe-" + secrets.token_urlsafe(32)
        digest = _digest(token)
        self._by_digest[digest] = session
        self._by_id[session_id] = (session, digest)
        return self._credentials(session, token)

    def _credentials(self, session: Session, token: str) -> SessionCredentials:
        # Every provider's base URL, plain and with the token in the path, and the env vars its SDKs and CLIs read.
        prefixed = f"{self._base_url}/s/{token}"
        base_urls = {p.name: p.base_url(self._base_url) for p in PROVIDERS}
        prefix_urls = {p.name: p.base_url(prefixed) for p in PROVIDERS}
        env: dict[str, str] = {}
        for p in PROVIDERS:
            env |= dict.fromkeys(p.key_env, token)
            env |= dict.fromkeys(p.base_url_env, base_urls[p.name])
            env |= dict.fromkeys(p.model_env, session.model)
        env["FLOE_SESSION_TOKEN"] = token
        return SessionCredentials(session.session_id, token, base_urls, prefix_urls, env, session.expires_at)

    def resolve(self, token: str | None) -> Session:
        """The session of a presented token, or ``Unauthenticated`` with a reason for the metric."""
        if not token:
            raise Unauthenticated("missing API key: use the session token issued by floe", reason="missing")
        session = self._by_digest.get(_digest(token))
        if session is None:
            raise Unauthenticated("invalid API key: not a floe session token", reason="unknown")
        if session.closed:
            raise Unauthenticated("session is closed", reason="closed")
        if time.time() > session.expires_at:
            raise Unauthenticated("session token expired", reason="expired")
        return session

    def get(self, session_id: str) -> Session | None:
        entry = self._by_id.get(session_id)
        return entry[0] if entry else None

    def close(self, session_id: str) -> bool:
        entry = self._by_id.get(session_id)
        if entry is None:
            return False
        entry[0].closed = True
        entry[0].chain.clear()
        return True

    def calls(self, session_id: str) -> int:
        """Calls recorded so far for the session (0 for an unknown id)."""
        entry = self._by_id.get(session_id)
        return entry[0].calls_ok if entry else 0

    def stats(self, session_id: str) -> dict[str, Any]:
        entry = self._by_id.get(session_id)
        if entry is None:
            return {}
        s = entry[0]
        return {
            "calls_ok": s.calls_ok,
            "calls_failed": s.calls_failed,
            "next_call_index": s.next_call_index,
            "last_error": s.last_error,
            "unrecorded": dict(s.unrecorded),
        }

    def sweep(self) -> int:
        """Forget sessions expired for more than an hour (bounded memory for long-running nodes); their tokens then
        count as ``unknown`` instead of ``expired``."""
        cutoff = time.time() - 3600
        gone = [
            sid
            for sid, (s, _) in self._by_id.items()
            if s.expires_at < cutoff or (s.closed and s.expires_at < time.time())
        ]
        for sid in gone:
            _, digest = self._by_id.pop(sid)
            self._by_digest.pop(digest, None)
        return len(gone)
