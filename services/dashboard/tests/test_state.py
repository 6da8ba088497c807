"""DashboardState folds events into the numbers the page shows."""

from __future__ import annotations

from contracts import (
    ModelCallRecorded,
    Outcome,
    Protocol,
    RewardPublished,
    SessionKind,
    SessionRequested,
    SessionState,
    SessionStateChanged,
    TokenizationMode,
    TrajectoryBatch,
    TrajectoryRow,
    WeightsPublished,
    to_ipc,
)
from dashboard.state import DashboardState


def _state(sid: str, seq: int, state: SessionState, prev: SessionState | None) -> SessionStateChanged:
    return SessionStateChanged(session_id=sid, group_id="g", node_id="n", state=state, previous=prev, seq=seq)


def _call(sid: str, idx: int, version: int, at: int = 0) -> ModelCallRecorded:
    return ModelCallRecorded(
        session_id=sid,
        call_index=idx,
        call_id=f"{sid}-{idx}",
        protocol=Protocol.OPENAI_CHAT,
        tokenization=TokenizationMode.EXACT,
        model="m",
        weight_version=version,
        prompt_token_ids=[1, 2],
        prompt_len=2,
        completion_token_ids=[3],
        completion_logprobs=[-0.1],
        finish_reason="stop",
        started_at=at,
    )


def _row(sid: str, trace: int, n_traces: int, reward: float, harness: str) -> TrajectoryRow:
    return TrajectoryRow(
        session_id=sid,
        group_id="g",
        task_id="t",
        harness=harness,
        builder="prefix_merging",
        trace_index=trace,
        num_traces=n_traces,
        prompt_len=2,
        tokens=(1, 2, 3, 4),
        loss_mask=(0, 0, 1, 1),
        logprobs=(0.0, 0.0, -0.1, -0.2),
        weight_versions=(-1, -1, 1, 1),
        reward=reward,
        advantage=0.0,
        session_weight=1.0 / n_traces,
        status="DONE",
    )


def test_states_count_latest_and_ignore_stale_duplicates() -> None:
    st = DashboardState()
    st.apply(_state("a", 0, SessionState.PREPARING, SessionState.REQUESTED))
    st.apply(_state("a", 1, SessionState.READY, SessionState.PREPARING))
    st.apply(_state("b", 0, SessionState.PREPARING, SessionState.REQUESTED))
    st.apply(_state("a", 0, SessionState.PREPARING, SessionState.REQUESTED))  # redelivered: must not go back
    snap = st.snapshot()
    assert snap["sessions_by_state"]["READY"] == 1
    assert snap["sessions_by_state"]["PREPARING"] == 1
    assert snap["ready_depth"] == 1
    assert sum(snap["sessions_by_state"].values()) == 2


def test_rewards_per_step_chain_breaks_and_staleness() -> None:
    st = DashboardState()
    st.apply(_call("a", 0, 3, at=2000))
    st.apply(_call("a", 1, 1, at=3000))
    st.apply(_call("a", 1, 1, at=3000))  # duplicate call id: counted once
    st.apply(_call("a", 2, 1, at=500))  # started before version 3 existed: not stale
    # consumed after the calls, but published before two of them: staleness is by event time
    st.apply(
        WeightsPublished(
            version=3, uri="file:///c", step=3, metrics={"loss": 0.5, "tokens_per_s": 100.0}, published_at=1000
        )
    )
    rows = [_row("a", 0, 2, 1.0, "pi"), _row("a", 1, 2, 1.0, "pi"), _row("b", 0, 1, 0.0, "codex")]
    ipc = to_ipc(rows)
    st.apply(
        TrajectoryBatch(
            batch_id="b1",
            step=4,
            num_rows=3,
            num_groups=1,
            num_sessions=2,
            builder="prefix_merging",
            min_weight_version=1,
            max_weight_version=3,
            size_bytes=len(ipc),
            arrow_ipc=ipc,
        )
    )
    st.apply(
        RewardPublished(session_id="a", group_id="g", task_id="t", reward=1.0, outcome=Outcome.RESOLVED, resolved=True)
    )
    snap = st.snapshot()
    assert snap["reward_per_step"] == [{"step": 4, "sessions": 2, "reward_mean": 0.5}]
    assert snap["harness"]["pi"]["chain_breaks_per_session"] == 1.0
    assert snap["harness"]["codex"]["chain_breaks_per_session"] == 0.0
    assert snap["harness"]["pi"]["trainable_fraction"] == 0.5
    assert snap["staleness"] == {"0": 2, "2": 1}
    assert snap["weight_version"] == 3
    recent = {s["session_id"]: s for s in snap["recent_sessions"]}
    assert [c["index"] for c in recent["a"]["calls"]] == [0, 1, 2]
    assert recent["a"]["reward"] == 1.0


