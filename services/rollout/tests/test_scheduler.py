from __future__ import annotations

from collections.abc import Sequence

from contracts import (
    SessionCancelRequested,
    SessionFinished,
    SessionKind,
    SessionRequested,
    SessionState,
    WeightsPublished,
)
from rollout.scheduler import RunSpec, Scheduler, SchedulerConfig

T0 = 1_700_000_000_000


def _finish(req: SessionRequested, status: SessionState = SessionState.DONE, calls: int = 3) -> SessionFinished:
    return SessionFinished(
        session_id=req.session_id,
        group_id=req.group_id,
        task_id=req.task_id,
        harness=req.harness,
        node_id="n",
        status=status,
        calls=calls,
    )


def _requests(events: Sequence[object]) -> list[SessionRequested]:
    return [e for e in events if isinstance(e, SessionRequested)]


def test_admission_is_bounded_by_groups_in_flight_and_weight_lag() -> None:
    cfg = SchedulerConfig(max_groups_in_flight=100, max_off_policy_steps=1, groups_per_step=2)
    s = Scheduler(cfg, [RunSpec("train", ("t1", "t2", "t3"), group_size=2)])
    reqs = _requests(s.tick(T0))
    # steps 0 and 1 are admissible at learner version 0 (2 groups each) -> 4 groups, 8 sessions
    assert len(reqs) == 8 and len({r.group_id for r in reqs}) == 4
    assert {r.rollout_step for r in reqs} == {0, 1} and all(r.metadata["group_size"] == "2" for r in reqs)
    assert _requests(s.tick(T0 + 1)) == []
    s.observe(WeightsPublished(version=1, uri="/w/1", step=1))
    more = _requests(s.tick(T0 + 2))
    assert len(more) == 4 and {r.rollout_step for r in more} == {2} and {r.policy_version for r in more} == {1}
    # Tasks cycle through the task list (shuffled per epoch, deterministic).
    firsts = sorted((r.group_id, r.task_id) for r in reqs + more if r.session_id.endswith("-00"))
    assert {task for _, task in firsts[:3]} == {"t1", "t2", "t3"}

    tight = Scheduler(
        SchedulerConfig(max_groups_in_flight=1, max_off_policy_steps=99), [RunSpec("train", ("t1",), group_size=2)]
    )
    first = _requests(tight.tick(T0))
    assert len(first) == 2 and _requests(tight.tick(T0)) == []
    for r in first:
        tight.observe(r)
        tight.observe(_finish(r))
    assert len(_requests(tight.tick(T0))) == 2  # the finished group freed its slot


def test_eval_runs_take_priority_and_are_not_lag_bound() -> None:
    cfg = SchedulerConfig(max_groups_in_flight=2, max_off_policy_steps=0, groups_per_step=1)
    s = Scheduler(
        cfg,
        [
            RunSpec("train", ("t1",), group_size=1),
            RunSpec("eval", ("e1", "e2", "e3"), group_size=1, kind=SessionKind.EVAL),
        ],
    )
    reqs = _requests(s.tick(T0))
    assert [r.task_id for r in reqs] == ["e1", "e2"] and all(r.priority == 100 for r in reqs)
    for r in reqs:
        s.observe(_finish(r))
    reqs = _requests(s.tick(T0))
    assert [r.task_id for r in reqs] == ["e3", "t1"]
    s.observe(_finish(reqs[0]))
    s.observe(_finish(reqs[1]))
    assert _requests(s.tick(T0)) == []  # eval exhausted (one pass); train blocked by lag 0 until version 1


def test_straggler_cut_off_and_group_deadline_cancel_only_open_sessions_once() -> None:
    cfg = SchedulerConfig(min_usable_fraction=0.5, group_deadline_s=60, max_groups_in_flight=1)
    s = Scheduler(cfg, [RunSpec("train", ("t1",), group_size=4)])
    reqs = _requests(s.tick(T0))
    s.observe(_finish(reqs[0]))
    assert [e for e in s.tick(T0) if isinstance(e, SessionCancelRequested)] == []
    s.observe(_finish(reqs[1], SessionState.FAILED))  # not usable
    assert [e for e in s.tick(T0) if isinstance(e, SessionCancelRequested)] == []
    s.observe(_finish(reqs[2]))
    cancels = [e for e in s.tick(T0) if isinstance(e, SessionCancelRequested)]
    assert [c.session_id for c in cancels] == [reqs[3].session_id] and cancels[0].reason == "straggler"
    assert [e for e in s.tick(T0) if isinstance(e, SessionCancelRequested)] == []

    d = Scheduler(SchedulerConfig(group_deadline_s=60), [RunSpec("train", ("t1",), group_size=2)])
    dreqs = _requests(d.tick(T0))
    d.observe(_finish(dreqs[0]))
    assert [e for e in d.tick(T0 + 59_000) if isinstance(e, SessionCancelRequested)] == []
    late = [e for e in d.tick(T0 + 60_000) if isinstance(e, SessionCancelRequested)]
    assert [c.session_id for c in late if c.group_id == dreqs[0].group_id] == [dreqs[1].session_id]
    assert late[0].reason == "group_deadline"


