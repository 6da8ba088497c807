"""Session outcomes (pure): which sessions of a group are trainable, and with which reward.

``classify`` turns a session's end (``SessionFinished``) and grade (``RewardPublished``) into one of:

- **trainable** with the scorer's reward: the agent finished (``DONE``) and the grade is not a scorer error;
- **trainable negative**, reward forced to 0: the *agent's* own budget ran out (``TIMEOUT`` with
  ``agent_timed_out``). Its tokens and logprobs are aligned, and running out of budget is the policy's doing
  (Polar §1.5, §4);
- **masked** (loss mask all zeros, advantage 0, ``masked_reason`` set): infrastructure failure (``FAILED``), the
  session deadline (``TIMEOUT`` without ``agent_timed_out``), a cancelled straggler (``CANCELLED``), a scorer error
  (``Outcome.ERROR``), a session with no model calls, or calls that cannot be reconstructed. Masked sessions are
  *kept* in the batch so every group stays aligned with its G requests; they never enter the group statistics.

The group's advantages are then ``contracts.group_advantages`` over the trainable sessions (the one advantage
function; its docstring lists the methods and the default).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts import Outcome, RewardPublished, SessionFinished, SessionState

__all__ = ["SessionOutcome", "classify", "needs_reward"]


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
