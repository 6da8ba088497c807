"""What a builder produces: traces (training sequences) and per-session reconstruction stats.

A ``Trace`` is prompt + response in one token list with aligned per-token columns, the shape of one row of
``contracts.arrow.TRAJECTORY_SCHEMA``: ``loss_mask`` 1 only on sampled tokens, ``logprobs`` the sampling logprob there
and 0.0 elsewhere, ``weight_versions`` the serving weight version there and -1 elsewhere. Positions before
``prompt_len`` are never trainable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["COUNTS", "BuildResult", "ReconstructionStats", "Trace"]


@dataclass(frozen=True, slots=True)
class Trace:
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]
    prompt_len: int
    call_indices: tuple[int, ...]  # the calls whose sampled tokens this trace carries, in order

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.loss_mask) == len(self.logprobs) == len(self.weight_versions) == n):
            raise ValueError("trace columns are not aligned with tokens")
        if self.prompt_len > n or any(self.loss_mask[: self.prompt_len]):
            raise ValueError("prompt positions must exist and be masked")

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def masked_tokens(self) -> int:
        """Masked positions after the prompt (interstitials: tool results, template glue, inserted end-of-turn)."""
        return len(self.tokens) - self.prompt_len - self.trainable_tokens


# The integer counters of ReconstructionStats (summed by ``add``; carried by GroupAssembled).
COUNTS = (
    "calls",
    "chains",
    "merged",
    "unmatched",
    "breaks",
    "prompt_tokens",
    "masked_tokens",
    "trainable_tokens",
    "total_tokens",
)


@dataclass(slots=True)
class ReconstructionStats:
    """Counters of one session's reconstruction (summable across sessions).

    ``chains`` is the number of traces. A call either *merges* into an open chain or starts a new one; a new chain is
    started either because the call's prompt extends no open chain (``unmatched``: first call, compaction, sub-agent,
    history rewrite) or because it extends a chain's tip but the chain check failed (``breaks``).
    """

    calls: int = 0
    chains: int = 0
    merged: int = 0
    unmatched: int = 0
    breaks: int = 0
    prompt_tokens: int = 0
    masked_tokens: int = 0
    trainable_tokens: int = 0
    total_tokens: int = 0
    break_reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: ReconstructionStats) -> None:
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, count in other.break_reasons.items():
            self.break_reasons[reason] = self.break_reasons.get(reason, 0) + count

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {
            "calls": self.calls,
            "chains": self.chains,
            "merged": self.merged,
            "unmatched": self.unmatched,
            "breaks": self.breaks,
            "prompt_tokens": self.prompt_tokens,
            "masked_tokens": self.masked_tokens,
            "trainable_tokens": self.trainable_tokens,
            "total_tokens": self.total_tokens,
        }
        for reason, count in sorted(self.break_reasons.items()):
            out[f"break.{reason}"] = count
        return out


@dataclass(frozen=True, slots=True)
class BuildResult:
    traces: tuple[Trace, ...]
    stats: ReconstructionStats

    @staticmethod
    def of(traces: list[Trace], stats: ReconstructionStats) -> BuildResult:
        for trace in traces:
            stats.prompt_tokens += trace.prompt_len
            stats.masked_tokens += trace.masked_tokens
            stats.trainable_tokens += trace.trainable_tokens
            stats.total_tokens += len(trace.tokens)
        stats.chains = len(traces)
        return BuildResult(tuple(traces), stats)
