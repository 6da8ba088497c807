"""``prefix_merging``: one trace per chain of calls linked by the token-prefix relation of their full prompts.

Algorithm (Polar §3.3, with floe's re-chaining instead of truncation; docs/polar-comparison.md, "Prefix merging"
and "Re-chaining vs truncation"):

1. Calls are taken in ``call_index`` order. A call *extends* an open chain when the chain's tip prompt (the full prompt
   of the chain's last call) is a proper token prefix of the call's prompt (an equal prompt is a retry: a sibling).
   Comparing prompt to prompt is immune to the sampled ``[fish, ing]`` coming back re-tokenized as ``[fishing]``.
2. Candidates are tried longest tip first, most recent first; the first whose *chain check* passes gets the call.
   With ``tail = prompt[len(tip.prompt):]`` the check yields the *interstitial* (tool results + template glue,
   trained masked with logprob 0):
   - **Exact extension**: ``tail`` starts with the tip's sampled completion ids → interstitial is the rest. Calls
     recorded in the gateway's ``exact`` mode are built this way by construction, so they merge with no failures.
   - **End-of-turn rule** (``canonical`` calls only, where the server re-rendered the previous answer): the first
     end-of-turn token in ``tail`` at index k closes the canonical copy of the previous answer. If the raw sampled
     completion already ends with an end-of-turn token the interstitial is ``tail[k+1:]``; if it does not
     (``finish_reason=length``, abort, or an engine that strips the stop token) it is ``tail[k:]``, so the
     end-of-turn token is inserted, masked, to close the turn.
   An ``exact`` call that does not extend the tip's completion is never merged by the end-of-turn rule: the model was
   conditioned on something else (a history rewrite), and merging would train on a context it did not see.
3. A call that extends no chain (first call, compaction, sub-agent, rewritten history) starts a new chain
   (``unmatched``); a call whose every candidate check fails also starts a new chain (``breaks``, with a reason).
   Nothing is ever dropped: every call's sampled tokens land, trainable, in exactly one trace.

The first prompt of a chain is its context (never trainable). Known residual mismatch in ``canonical`` mode: the trace
carries the raw sampled tokens of earlier turns while later turns were sampled after the server's re-tokenized copy;
importance-sampling correction absorbs it, ``exact`` mode removes it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from contracts import TokenizationMode
from rollout.calls import DecodedCall
from rollout.trace import BuildResult, ReconstructionStats, Trace

__all__ = ["build_prefix_merging", "detect_eot_ids"]

_STOP_REASONS = frozenset({"stop", "tool_calls"})


@dataclass(slots=True)
class _Chain:
    tip: DecodedCall
    prompt_len: int
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    call_indices: list[int] = field(default_factory=list)

    def extend(self, interstitial: Sequence[int], call: DecodedCall) -> None:
        n_int, n_out = len(interstitial), len(call.completion)
        self.tokens.extend(interstitial)
        self.tokens.extend(call.completion)
        self.loss_mask.extend([0] * n_int + [1] * n_out)
        self.logprobs.extend([0.0] * n_int)
        self.logprobs.extend(call.logprobs)
        self.versions.extend([-1] * n_int + [call.weight_version] * n_out)
        self.call_indices.append(call.call_index)
        self.tip = call

    def to_trace(self) -> Trace:
        return Trace(
            tokens=tuple(self.tokens),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            weight_versions=tuple(self.versions),
            prompt_len=self.prompt_len,
            call_indices=tuple(self.call_indices),
        )


def detect_eot_ids(calls: Sequence[DecodedCall]) -> frozenset[int]:
    """The last token of the first call that stopped on its own (``stop``/``tool_calls``), or nothing."""
    for call in calls:
        if call.finish_reason in _STOP_REASONS and call.completion:
            return frozenset({call.completion[-1]})
    return frozenset()


def build_prefix_merging(calls: Sequence[DecodedCall], eot_token_ids: Collection[int] | None = None) -> BuildResult:
    eot = frozenset(eot_token_ids) if eot_token_ids else detect_eot_ids(calls)
    stats = ReconstructionStats(calls=len(calls))
    chains: list[_Chain] = []
    for call in calls:
        candidates = [
            (len(chain.tip.prompt), position, chain)
            for position, chain in enumerate(chains)
            if chain.tip.prompt and _is_proper_prefix(chain.tip.prompt, call.prompt)
        ]
        # Longest tip first, then the most recently opened chain (sort is on (len, position), both descending).
        candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
        reason: str | None = None
        for _, _, chain in candidates:
            interstitial, failure = _interstitial(chain.tip, call, eot)
            if interstitial is not None:
                chain.extend(interstitial, call)
                stats.merged += 1
                break
            reason = reason or failure
        else:
            if candidates:
                stats.breaks += 1
                key = reason or "check_failed"
                stats.break_reasons[key] = stats.break_reasons.get(key, 0) + 1
            else:
                stats.unmatched += 1
            chain = _Chain(tip=call, prompt_len=len(call.prompt))
            chain.tokens.extend(call.prompt)
            chain.loss_mask.extend([0] * len(call.prompt))
            chain.logprobs.extend([0.0] * len(call.prompt))
            chain.versions.extend([-1] * len(call.prompt))
            chain.extend((), call)
            chains.append(chain)
    return BuildResult.of([chain.to_trace() for chain in chains], stats)


def _is_proper_prefix(prefix: tuple[int, ...], seq: tuple[int, ...]) -> bool:
    # A prompt equal to a tip is a re-sample of the same context (a retry), a sibling rather than an extension.
    return len(prefix) < len(seq) and seq[: len(prefix)] == prefix


def _interstitial(
    prev: DecodedCall, call: DecodedCall, eot: frozenset[int]
) -> tuple[tuple[int, ...], None] | tuple[None, str]:
    tail = call.prompt[len(prev.prompt) :]
    sampled = prev.completion
    if tail[: len(sampled)] == sampled:
        return tail[len(sampled) :], None
    if call.tokenization is TokenizationMode.EXACT:
        return None, "exact_not_extended"
    if not eot:
        return None, "no_eot_id"
    k = next((i for i, token in enumerate(tail) if token in eot), -1)
    if k < 0:
        return None, "no_eot_in_tail"
    if sampled and sampled[-1] in eot:
        return tail[k + 1 :], None
    return tail[k:], None
