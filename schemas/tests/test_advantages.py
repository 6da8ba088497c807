"""``contracts.group_advantages``: the one GRPO advantage function (the rollout's, read by the learner)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import ADVANTAGE_METHODS, AdvantageMethod, group_advantages


def test_mean_std_and_loo_values() -> None:
    g = group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4)  # the default is mean_std
    assert not g.zero_signal
    assert g.advantages == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], [True] * 4, "mean_std") == g
    loo = group_advantages([1.0, 0.0, 0.0], [True] * 3, "loo")
    assert loo.advantages == pytest.approx([1.0, -0.5, -0.5])
    mean = group_advantages([1.0, 0.0, 0.0], [True] * 3, "mean")
    assert mean.advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    std = math.sqrt(2 / 9)
    loo_std = group_advantages([1.0, 0.0, 0.0], [True] * 3, "loo_std")
    assert loo_std.advantages == pytest.approx([1.0 / (std + 1e-6), -0.5 / (std + 1e-6), -0.5 / (std + 1e-6)])


def test_masked_sessions_are_outside_the_statistics() -> None:
    g = group_advantages([1.0, 0.0, 1.0, 0.0], [True, True, False, False], "mean_std")
    assert g.advantages[2:] == (0.0, 0.0)
    assert g.advantages[:2] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert g.trainable == 2


def test_all_equal_or_single_groups_have_no_signal() -> None:
    assert group_advantages([1.0, 1.0, 1.0], [True] * 3).zero_signal
    assert group_advantages([1.0, 0.0], [True, False]).zero_signal
    assert group_advantages([], []).advantages == ()


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        group_advantages([1.0, 0.0], [True])
    with pytest.raises(ValueError, match="unknown advantage method"):
        group_advantages([1.0, 0.0], [True, True], "median")  # type: ignore[arg-type]


@given(st.lists(st.floats(0, 1), min_size=2, max_size=16), st.sampled_from(ADVANTAGE_METHODS))
def test_advantages_sum_to_zero_over_trainable_sessions(rewards: list[float], method: AdvantageMethod) -> None:
    g = group_advantages(rewards, [True] * len(rewards), method)
    assert all(math.isfinite(a) for a in g.advantages)
    assert abs(sum(g.advantages)) < 1e-6 * len(rewards) * (1e6 if "std" in method else 1) + 1e-9
