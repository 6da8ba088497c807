"""The request delta encoding of ``ModelCallRecorded`` (v2): the encoder and the decoder, in one place.

An agent resends its whole conversation (and its tool schemas) on every call, so recording the canonical request in
full makes a session's bytes grow with the square of its length. A call's request is recorded instead against the
full request of an earlier call of the same session (its *base*)::

    full request = {key: base[key] for key in request_same}        # fields equal to the base's (tools, system...)
                 | request                                          # fields that changed, in full
    full["messages"] = base["messages"][:request_messages_prefix] + request.get("messages", [])

``request_base_call_index=None`` means ``request`` is the whole request. Keys in neither ``request_same`` nor
``request`` are absent from the full request.

- ``encode_request`` (the gateway): messages shared as a prefix with the base are left out; every other top-level
  field equal to the base's is named in ``request_same``. The gateway uses the previous recorded call whose request
  was recorded whole (not truncated) as the base; that choice is the gateway's, not part of the contract.
- ``decode_request`` / ``decode_requests`` (the rollout, ``floe replay``, tools): rebuild full requests. A request
  whose base is missing raises ``RequestDeltaError``; nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.errors import RequestDeltaError
from contracts.events import ModelCallRecorded

__all__ = ["RequestDelta", "decode_request", "decode_requests", "encode_request"]


@dataclass(frozen=True, slots=True)
class RequestDelta:
    """One request, delta-encoded: the ``ModelCallRecorded`` fields ``request_base_call_index``,
    ``request_messages_prefix``, ``request_same`` and ``request``."""

    base_call_index: int | None
    messages_prefix: int
    same: tuple[str, ...]
    request: dict[str, Any] = field(default_factory=dict)


def encode_request(request: Mapping[str, Any], base: tuple[int, Mapping[str, Any]] | None) -> RequestDelta:
    """Delta-encode ``request`` against ``base`` (``(call_index, full request)`` of an earlier call; None: whole)."""
    if base is None:
        return RequestDelta(None, 0, (), dict(request))
    base_index, base_request = base
    rest: dict[str, Any] = {}
    same: list[str] = []
    prefix = 0
    for key, value in request.items():
        if key == "messages" and isinstance(value, list) and isinstance(base_request.get(key), list):
            old = base_request[key]
            n = min(len(old), len(value))
            while prefix < n and old[prefix] == value[prefix]:
                prefix += 1
            if prefix == len(value) == len(old):
                same.append(key)
                prefix = 0
            else:
                rest[key] = value[prefix:]
        elif key in base_request and base_request[key] == value:
            same.append(key)
        else:
            rest[key] = value
    return RequestDelta(base_index, prefix, tuple(same), rest)


def decode_request(call: ModelCallRecorded, requests: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The full request of ``call``, given ``requests`` (call_index -> full request) of the session's earlier calls;
    raise ``RequestDeltaError`` if it cannot be rebuilt."""
    if call.request_base_call_index is None:
        return dict(call.request)
    base = requests.get(call.request_base_call_index)
    if base is None:
        raise RequestDeltaError(
            f"call {call.call_index} refers to request of call {call.request_base_call_index}, which was not recorded"
        )
    missing = [k for k in call.request_same if k not in base]
    if missing:
        raise RequestDeltaError(f"call {call.call_index}: fields {missing} are not in the base request")
    full: dict[str, Any] = {k: base[k] for k in call.request_same}
    full.update(call.request)
    if call.request_messages_prefix:
        old = base.get("messages")
        if not isinstance(old, list) or len(old) < call.request_messages_prefix:
            have = len(old) if isinstance(old, list) else 0
            raise RequestDeltaError(
                f"call {call.call_index}: request_messages_prefix {call.request_messages_prefix} exceeds the "
                f"{have} messages of call {call.request_base_call_index}'s request"
            )
        full["messages"] = old[: call.request_messages_prefix] + list(call.request.get("messages", []))
    return full


def decode_requests(calls: Iterable[ModelCallRecorded]) -> list[dict[str, Any]]:
    """Full requests of one session's calls, given in call order, each once. Raise ``RequestDeltaError`` at the
    first request that cannot be rebuilt."""
    requests: dict[int, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for call in calls:
        full = decode_request(call, requests)
        requests[call.call_index] = full
        out.append(full)
    return out
