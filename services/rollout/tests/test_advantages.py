from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import Outcome, RewardPublished, SessionFinished, SessionState
from rollout.advantages import classify, group_advantages


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


def test_mean_std_and_loo_values() -> None:
    g = group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4, "mean_std")
    assert not g.zero_signal
    assert g.advantages == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    loo = group_advantages([1.0, 0.0, 0.0], [True] * 3, "loo")
    assert loo.advantages == pytest.approx([1.0, -0.5, -0.5])
    mean = group_advantages([1.0, 0.0, 0.0], [True] * 3, "mean")
    assert mean.advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_masked_sessions_are_outside_the_statistics() -> None:
    g = group_advantages([1.0, 0.0, 1.0, 0.0], [True, True, False, False], "mean_std")
    assert g.advantages[2:] == (0.0, 0.0)
    assert g.advantages[:2] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert g.trainable == 2


def test_all_equal_or_single_groups_have_no_signal() -> None:
    assert group_advantages([1.0, 1.0, 1.0], [True] * 3).zero_signal
    assert group_advantages([1.0, 0.0], [True, False]).zero_signal
    assert group_advantages([], []).advantages == ()


@given(st.lists(st.floats(0, 1), min_size=2, max_size=16), st.sampled_from(["mean_std", "mean", "loo", "loo_std"]))
def test_advantages_sum_to_zero_over_trainable_sessions(rewards: list[float], method: str) -> None:
    g = group_advantages(rewards, [True] * len(rewards), method)  # type: ignore[arg-type]
    assert all(math.isfinite(a) for a in g.advantages)
    assert abs(sum(g.advantages)) < 1e-6 * len(rewards) * (1e6 if "std" in method else 1) + 1e-9
