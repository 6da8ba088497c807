"""Decode one session's recorded model calls into full prompts (pure).

The gateway delta-encodes prompts (``contracts.prompt_delta``, which holds both the encoder and the decoder).
Builders need full prompts, so this module collects a session's records and undoes that encoding once, in call order.

Invariants checked here (a violation raises ``ReconstructionError``, never a silent fix):
- calls of one session only; redelivered records (same ``call_index`` and ``call_id``) are collapsed; of two
  different records with one ``call_index``, the one that names the other in ``supersedes_call_ids`` is kept (the
  other is an attempt the gateway could not record durably and the harness asked again, whatever their order on the
  topic); any other pair is a conflict (``merge_call``);
- every prompt decodes: its referenced prefix call exists and is long enough, and the decoded length equals
  ``prompt_len`` (``contracts.PromptDeltaError``, re-raised as ``ReconstructionError`` with the same message).
``full_requests`` undoes the request delta encoding (``contracts.request_delta``) the same way; only the dataset
export reads requests, so the builders never pay for it.
Gaps in ``call_index`` are allowed (a lost record is reported by the caller via ``SessionFinished.calls``), but a call
whose prefix refers to a missing call cannot be decoded and raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contracts import (
    FinishReason,
    ModelCallRecorded,
    PromptDeltaError,
    RequestDeltaError,
    TokenizationMode,
    decode_prompts,
    decode_requests,
)

__all__ = ["DecodedCall", "ReconstructionError", "decode_calls", "full_requests", "merge_call"]


class ReconstructionError(ValueError):
    """The recorded calls of a session are inconsistent and cannot be decoded."""


@dataclass(frozen=True, slots=True)
class DecodedCall:
    """One model call with its full prompt restored. Token lists are tuples so a call is hashable and immutable."""

    call_index: int
    call_id: str
    tokenization: TokenizationMode
    weight_version: int
    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason

    @property
    def sequence(self) -> tuple[int, ...]:
        return self.prompt + self.completion


def merge_call(by_index: dict[int, ModelCallRecorded], call: ModelCallRecorded) -> None:
    """Add ``call`` to one session's calls by ``call_index`` (the rules in the module docstring); raise
    ``ReconstructionError`` for a conflict, leaving ``by_index`` as it was."""
    seen = by_index.get(call.call_index)
    if seen is None or seen.call_id in call.supersedes_call_ids:
        by_index[call.call_index] = call
    elif seen.call_id != call.call_id and call.call_id not in seen.supersedes_call_ids:
        raise ReconstructionError(
            f"call_index {call.call_index} recorded twice with different call_id ({seen.call_id!r}, {call.call_id!r})"
        )


def decode_calls(calls: Iterable[ModelCallRecorded]) -> list[DecodedCall]:
    """Return the session's calls in ``call_index`` order with full prompts; raise ``ReconstructionError``."""
    by_index: dict[int, ModelCallRecorded] = {}
    session_ids: set[str] = set()
    for call in calls:
        session_ids.add(call.session_id)
        merge_call(by_index, call)
    if len(session_ids) > 1:
        raise ReconstructionError(f"calls of several sessions given to one reconstruction: {sorted(session_ids)}")
    ordered = [by_index[index] for index in sorted(by_index)]
    try:
        prompts = decode_prompts(ordered)
    except PromptDeltaError as exc:
        raise ReconstructionError(str(exc)) from exc
    return [
        DecodedCall(
            call_index=call.call_index,
            call_id=call.call_id,
            tokenization=call.tokenization,
            weight_version=call.weight_version,
            prompt=prompt,
            completion=tuple(call.completion_token_ids),
            logprobs=tuple(call.completion_logprobs),
            finish_reason=call.finish_reason,
        )
        for call, prompt in zip(ordered, prompts, strict=True)
    ]


def full_requests(calls: Iterable[ModelCallRecorded]) -> dict[int, dict[str, Any]]:
    """call_index -> full canonical request of one session's calls (any order, each once); raise
    ``ReconstructionError`` if a request refers to a call that is missing or does not fit it."""
    ordered = sorted(calls, key=lambda c: c.call_index)
    try:
        return {c.call_index: r for c, r in zip(ordered, decode_requests(ordered), strict=True)}
    except RequestDeltaError as exc:
        raise ReconstructionError(str(exc)) from exc
