from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from contracts import Event, ModelCallRecorded, Outcome, SessionState, encode_request
from rollout.groups import GroupAssembler

from .simulate import SessionPlan, simulate_group


def _feed(assembler: GroupAssembler, events: list[Event]) -> None:
    for event in events:
        assembler.add(event)


def test_group_waits_for_every_session_then_builds_aligned_rows() -> None:
    events = simulate_group(
        "g1", [SessionPlan(reward=1.0), SessionPlan(reward=0.0), SessionPlan(reward=0.0)], random.Random(0)
    )
    a = GroupAssembler()
    last_reward = events.pop()  # the third session's reward has not arrived yet
    _feed(a, events)
    assert a.ready_groups() == []
    a.add(last_reward)
    assert a.ready_groups() == ["g1"]
    result = a.take("g1")
    assert [s.session_id for s in result.sessions] == ["g1-s0", "g1-s1", "g1-s2"]
    by_session = {s.session_id: s for s in result.sessions}
    assert by_session["g1-s0"].rows[0].advantage > 0 > by_session["g1-s1"].rows[0].advantage
    for s in result.sessions:
        advantages = {row.advantage for row in s.rows}
        assert len(advantages) == 1  # every trace of a session shares its advantage
        assert sum(row.session_weight for row in s.rows) == 1.0 or abs(sum(r.session_weight for r in s.rows) - 1) < 1e-9
    # Late duplicates of an emitted group are ignored.
    _feed(a, events)
    assert a.ready_groups() == [] and a.pending_sessions() == 0


def test_failures_are_masked_but_kept_and_agent_timeouts_train() -> None:
    plans = [
        SessionPlan(reward=1.0),
        SessionPlan(status=SessionState.TIMEOUT, agent_timed_out=True, reward=1.0),
        SessionPlan(status=SessionState.FAILED, reward=0.0, outcome=Outcome.ERROR),
        SessionPlan(reward=0.0, outcome=Outcome.ERROR),
    ]
    a = GroupAssembler(advantage="loo")
    _feed(a, simulate_group("g2", plans, random.Random(1)))
    result = a.take(a.ready_groups()[0])
    s0, s1, s2, s3 = result.sessions
    assert s0.trainable and s1.trainable and not s2.trainable and not s3.trainable
    assert s1.rows[0].reward == 0.0 and s1.rows[0].advantage < 0
    for masked in (s2, s3):
        for row in masked.rows:
            assert not any(row.loss_mask) and row.advantage == 0.0 and row.masked_reason
            assert set(row.weight_versions) <= {-1}
    assert result.trainable_sessions == 2


def test_missing_calls_hold_the_group_until_expired_then_mask() -> None:
    a = GroupAssembler()
    _feed(a, simulate_group("g3", [SessionPlan(), SessionPlan(lose_calls=1, turns=3)], random.Random(2)))
    assert a.ready_groups() == []
    assert a.incomplete_sessions() == ["g3-s1"]
    a.expire("g3-s1")
    result = a.take(a.ready_groups()[0])
    lossy = result.sessions[1]
    assert not lossy.trainable and (lossy.rows[0].masked_reason or "").startswith("calls_missing")
    assert result.zero_signal  # one trainable session left


def test_unknown_group_size_is_released_only_when_forced() -> None:
    events = [
        e
        for e in simulate_group("g4", [SessionPlan(), SessionPlan(reward=0.0)], random.Random(3))
        if type(e).__name__ != "SessionRequested"
    ]
    a = GroupAssembler()
    _feed(a, events)
    assert a.ready_groups() == []
    assert a.ready_groups(force=True) == ["g4"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), shuffle_seed=st.integers(0, 10_000))
def test_rows_do_not_depend_on_event_order_or_redelivery(seed: int, shuffle_seed: int) -> None:
    plans = [SessionPlan(turns=3, reward=float(i % 2)) for i in range(4)]
    events = simulate_group("g5", plans, random.Random(seed))
    a, b = GroupAssembler(), GroupAssembler()
    _feed(a, events)
    shuffled = events + [e for e in events if isinstance(e, ModelCallRecorded)]  # redelivered calls
    random.Random(shuffle_seed).shuffle(shuffled)
    _feed(b, shuffled)
    assert a.ready_groups() == b.ready_groups() == ["g5"]
    assert a.take("g5").rows == b.take("g5").rows


