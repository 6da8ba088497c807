"""Decode one session's recorded model calls into full prompts (pure).

The gateway delta-encodes prompts (``contracts.ModelCallRecorded``): the full prompt of call *i* is
``sequence(prefix_call_index)[:prefix_len] + prompt_token_ids`` where ``sequence(j)`` is call *j*'s full prompt followed
by its completion ids. Builders need full prompts, so this module undoes that encoding once, in call order.

Invariants checked here (a violation raises ``ReconstructionError``, never a silent fix):
- calls of one session only; redelivered records (same ``call_index`` and ``call_id``) are collapsed, two different
  records with one ``call_index`` are a conflict;
- a referenced prefix call exists and is long enough;
- the decoded length equals ``prompt_len``.
Gaps in ``call_index`` are allowed (a lost record is reported by the caller via ``SessionFinished.calls``), but a call
whose prefix refers to a missing call cannot be decoded and raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from contracts import FinishReason, ModelCallRecorded, TokenizationMode

__all__ = ["DecodedCall", "ReconstructionError", "decode_calls"]


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


def decode_calls(calls: Iterable[ModelCallRecorded]) -> list[DecodedCall]:
    """Return the session's calls in ``call_index`` order with full prompts; raise ``ReconstructionError``."""
    by_index: dict[int, ModelCallRecorded] = {}
    session_ids: set[str] = set()
    for call in calls:
        session_ids.add(call.session_id)
        seen = by_index.get(call.call_index)
        if seen is None:
            by_index[call.call_index] = call
        elif seen.call_id != call.call_id:
            raise ReconstructionError(
                f"call_index {call.call_index} recorded twice with different call_id "
                f"({seen.call_id!r}, {call.call_id!r})"
            )
    if len(session_ids) > 1:
        raise ReconstructionError(f"calls of several sessions given to one reconstruction: {sorted(session_ids)}")
    sequences: dict[int, tuple[int, ...]] = {}
    out: list[DecodedCall] = []
    for index in sorted(by_index):
        call = by_index[index]
        prompt = _full_prompt(call, sequences)
        decoded = DecodedCall(
            call_index=call.call_index,
            call_id=call.call_id,
            tokenization=call.tokenization,
            weight_version=call.weight_version,
            prompt=prompt,
            completion=tuple(call.completion_token_ids),
            logprobs=tuple(call.completion_logprobs),
            finish_reason=call.finish_reason,
        )
        sequences[index] = decoded.sequence
        out.append(decoded)
    return out


def _full_prompt(call: ModelCallRecorded, sequences: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    if call.prefix_call_index is None:
        prompt = tuple(call.prompt_token_ids)
    else:
        base: Sequence[int] | None = sequences.get(call.prefix_call_index)
        if base is None:
            raise ReconstructionError(
                f"call {call.call_index} refers to prefix call {call.prefix_call_index}, which was not recorded"
            )
        if call.prefix_len > len(base):
            raise ReconstructionError(
                f"call {call.call_index}: prefix_len {call.prefix_len} exceeds call {call.prefix_call_index}'s "
                f"sequence length {len(base)}"
            )
        prompt = tuple(base[: call.prefix_len]) + tuple(call.prompt_token_ids)
    if len(prompt) != call.prompt_len:
        raise ReconstructionError(
            f"call {call.call_index}: decoded prompt has {len(prompt)} tokens, prompt_len says {call.prompt_len}"
        )
    return prompt
