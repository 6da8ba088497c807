"""DashboardState folds events into the numbers the page shows."""

from __future__ import annotations

from contracts import (
    ModelCallRecorded,
    Outcome,
    Protocol,
    RewardPublished,
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


def test_memory_is_bounded() -> None:
    st = DashboardState(max_sessions=5)
    for i in range(50):
        st.apply(_state(f"s{i}", 0, SessionState.PREPARING, SessionState.REQUESTED))
    snap = st.snapshot(recent=100)
    assert len(snap["recent_sessions"]) == 5
    assert sum(snap["sessions_by_state"].values()) == 5