def test_eval_groups_are_marked_eval() -> None:
    from contracts import SessionKind, SessionRequested

    events = simulate_group("g6", [SessionPlan(), SessionPlan(reward=0.0)], random.Random(4))
    events = [e.model_copy(update={"kind": SessionKind.EVAL}) if isinstance(e, SessionRequested) else e for e in events]
    a = GroupAssembler()
    _feed(a, events)
    assert a.take("g6").kind == "eval"
    b = GroupAssembler()
    _feed(b, simulate_group("g7", [SessionPlan(), SessionPlan(reward=0.0)], random.Random(4)))
    assert b.take("g7").kind == "train"


def test_eval_rounds_are_reported_per_round_with_the_versions_that_served_them() -> None:
    from contracts import SessionKind, SessionRequested
    from rollout.metrics import RolloutMetrics

    metrics = RolloutMetrics()
    for gid, rnd, plans in [
        ("ev-0", "0", [SessionPlan(reward=0.0), SessionPlan(reward=0.0)]),
        ("ev-1", "1", [SessionPlan(reward=1.0), SessionPlan(reward=0.0), SessionPlan(status=SessionState.FAILED)]),
        ("ev-2", "1", [SessionPlan(reward=1.0), SessionPlan(reward=1.0)]),
    ]:
        meta = {
            "group_size": str(len(plans)),
            "run": "heldout",
            "eval_round": rnd,
            "eval_at_version": str(5 * int(rnd)),
        }
        events = [
            e.model_copy(update={"kind": SessionKind.EVAL, "metadata": meta}) if isinstance(e, SessionRequested) else e
            for e in simulate_group(gid, plans, random.Random(1))
        ]
        a = GroupAssembler()
        _feed(a, events)
        group = a.take(gid)
        assert group.metadata["eval_round"] == rnd
        metrics.observe_eval(group)
        metrics.observe_eval(group)  # re-taken after a rebuild in the same process: counted once
    rounds = metrics.snapshot()["eval_rounds"]
    assert [(r["run"], r["round"], r["at_version"], r["groups"]) for r in rounds] == [
        ("heldout", 0, 0, 1),
        ("heldout", 1, 5, 2),
    ]
    assert (rounds[0]["sessions"], rounds[0]["mean_reward"], rounds[0]["solved_fraction"]) == (2, 0.0, 0.0)
    # The failed session is masked: left out of the mean and the solved fraction.
    assert (rounds[1]["sessions"], rounds[1]["masked"], rounds[1]["mean_reward"]) == (4, 1, 0.75)
    assert rounds[1]["solved_fraction"] == 0.75
    assert rounds[1]["min_weight_version"] is not None
    assert rounds[1]["min_weight_version"] <= rounds[1]["max_weight_version"]
    text = generate_latest(metrics.registry).decode()
    assert 'floe_rollout_eval_round_solved{round="1",run="heldout"} 0.75' in text


def test_the_export_gets_each_traces_full_request_from_delta_encoded_records() -> None:
    """v2 records carry request deltas; the row's request_json is the last call's whole request, rebuilt."""
    events = simulate_group("g9", [SessionPlan(reward=1.0), SessionPlan(reward=0.0)], random.Random(3))
    fulls: dict[tuple[str, int], dict[str, object]] = {}
    out: list[Event] = []
    for e in events:
        if isinstance(e, ModelCallRecorded):
            full = {
                "messages": [{"role": "user", "content": f"turn {i}"} for i in range(e.call_index + 1)],
                "tools": [{"name": "bash"}],
            }
            base = (e.call_index - 1, fulls[(e.session_id, e.call_index - 1)]) if e.call_index else None
            fulls[(e.session_id, e.call_index)] = full
            d = encode_request(full, base)
            e = e.model_copy(
                update={
                    "request": d.request,
                    "request_base_call_index": d.base_call_index,
                    "request_messages_prefix": d.messages_prefix,
                    "request_same": list(d.same),
                }
            )
            assert e.call_index == 0 or "tools" not in e.request  # what the wire carries is the delta
        out.append(e)
    a = GroupAssembler()
    _feed(a, out)
    result = a.take("g9")
    for s in result.sessions:
        last_index = max(i for sid, i in fulls if sid == s.session_id)
        assert last_index >= 1
        assert [json.loads(x["request_json"]) for x in s.extras][-1] == fulls[(s.session_id, last_index)]


