"""Session outcomes (``classify``); the advantage values are tested with ``contracts.group_advantages``."""

from __future__ import annotations

from contracts import Outcome, RewardPublished, SessionFinished, SessionState
from rollout.advantages import classify


def _finished(status: SessionState, agent_timed_out: bool = False) -> SessionFinished:
    return SessionFinished(
        session_id="s",
        group_id="g",
        task_id="t",
        harness="h",
        node_id="n",
        status=status,
        agent_timed_out=agent_timed_out,
        reason="why",
    )


def _reward(value: float, outcome: Outcome = Outcome.UNRESOLVED) -> RewardPublished:
    return RewardPublished(
        session_id="s", group_id="g", task_id="t", reward=value, outcome=outcome, resolved=outcome is Outcome.RESOLVED
    )


def test_classification_of_every_ending() -> None:
    assert classify(_finished(SessionState.DONE), _reward(1.0, Outcome.RESOLVED)).trainable
    assert classify(_finished(SessionState.DONE), _reward(0.0)).reward == 0.0
    scorer_error = classify(_finished(SessionState.DONE), _reward(0.0, Outcome.ERROR))
    assert not scorer_error.trainable and scorer_error.masked_reason and "scorer_error" in scorer_error.masked_reason
    agent_timeout = classify(_finished(SessionState.TIMEOUT, agent_timed_out=True), _reward(1.0, Outcome.RESOLVED))
    assert agent_timeout.trainable and agent_timeout.reward == 0.0  # a trainable negative
    for status in (SessionState.TIMEOUT, SessionState.FAILED, SessionState.CANCELLED):
        outcome = classify(_finished(status), None)
        assert not outcome.trainable and outcome.masked_reason
    assert classify(_finished(SessionState.DONE), None).masked_reason == "reward_missing"