def test_state_is_rebuilt_from_the_topics_after_a_restart() -> None:
    cfg = SchedulerConfig(max_groups_in_flight=2, max_off_policy_steps=5)
    first = Scheduler(cfg, [RunSpec("train", ("t1", "t2"), group_size=2)])
    published = first.tick(T0)
    finished = [_finish(r) for r in _requests(published)[:2]]
    restarted = Scheduler(cfg, [RunSpec("train", ("t1", "t2"), group_size=2)])
    for event in [*published, *finished]:
        restarted.observe(event)
    again = _requests(restarted.tick(T0))
    # One group ended, so exactly one new group, with a fresh id (never a re-request of an existing one).
    assert len(again) == 2
    assert {r.group_id for r in again}.isdisjoint({r.group_id for r in _requests(published)})
    assert restarted.snapshot()["groups_in_flight"] == 2


def test_periodic_eval_rounds_wait_for_their_version_and_say_which_round_they_are() -> None:
    cfg = SchedulerConfig(max_groups_in_flight=10, max_off_policy_steps=0, groups_per_step=1)
    runs = [
        RunSpec("train", ("t1",), group_size=1),
        RunSpec("eval", ("e1", "e2"), group_size=2, kind=SessionKind.EVAL, every_steps=2, epochs=3),
    ]
    s = Scheduler(cfg, runs)

    def drain(now: int) -> list[SessionRequested]:
        reqs = _requests(s.tick(now))
        for r in reqs:
            s.observe(_finish(r))
        return reqs

    first = drain(T0)
    evals = [r for r in first if r.kind is SessionKind.EVAL]
    assert sorted({r.task_id for r in evals}) == ["e1", "e2"] and len(evals) == 4
    assert all(r.priority == 100 and r.metadata["eval_round"] == "0" for r in evals)
    assert all(r.metadata["eval_at_version"] == "0" for r in evals)
    assert [r.rollout_step for r in first if r.kind is SessionKind.TRAIN] == [0]
    s.observe(WeightsPublished(version=1, uri="/w/1", step=1))
    assert [r.kind for r in drain(T0 + 1)] == [SessionKind.TRAIN]  # round 1 waits for version 2
    s.observe(WeightsPublished(version=2, uri="/w/2", step=2))
    second = drain(T0 + 2)
    assert [r.kind for r in second][:4] == [SessionKind.EVAL] * 4  # eval first: it keeps its priority
    assert {(r.metadata["eval_round"], r.metadata["eval_at_version"]) for r in second[:4]} == {("1", "2")}

    # A restart rebuilt from the published requests: round 1 is not admitted again, round 2 waits for version 4.
    rebuilt = Scheduler(cfg, runs)
    for r in [*first, *second]:
        rebuilt.observe(r)
        rebuilt.observe(_finish(r))
    rebuilt.observe(WeightsPublished(version=3, uri="/w/3", step=3))
    assert {r.kind for r in _requests(rebuilt.tick(T0 + 3))} == {SessionKind.TRAIN}
    rebuilt.observe(WeightsPublished(version=9, uri="/w/9", step=9))  # the learner ran ahead: round 2 goes at once
    late = [r for r in _requests(rebuilt.tick(T0 + 4)) if r.kind is SessionKind.EVAL]
    assert len(late) == 4 and {r.metadata["eval_round"] for r in late} == {"2"} and late[0].policy_version == 9
    for r in late:
        rebuilt.observe(_finish(r))
    assert not [r for r in _requests(rebuilt.tick(T0 + 5)) if r.kind is SessionKind.EVAL]  # three rounds: done
    assert rebuilt.snapshot()["runs"]["eval"] == {"groups_admitted": 6, "rounds_started": 3}


def test_max_steps_stops_train_admission_but_not_eval() -> None:
    cfg = SchedulerConfig(max_groups_in_flight=100, max_off_policy_steps=99, groups_per_step=2, max_steps=2)
    s = Scheduler(
        cfg,
        [
            RunSpec("train", ("t1", "t2"), group_size=1),
            RunSpec("eval", ("e1",), group_size=1, kind=SessionKind.EVAL, every_steps=2, epochs=2),
        ],
    )
    reqs = _requests(s.tick(T0))
    train = [r for r in reqs if r.kind is SessionKind.TRAIN]
    assert sorted(r.rollout_step for r in train) == [0, 0, 1, 1] and s.train_done
    assert s.snapshot()["train_done"] is True
    s.observe(WeightsPublished(version=2, uri="/w/2", step=2))
    after = _requests(s.tick(T0 + 1))
    assert [(r.kind, r.metadata.get("eval_round")) for r in after] == [(SessionKind.EVAL, "1")]


def test_refill_and_skipped_steps_move_the_step_accounting() -> None:
    cfg = SchedulerConfig(max_groups_in_flight=100, max_off_policy_steps=0, groups_per_step=2, max_steps=2)
    s = Scheduler(cfg, [RunSpec("train", ("t1",), group_size=1)])
    step0 = _requests(s.tick(T0))
    assert [r.metadata["train_index"] for r in step0] == ["0", "1"] and _requests(s.tick(T0)) == []
    for r in step0:
        s.observe(_finish(r))
    s.group_dropped(1)  # refill: the second group had no signal, so step 0 has room for one more
    (replacement,) = _requests(s.tick(T0 + 1))
    assert (replacement.rollout_step, replacement.metadata["train_index"]) == (0, "2")
    assert s.next_step == 1 and _requests(s.tick(T0 + 2)) == []  # step 1 waits for version 1
    s.step_skipped(0)  # (drop: no version will come for step 0)
    step1 = _requests(s.tick(T0 + 3))
    assert [r.rollout_step for r in step1] == [1, 1] and s.train_done
    snap = s.snapshot()
    assert (snap["train_groups_dropped"], snap["steps_skipped"], snap["steps_done"]) == (1, [0], 1)
