"""The prompt delta encoding of ``ModelCallRecorded``: the encoder and the decoder, in one place.

An agent's prompts mostly extend each other, so a call's prompt is recorded as a reference into an earlier call of
the same session plus the tokens that follow::

    full prompt of call i = sequence(prefix_call_index)[:prefix_len] + prompt_token_ids
    sequence(j)           = full prompt of call j + completion_token_ids of call j

``prefix_call_index=None`` (with ``prefix_len=0``) means ``prompt_token_ids`` is the whole prompt; ``prompt_len`` is
the full length either way.

- ``encode_prompt`` (the gateway): among the earlier calls offered as bases, reference the one whose sequence shares
  the longest prefix with the prompt; ties go to the latest call; no shared token means no reference.
- ``decode_prompt`` / ``decode_prompts`` (the rollout, tests, tools): rebuild full prompts. A decoder needs only the
  referenced call's sequence, so it reads whatever base a producer chose: the choice rule above is the gateway's,
  not part of the contract (the rollout tests' session simulator references only the agent's previous call).

A prompt that cannot be rebuilt (its base call was not given, is shorter than ``prefix_len``, or the result is not
``prompt_len`` long) raises ``PromptDeltaError``; nothing is ever guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from contracts.errors import PromptDeltaError
from contracts.events import ModelCallRecorded

__all__ = ["PromptDelta", "decode_prompt", "decode_prompts", "encode_prompt"]


@dataclass(frozen=True, slots=True)
class PromptDelta:
    """One prompt, delta-encoded: the ``ModelCallRecorded`` fields of the same names (``tail`` is
    ``prompt_token_ids``)."""

    prefix_call_index: int | None
    prefix_len: int
    tail: tuple[int, ...]

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + len(self.tail)


def encode_prompt(prompt: Sequence[int], bases: Iterable[tuple[int, Sequence[int]]]) -> PromptDelta:
    """Delta-encode ``prompt`` against ``bases``: ``(call_index, sequence)`` of earlier calls of the session (any
    order; none at all gives the whole prompt)."""
    best_index: int | None = None
    best_len = 0
    # Latest first, so that a base that cannot share more than the best so far (ties go to the latest) is skipped
    # unread: an agent's prompt usually extends its previous call, whose sequence is the longest.
    for call_index, sequence in sorted(bases, key=itemgetter(0), reverse=True):  # itemgetter: no Python call each
        if len(sequence) <= best_len:
            continue
        n = _common_prefix_len(sequence, prompt)
        if n > best_len:
            best_index, best_len = call_index, n
            if n == len(prompt):  # the whole prompt: no other base can share more
                break
    return PromptDelta(best_index, best_len, tuple(prompt[best_len:]))


def decode_prompt(call: ModelCallRecorded, sequences: Mapping[int, Sequence[int]]) -> tuple[int, ...]:
    """The full prompt of ``call``, given ``sequences`` (call_index -> full prompt + completion) of the session's
    earlier calls; raise ``PromptDeltaError`` if it cannot be rebuilt."""
    if call.prefix_call_index is None:
        prompt = tuple(call.prompt_token_ids)
    else:
        base = sequences.get(call.prefix_call_index)
        if base is None:
            raise PromptDeltaError(
                f"call {call.call_index} refers to prefix call {call.prefix_call_index}, which was not recorded"
            )
        if call.prefix_len > len(base):
            raise PromptDeltaError(
                f"call {call.call_index}: prefix_len {call.prefix_len} exceeds call {call.prefix_call_index}'s "
                f"sequence length {len(base)}"
            )
        prompt = tuple(base[: call.prefix_len]) + tuple(call.prompt_token_ids)
    # The event's validator already ties prompt_len to prefix_len + the tail; this guards model_construct'ed calls.
    if len(prompt) != call.prompt_len:
        raise PromptDeltaError(
            f"call {call.call_index}: decoded prompt has {len(prompt)} tokens, prompt_len says {call.prompt_len}"
        )
    return prompt


def decode_prompts(calls: Iterable[ModelCallRecorded]) -> list[tuple[int, ...]]:
    """Full prompts of one session's calls, given in call order, each once; a call may refer to any call before it.
    Raise ``PromptDeltaError`` at the first prompt that cannot be rebuilt."""
    sequences: dict[int, tuple[int, ...]] = {}
    out: list[tuple[int, ...]] = []
    for call in calls:
        prompt = decode_prompt(call, sequences)
        sequences[call.call_index] = prompt + tuple(call.completion_token_ids)
        out.append(prompt)
    return out


_CHUNK = 4096


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items ``a`` and ``b`` share. Slices are compared in C, a chunk at a time, then halved down to
    the first difference: an element-wise Python loop took ~0.7 ms per 30K-token base, on the gateway's hot path."""
    if type(a) is not type(b):  # a list never equals a tuple: compare one kind of sequence
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + _CHUNK, n)
        if a[i:j] == b[i:j]:
            i = j
            continue
        while j - i > 16:  # a[:i] == b[:i], and they differ in [i, j)
            mid = (i + j) // 2
            if a[i:mid] == b[i:mid]:
                i = mid
            else:
                j = mid
        while a[i] == b[i]:
            i += 1
        return i
    return n
