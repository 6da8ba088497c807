"""What the ``advantage`` column of a trajectory batch holds: GRPO group-relative advantages, computed once, here.

The rollout computes them when it builds a group's rows; the learner only reads the column. Tests and benchmarks
that make batches without a rollout call this same function, so every advantage in floe comes from one place (it
lives in the contract package because services never import each other).

``group_advantages`` normalizes the rewards of one GRPO group over its *trainable* sessions only (one reward per
session; every trace of a session carries its session's advantage). ``method`` (default ``mean_std``):

- ``mean_std`` (GRPO): ``(r - mean) / (std + eps)`` with the population std;
- ``mean``: ``r - mean`` (Dr. GRPO: no std scaling, no length bias from it);
- ``loo``: leave-one-out baseline ``r_i - mean_{j != i} r_j`` (Polar §3.5); ``loo_std`` additionally divides by
  the group std (+eps).

A group with fewer than two trainable sessions, or whose trainable rewards are all equal, carries no GRPO signal:
every advantage is 0 and the group is reported as ``zero_signal`` (the rollout drops or keeps it by config). A
session that is not trainable (masked) gets 0 and does not enter the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["ADVANTAGE_METHODS", "AdvantageMethod", "GroupAdvantages", "group_advantages"]

AdvantageMethod = Literal["mean_std", "mean", "loo", "loo_std"]
ADVANTAGE_METHODS: tuple[AdvantageMethod, ...] = get_args(AdvantageMethod)


@dataclass(frozen=True, slots=True)
class GroupAdvantages:
    advantages: tuple[float, ...]  # one per session, in the order given
    zero_signal: bool  # fewer than two trainable sessions, or all their rewards equal
    trainable: int


def group_advantages(
    rewards: Sequence[float], trainable: Sequence[bool], method: AdvantageMethod = "mean_std", eps: float = 1e-6
) -> GroupAdvantages:
    """The advantages of one group's sessions (see the module docstring for the methods)."""
    if len(rewards) != len(trainable):
        raise ValueError("rewards and trainable flags differ in length")
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"unknown advantage method {method!r}; choose one of {ADVANTAGE_METHODS}")
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
        else:  # loo, loo_std
            baseline = (mean * n - r) / (n - 1)
            a = r - baseline
            out.append(a / (std + eps) if method == "loo_std" else a)
    return GroupAdvantages(tuple(out), False, n)