def _with_a_stale_attempt(events: list[Event], supersede: bool) -> list[Event]:
    """``events`` with an attempt at the first session's first call that the gateway could not record durably but
    that landed anyway (a different call id, a different answer), just before the call the harness asked again; the
    call names it in ``supersedes_call_ids`` when ``supersede``."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, ModelCallRecorded) and event.session_id.endswith("s0") and event.call_index == 0:
            n = len(event.completion_token_ids)
            stale = event.model_copy(
                update={"call_id": "stale", "completion_token_ids": [7] * n, "completion_logprobs": [-9.0] * n}
            )
            out.append(stale)
            if supersede:
                event = event.model_copy(update={"supersedes_call_ids": ["stale"]})
        out.append(event)
    return out


@settings(max_examples=10, deadline=None)
@given(shuffle_seed=st.integers(0, 10_000))
def test_an_attempt_that_landed_after_its_record_failed_is_replaced_by_the_call_that_supersedes_it(
    shuffle_seed: int,
) -> None:
    events = simulate_group("g6", [SessionPlan(turns=3, reward=float(i % 2)) for i in range(2)], random.Random(6))
    clean, retried = GroupAssembler(), GroupAssembler()
    _feed(clean, events)
    with_stale = _with_a_stale_attempt(events, supersede=True)
    random.Random(shuffle_seed).shuffle(with_stale)  # in any order, the superseding call wins
    _feed(retried, with_stale)
    assert clean.ready_groups() == retried.ready_groups() == ["g6"]
    assert clean.take("g6").rows == retried.take("g6").rows


def test_two_records_of_one_call_that_do_not_supersede_each_other_mask_the_session() -> None:
    # Before: the first record of an index was kept and the other dropped unseen, so a session could train on an
    # answer its harness never got.
    a = GroupAssembler()
    _feed(a, _with_a_stale_attempt(simulate_group("g7", [SessionPlan(), SessionPlan()], random.Random(7)), False))
    s0 = a.take(a.ready_groups()[0]).sessions[0]
    assert not s0.trainable
    assert all(not any(row.loss_mask) for row in s0.rows)
    assert "recorded twice with different call_id ('" in (s0.rows[0].masked_reason or "")


def test_an_attempt_at_the_call_after_the_last_recorded_one_is_not_trained_on() -> None:
    # The session's last call could not be recorded durably, the harness gave up on it (no call supersedes it) and
    # the session ended DONE with the calls its gateway node recorded; the attempt's record landed anyway.
    events = simulate_group("g8", [SessionPlan(turns=3, reward=1.0), SessionPlan(turns=3)], random.Random(8))
    last = max(
        (e for e in events if isinstance(e, ModelCallRecorded) and e.session_id == "g8-s0"), key=lambda e: e.call_index
    )
    n = len(last.completion_token_ids)
    beyond = last.model_copy(
        update={
            "call_index": last.call_index + 1,
            "call_id": "gave-up",
            "prefix_call_index": last.call_index,
            "prefix_len": last.prompt_len,
            "prompt_token_ids": [],
            "completion_token_ids": [7] * n,
            "completion_logprobs": [-9.0] * n,
        }
    )
    clean, landed = GroupAssembler(), GroupAssembler()
    _feed(clean, events)
    _feed(landed, [*events[:3], beyond, *events[3:]])
    assert clean.ready_groups() == landed.ready_groups() == ["g8"]
    assert clean.take("g8").rows == landed.take("g8").rows