def test_a_call_asked_again_replaces_the_attempts_it_supersedes_in_either_order() -> None:
    stale = _call("a", 0, 1).model_copy(update={"call_id": "a-0-stale"})
    again = _call("a", 0, 1).model_copy(update={"supersedes_call_ids": ["a-0-stale"]})
    for order in ([stale, again, _call("a", 1, 1)], [again, _call("a", 1, 1), stale]):
        st = DashboardState()
        for event in order:
            st.apply(event)
        (a,) = st.snapshot()["recent_sessions"]
        assert [(c["index"], c["call_id"]) for c in a["calls"]] == [(0, "a-0"), (1, "a-1")]
        assert sum(st.snapshot()["staleness"].values()) == 2, "the attempt the harness never got is not a call"


def test_memory_is_bounded() -> None:
    st = DashboardState(max_sessions=5)
    for i in range(50):
        st.apply(_state(f"s{i}", 0, SessionState.PREPARING, SessionState.REQUESTED))
    snap = st.snapshot(recent=100)
    assert len(snap["recent_sessions"]) == 5
    assert sum(snap["sessions_by_state"].values()) == 5


def _request(sid: str, kind: SessionKind, **meta: str) -> SessionRequested:
    return SessionRequested(session_id=sid, group_id="g", task_id="t", harness="h", kind=kind, metadata=meta)


def _reward(sid: str, reward: float, outcome: Outcome = Outcome.RESOLVED) -> RewardPublished:
    return RewardPublished(
        session_id=sid, group_id="g", task_id="t", reward=reward, outcome=outcome, resolved=outcome is Outcome.RESOLVED
    )


def test_eval_rounds_join_requests_rewards_and_calls_in_any_order() -> None:
    st = DashboardState(max_early=100)
    st.apply(_reward("e0", 1.0))  # the reward and the call come before the request (topics in no order)
    st.apply(_call("e0", 0, 0))
    st.apply(_request("e0", SessionKind.EVAL, run="heldout", eval_round="0", eval_at_version="0"))
    st.apply(_request("e1", SessionKind.EVAL, run="heldout", eval_round="0", eval_at_version="0"))
    st.apply(_reward("e1", 0.0, Outcome.UNRESOLVED))
    st.apply(_request("e2", SessionKind.EVAL, run="heldout", eval_round="1", eval_at_version="5"))
    st.apply(_call("e2", 0, 5))
    st.apply(_call("e2", 1, 6))
    st.apply(_reward("e2", 1.0))
    st.apply(_request("e3", SessionKind.EVAL, run="heldout", eval_round="1", eval_at_version="5"))
    st.apply(_reward("e3", 0.0, Outcome.ERROR))  # infrastructure: not scored
    st.apply(_request("e2", SessionKind.EVAL, run="heldout", eval_round="1", eval_at_version="5"))  # redelivered
    st.apply(_request("t0", SessionKind.TRAIN))
    st.apply(_reward("t0", 1.0))
    rounds = st.snapshot()["eval_rounds"]
    assert [(r["round"], r["at_version"], r["sessions"], r["scored"]) for r in rounds] == [(0, 0, 2, 2), (1, 5, 2, 1)]
    assert (rounds[0]["mean_reward"], rounds[0]["solved_fraction"]) == (0.5, 0.5)
    assert (rounds[0]["min_weight_version"], rounds[0]["max_weight_version"]) == (0, 0)
    r1 = rounds[1]
    assert (r1["solved_fraction"], r1["min_weight_version"], r1["max_weight_version"]) == (1.0, 5, 6)
    assert "t0" not in st._early  # a known train session is not buffered

    bounded = DashboardState(max_early=3)
    for i in range(10):
        bounded.apply(_reward(f"x{i}", 1.0))
    assert len(bounded._early) == 3


def test_dropped_groups_are_read_from_batch_metrics_once_per_batch() -> None:
    def batch(bid: str, step: int, dropped: float, total: float, inline: bool) -> TrajectoryBatch:
        ipc = to_ipc([_row("a", 0, 1, 1.0, "pi")]) if inline else None
        return TrajectoryBatch(
            batch_id=bid,
            step=step,
            num_rows=1,
            num_groups=2,
            num_sessions=1,
            builder="prefix_merging",
            min_weight_version=0,
            max_weight_version=0,
            size_bytes=0,
            arrow_ipc=ipc,
            uri=None if inline else "file:///claims/x.arrow",
            sha256=None if inline else "0" * 64,
            metrics={"groups.dropped_zero_signal": dropped, "groups.dropped_zero_signal_total": total},
        )

    st = DashboardState()
    st.apply(batch("b0", 0, 2, 2, inline=True))
    st.apply(batch("b0", 0, 2, 2, inline=True))  # redelivered
    st.apply(batch("b1", 1, 1, 3, inline=False))  # claim-checked: its metrics still count
    sel = st.snapshot()["selection"]
    assert sel["groups_dropped_zero_signal"] == 3
    assert sel["per_batch"] == [{"step": 0, "groups": 2, "dropped": 2}, {"step": 1, "groups": 2, "dropped": 1}]
