"""The learner's busy clock (``learner.train.BusyClock``): the fraction of time since the first batch spent on
batches, as every ``WeightsPublished`` reports it."""

from __future__ import annotations

import pytest

from learner.train import BusyClock


def test_busy_fraction_counts_batches_against_the_waits_between_them() -> None:
    clock = BusyClock()
    clock.batch_arrived(now=100.0)  # model loading before the first batch is not idle time
    first = clock.batch_done(now=102.0)
    assert first["learner_step_s"] == 2.0 and first["learner_wait_s"] == 0.0
    assert first["learner_busy_fraction"] == 1.0
    clock.batch_arrived(now=108.0)  # waited 6 s for the next batch
    second = clock.batch_done(now=110.0)
    assert second["learner_wait_s"] == 6.0 and second["learner_step_s"] == 2.0
    assert second["learner_busy_s"] == 4.0 and second["learner_window_s"] == 10.0
    assert second["learner_busy_fraction"] == pytest.approx(0.4)


def test_batch_done_before_any_batch_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        BusyClock().batch_done(now=1.0)
