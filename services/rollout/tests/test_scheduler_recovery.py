"""The scheduler after crashes: state rebuilt from topics read in any order, sessions whose node died."""

from __future__ import annotations

from contracts import SessionCancelRequested, SessionFinished, SessionRequested, SessionState, SessionStateChanged
from rollout.scheduler import RunSpec, Scheduler, SchedulerConfig

T0 = 1_700_000_000_000


def _finish(req: SessionRequested) -> SessionFinished:
    return SessionFinished(
        session_id=req.session_id,
        group_id=req.group_id,
        task_id=req.task_id,
        harness=req.harness,
        node_id="n",
        status=SessionState.DONE,
        calls=1,
    )


def test_rebuild_with_ends_read_before_their_requests_frees_the_groups() -> None:
    live = Scheduler(SchedulerConfig(max_groups_in_flight=2), [RunSpec("train", ("t1", "t2"), group_size=2)])
    reqs = [e for e in live.tick(T0) if isinstance(e, SessionRequested)]
    assert len(reqs) == 4
    # A restarted rollout reads sessions.finished before sessions.requested: every group already ended.
    rebuilt = Scheduler(SchedulerConfig(max_groups_in_flight=2), [RunSpec("train", ("t1", "t2"), group_size=2)])
    for req in reqs:
        rebuilt.observe(_finish(req))
    for req in reqs:
        rebuilt.observe(req)
    assert rebuilt.groups == {}
    fresh = [e for e in rebuilt.tick(T0 + 1) if isinstance(e, SessionRequested)]
    assert len(fresh) == 4 and not {r.group_id for r in fresh} & {r.group_id for r in reqs}


def test_cancelled_sessions_that_never_end_are_closed_after_the_grace_and_free_the_slot() -> None:
    cfg = SchedulerConfig(group_deadline_s=30, cancel_grace_s=20, max_groups_in_flight=1)
    s = Scheduler(cfg, [RunSpec("train", ("t1",), group_size=2, harness="toy", task_source="toy")])
    reqs = [e for e in s.tick(T0) if isinstance(e, SessionRequested)]
    s.observe(_finish(reqs[0]))  # the other session ran on a node that was killed: no end, ever
    cancels = [e for e in s.tick(T0 + 30_000) if isinstance(e, SessionCancelRequested)]
    assert [c.session_id for c in cancels] == [reqs[1].session_id]
    assert s.tick(T0 + 45_000) == []  # within the grace: the node may still answer
    closed = s.tick(T0 + 50_000)
    assert len(closed) == 1 and isinstance(closed[0], SessionFinished)
    end = closed[0]
    assert (end.session_id, end.group_id, end.status) == (reqs[1].session_id, reqs[1].group_id, SessionState.CANCELLED)
    assert (end.task_id, end.harness, end.task_source) == (reqs[1].task_id, "toy", "toy")
    assert s.tick(T0 + 51_000) == []  # closed once, even before our own end comes back from the topic
    s.observe(end)
    assert s.groups == {} and s.counters["closed_unanswered"] == 1
    assert [e for e in s.tick(T0 + 52_000) if isinstance(e, SessionRequested)]  # the slot is free again


def test_a_done_state_without_its_session_finished_is_still_cancelled_and_closed() -> None:
    # A node published the session's DONE state change and was killed before its SessionFinished transaction
    # committed (CI saw this): only SessionFinished ends a session, so the deadline and the grace still apply.
    cfg = SchedulerConfig(group_deadline_s=30, cancel_grace_s=20, max_groups_in_flight=1)
    s = Scheduler(cfg, [RunSpec("train", ("t1",), group_size=2, harness="toy", task_source="toy")])
    reqs = [e for e in s.tick(T0) if isinstance(e, SessionRequested)]
    s.observe(_finish(reqs[0]))
    for seq, state in enumerate((SessionState.RUNNING, SessionState.DONE), start=3):
        s.observe(
            SessionStateChanged(
                session_id=reqs[1].session_id, group_id=reqs[1].group_id, node_id="n", state=state, seq=seq, at=T0
            )
        )
    assert s.snapshot()["sessions_by_state"] == {"DONE": 2}
    cancels = [e for e in s.tick(T0 + 30_000) if isinstance(e, SessionCancelRequested)]
    assert [c.session_id for c in cancels] == [reqs[1].session_id]
    closed = [e for e in s.tick(T0 + 50_000) if isinstance(e, SessionFinished)]
    assert [(e.session_id, e.status) for e in closed] == [(reqs[1].session_id, SessionState.CANCELLED)]
    s.observe(closed[0])
    late = _finish(reqs[1])  # the node's own end, if it ever commits, comes second and is ignored
    s.observe(late)
    assert s.groups == {} and s.counters["groups_done"] == 1


def test_a_rebuilt_scheduler_closes_from_the_cancel_time_on_the_topic() -> None:
    cfg = SchedulerConfig(group_deadline_s=30, cancel_grace_s=20, max_groups_in_flight=1)
    run = RunSpec("train", ("t1",), group_size=1)
    first = Scheduler(cfg, [run])
    reqs = [e for e in first.tick(T0) if isinstance(e, SessionRequested)]
    cancels = first.tick(T0 + 30_000)
    rebuilt = Scheduler(cfg, [run])
    for event in [*cancels, *reqs]:  # cancel read before the request
        rebuilt.observe(event)
    for event in reqs:
        rebuilt.observe(event)
    # The cancel read before its request was not attached; the deadline cancels again, and the grace runs from then.
    again = rebuilt.tick(T0 + 31_000)
    assert [type(e).__name__ for e in again] == ["SessionCancelRequested"]
    closed = rebuilt.tick(T0 + 51_000)
    assert [type(e).__name__ for e in closed] == ["SessionFinished"]


def test_a_group_cut_short_by_a_crash_gets_its_missing_requests_republished() -> None:
    # The rollout died after sending 2 of a group's 4 requests: the rebuilt scheduler sends the other two, with
    # the same ids and fields, once; the group can then complete and free its slot.
    cfg = SchedulerConfig(max_groups_in_flight=1)
    run = RunSpec("train", ("t1", "t2"), group_size=4, harness="toy", task_source="toy")
    sent = [e for e in Scheduler(cfg, [run]).tick(T0) if isinstance(e, SessionRequested)]
    assert len(sent) == 4
    rebuilt = Scheduler(cfg, [run])
    for req in sent[:2]:
        rebuilt.observe(req)
    out = rebuilt.tick(T0 + 5_000)
    assert out == sent[2:], "exactly the missing members, identical to what was meant to be sent"
    assert rebuilt.counters["requests_republished"] == 2
    assert rebuilt.tick(T0 + 6_000) == [], "re-published once; the slot stays taken until the group ends"
    for req in sent:
        rebuilt.observe(_finish(req))
    assert rebuilt.groups == {}
    nxt = [e for e in rebuilt.tick(T0 + 7_000) if isinstance(e, SessionRequested)]
    assert len(nxt) == 4 and nxt[0].task_id == "t2"
