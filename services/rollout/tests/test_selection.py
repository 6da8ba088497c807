"""Group selection (off / refill / drop) in a closed loop with the real scheduler and a learner that makes one version
per batch: every mode reaches ``max_steps``; the accounting before ``group_selection`` stalls."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from contracts import SessionFinished, SessionRequested, SessionState, WeightsPublished
from rollout.groups import GroupResult
from rollout.scheduler import RunSpec, Scheduler, SchedulerConfig
from rollout.selection import GroupSelection, GroupSelector, PendingBatch
from rollout.settings import RolloutSettings, RunSettings

T0 = 1_700_000_000_000


@dataclass
class Loop:
    scheduler: Scheduler
    selector: GroupSelector
    batches: list[PendingBatch] = field(default_factory=list)
    zero: dict[str, bool] = field(default_factory=dict)  # group id -> zero signal
    stalled: bool = False


def _drive(
    mode: GroupSelection,
    zero_signal: Callable[[int], bool],
    *,
    groups_per_step: int = 2,
    groups_per_batch: int = 2,
    max_off_policy_steps: int = 0,
    max_steps: int = 6,
    seed: int = 0,
    report: bool = True,
) -> Loop:
    """Admit, finish a random subset of the groups in flight (any order), select, batch, train; until nothing moves.
    ``zero_signal(n)``: whether the n-th train group to complete has no signal. ``report=False`` is the accounting
    before ``group_selection``: the scheduler never hears of a drop."""
    cfg = SchedulerConfig(
        max_groups_in_flight=4,
        max_off_policy_steps=max_off_policy_steps,
        groups_per_step=groups_per_step,
        max_steps=max_steps,
    )
    loop = Loop(
        Scheduler(cfg, [RunSpec("train", ("t1", "t2", "t3"), group_size=2)]),
        GroupSelector(mode, groups_per_batch, groups_per_step),
    )
    rng = random.Random(seed)
    pending: dict[str, list[SessionRequested]] = {}
    completed = 0
    for tick in range(10_000):
        for event in loop.scheduler.tick(T0 + tick):
            if isinstance(event, SessionRequested):
                pending.setdefault(event.group_id, []).append(event)
        if not pending:
            loop.stalled = not loop.scheduler.train_done
            return loop
        for gid in [g for g in sorted(pending) if rng.random() < 0.5]:
            reqs = pending.pop(gid)
            for r in reqs:
                loop.scheduler.observe(
                    SessionFinished(
                        session_id=r.session_id,
                        group_id=gid,
                        task_id=r.task_id,
                        harness=r.harness,
                        node_id="n",
                        status=SessionState.DONE,
                        calls=1,
                    )
                )
            zero = zero_signal(completed)
            completed += 1
            loop.zero[gid] = zero
            group = GroupResult(
                gid, [], zero, 2, T0, metadata=dict(reqs[0].metadata), rollout_step=reqs[0].rollout_step
            )
            selection = loop.selector.add(group)
            if report and selection.refill is not None:
                loop.scheduler.group_dropped(selection.refill)
            if report and selection.skipped_step is not None:
                loop.scheduler.step_skipped(selection.skipped_step)
        for batch in loop.selector.take_batches():
            loop.batches.append(batch)
            version = len(loop.batches)
            loop.scheduler.observe(WeightsPublished(version=version, uri=f"/w/{version}", step=version))
    raise AssertionError("the loop never settled")


def test_dropping_without_telling_the_scheduler_stalls_the_run() -> None:
    # The old drop_zero_signal_groups=True: the first group of step 0 has no signal, is left out of the buffer, and
    # still counts toward step 0; the buffer waits for a second kept group that the lag bound (step 1 > version 0)
    # never admits. Nothing is in flight and nothing ever will be.
    loop = _drive("refill", lambda n: n == 0, report=False)
    assert loop.stalled and loop.batches == [] and loop.scheduler.train_groups_admitted == 2
    # The same data with the drop reported: a replacement is admitted and the run reaches max_steps.
    fixed = _drive("refill", lambda n: n == 0)
    assert not fixed.stalled and len(fixed.batches) == 6


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", ["off", "refill", "drop"])
@pytest.mark.parametrize("lag", [0, 2])
def test_every_mode_reaches_max_steps_whatever_the_drops(mode: GroupSelection, seed: int, lag: int) -> None:
    rng = random.Random(seed)
    zeros = [rng.random() < 0.6 for _ in range(10_000)]
    loop = _drive(mode, zeros.__getitem__, max_off_policy_steps=lag, seed=seed, max_steps=6)
    assert not loop.stalled and loop.scheduler.train_done
    s, sel = loop.scheduler, loop.selector
    batched = [g.group_id for b in loop.batches for g in b.groups]
    assert len(batched) == len(set(batched))
    if mode == "off":
        assert len(loop.batches) == 6 and all(len(b.groups) == 2 for b in loop.batches)
        assert sel.dropped == set()
    elif mode == "refill":
        # Full batches of groups with signal; every dropped group was replaced.
        assert len(loop.batches) == 6 and all(len(b.groups) == 2 for b in loop.batches)
        assert not any(loop.zero[g] for g in batched)
        assert s.train_groups_admitted == 12 + len(sel.dropped) == len(loop.zero)
    else:
        # One batch per step that kept a group, only that step's kept groups; steps with none are skipped.
        steps = [b.rollout_step for b in loop.batches]
        assert len(steps) == len(set(steps)) and set(steps) | sel.skipped_steps == set(range(6))
        assert not set(steps) & sel.skipped_steps
        for b in loop.batches:
            assert 1 <= len(b.groups) <= 2 and {g.rollout_step for g in b.groups} == {b.rollout_step}
        assert not any(loop.zero[g] for g in batched)
        assert s.train_groups_admitted == 12 == len(batched) + len(sel.dropped)
        assert s.learner_version + len(s.skipped_steps) == 6 == s.steps_done


def test_drop_skips_a_step_whose_groups_all_had_no_signal_and_admission_goes_on() -> None:
    # Steps 0 and 1 have no signal at all; with lag 0 the scheduler would wait for version 1 forever unless the
    # skipped steps count as done.
    loop = _drive("drop", lambda n: n < 4, max_off_policy_steps=0, max_steps=3)
    assert not loop.stalled
    assert loop.selector.skipped_steps == {0, 1} and [b.rollout_step for b in loop.batches] == [2]
    assert loop.scheduler.snapshot()["steps_skipped"] == [0, 1]


def test_a_rebuilt_selector_does_not_count_a_published_step_again() -> None:
    def group(gid: str, index: int, step: int, zero: bool) -> GroupResult:
        return GroupResult(gid, [], zero, 2, T0, metadata={"train_index": str(index)}, rollout_step=step)

    live = GroupSelector("drop", 1, 2)
    live.add(group("a", 0, 0, zero=True))
    live.add(group("b", 1, 0, zero=False))
    (batch,) = live.take_batches()
    assert batch.rollout_step == 0 and [g.group_id for g in batch.groups] == ["b"]
    # After a restart: batch 0 is on the output topic ("b" is marked emitted and never re-taken); "a" is replayed.
    rebuilt = GroupSelector("drop", 1, 2)
    rebuilt.mark_step_done(0)
    assert rebuilt.add(group("a", 0, 0, zero=True)).kept is False
    assert rebuilt.take_batches() == [] and rebuilt.dropped == {"a"} and rebuilt.skipped_steps == set()
    # Groups this rollout did not schedule (no train_index) are batched by count in every mode.
    other = GroupSelector("drop", 2, 4)
    for gid in ("x", "y"):
        other.add(GroupResult(gid, [], False, 2, T0))
    assert [[g.group_id for g in b.groups] for b in other.take_batches()] == [["x", "y"]]


def test_settings_selection_alias_and_the_refused_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RolloutSettings().group_selection == "refill"  # the old default (drop_zero_signal_groups=True)
    with capture_logs() as logs:
        assert RolloutSettings(drop_zero_signal_groups=False).group_selection == "off"
        monkeypatch.setenv("FLOE_ROLLOUT_DROP_ZERO_SIGNAL_GROUPS", "true")
        assert RolloutSettings().group_selection == "refill"
        monkeypatch.setenv("FLOE_ROLLOUT_GROUP_SELECTION", "drop")
        assert RolloutSettings().group_selection == "drop"  # the new name wins
    deprecated = [e["name"] for e in logs if e["event"] == "deprecated_setting"]
    assert deprecated == ["drop_zero_signal_groups", *["FLOE_ROLLOUT_DROP_ZERO_SIGNAL_GROUPS"] * 2]
    monkeypatch.delenv("FLOE_ROLLOUT_GROUP_SELECTION")
    monkeypatch.delenv("FLOE_ROLLOUT_DROP_ZERO_SIGNAL_GROUPS")
    with pytest.raises(ValueError, match="stalls the scheduler"):
        RolloutSettings(schedule=True, groups_per_batch=4, groups_per_step=2)
    assert RolloutSettings(schedule=True, groups_per_batch=4, groups_per_step=2, group_selection="drop")
    with pytest.raises(ValueError, match="eval runs only"):
        RunSettings(name="train", every_steps=2)
    monkeypatch.setenv("FLOE_ROLLOUT_MAX_STEPS", "7")
    monkeypatch.setenv("FLOE_ROLLOUT_RUNS", '[{"name": "ev", "kind": "eval", "every_steps": 5, "epochs": 3}]')
    s = RolloutSettings()
    assert s.max_steps == 7 and (s.runs[0].every_steps, s.runs[0].epochs) == (5, 3)


def test_a_run_s_shuffle_seed_reaches_its_spec_and_changes_the_task_order() -> None:
    from rollout.service import run_specs

    spec_a, spec_b, spec_c = run_specs(
        [
            RunSettings(name="a", task_source="count"),
            RunSettings(name="b", task_source="count", shuffle_seed=1),
            RunSettings(name="c", task_source="count", shuffle_seed=1),
        ]
    )
    assert (spec_a.shuffle_seed, spec_b.shuffle_seed) == (0, 1)
    order = [[s.task_for(n) for n in range(len(s.task_ids))] for s in (spec_a, spec_b, spec_c)]
    assert order[0] != order[1] and order[1] == order[2]
    assert sorted(order[0]) == sorted(order[1])  # a permutation of the same tasks
