"""Session outcomes and group-normalized advantages (pure).

``classify`` turns a session's end (``SessionFinished``) and grade (``RewardPublished``) into one of:

- **trainable** with the scorer's reward: the agent finished (``DONE``) and the grade is not a scorer error;
- **trainable negative**, reward forced to 0: the *agent's* own budget ran out (``TIMEOUT`` with
  ``agent_timed_out``). Its tokens and logprobs are aligned, and running out of budget is the policy's doing
  (Polar §1.5, §4);
- **masked** (loss mask all zeros, advantage 0, ``masked_reason`` set): infrastructure failure (``FAILED``), the
  session deadline (``TIMEOUT`` without ``agent_timed_out``), a cancelled straggler (``CANCELLED``), a scorer error
  (``Outcome.ERROR``), a session with no model calls, or calls that cannot be reconstructed. Masked sessions are
  *kept* in the batch so every group stays aligned with its G requests; they never enter the group statistics.

``group_advantages`` normalizes rewards within one GRPO group over its trainable sessions only:

- ``mean_std`` (GRPO): ``(r - mean) / (std + eps)`` with the population std;
- ``mean``: ``r - mean`` (Dr. GRPO: no std scaling, no length bias from it);
- ``loo``: leave-one-out baseline ``r_i - mean_{j != i} r_j`` (Polar §3.5); ``loo_std`` additionally divides by
  the group std (+eps).

A group with fewer than two trainable sessions, or whose trainable rewards are all equal, carries no GRPO signal:
every advantage is 0 and the group is reported as ``zero_signal`` (the caller filters it by config). Every trace of
a session shares its session's advantage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from contracts import Outcome, RewardPublished, SessionFinished, SessionState

__all__ = ["AdvantageMethod", "GroupAdvantages", "SessionOutcome", "classify", "group_advantages", "needs_reward"]

AdvantageMethod = Literal["mean_std", "mean", "loo", "loo_std"]


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    status: str  # DONE / TIMEOUT / FAILED / CANCELLED
    reward: float
    trainable: bool
    masked_reason: str | None


def needs_reward(finished: SessionFinished) -> bool:
    """Only a session the agent finished is graded into a trainable reward; every other end is decided without it."""
    return finished.status is SessionState.DONE


def classify(finished: SessionFinished, reward: RewardPublished | None) -> SessionOutcome:
    status = finished.status.value
    if finished.status is SessionState.DONE:
        if reward is None:
            return SessionOutcome(status, 0.0, False, "reward_missing")
        if reward.outcome is Outcome.ERROR:
            return SessionOutcome(status, reward.reward, False, f"scorer_error: {reward.reason or 'unknown'}")
        return SessionOutcome(status, float(reward.reward), True, None)
    if finished.status is SessionState.TIMEOUT and finished.agent_timed_out:
        return SessionOutcome(status, 0.0, True, None)
    if finished.status is SessionState.TIMEOUT:
        return SessionOutcome(status, 0.0, False, f"session_timeout: {finished.reason or 'deadline'}")
    if finished.status is SessionState.CANCELLED:
        return SessionOutcome(status, 0.0, False, f"cancelled: {finished.reason or 'cancelled'}")
    return SessionOutcome(status, 0.0, False, f"infra_failure: {finished.reason or 'failed'}")


@dataclass(frozen=True, slots=True)
class GroupAdvantages:
    advantages: tuple[float, ...]
    zero_signal: bool  # fewer than two trainable sessions, or all their rewards equal
    trainable: int


def group_advantages(
    rewards: Sequence[float], trainable: Sequence[bool], method: AdvantageMethod = "mean_std", eps: float = 1e-6
) -> GroupAdvantages:
    if len(rewards) != len(trainable):
        raise ValueError("rewards and trainable flags differ in length")
    values = [r for r, t in zip(rewards, trainable, strict=True) if t]
    n = len(values)
    if n < 2 or all(v == values[0] for v in values):
        return GroupAdvantages((0.0,) * len(rewards), True, n)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    out: list[float] = []
    for r, t in zip(rewards, trainable, strict=True):
        if not t:
            out.append(0.0)
        elif method == "mean_std":
            out.append((r - mean) / (std + eps))
        elif method == "mean":
            out.append(r - mean)
        elif method in ("loo", "loo_std"):
            baseline = (mean * n - r) / (n - 1)
            a = r - baseline
            out.append(a / (std + eps) if method == "loo_std" else a)
        else:
            raise ValueError(f"unknown advantage method {method!r}")
    return GroupAdvantages(tuple(out), False, n)
