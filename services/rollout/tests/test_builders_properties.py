"""Property tests of the trajectory builders over generated sessions (compaction, sub-agents, truncated turns,
re-tokenized and re-serialized histories, in-flight weight updates), in both tokenization modes."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import ModelCallRecorded, TokenizationMode
from rollout.builders import build_trajectories
from rollout.trace import BuildResult

from .simulate import EOT, GEN_PROMPT, NEWLINE, Compact, Op, RewriteOld, SpawnSub, Turn, simulate_session

turns = st.builds(
    Turn,
    agent=st.integers(0, 3),
    out_len=st.integers(0, 12),
    finish=st.sampled_from(["stop", "tool_calls", "length"]),
    tool_len=st.integers(0, 10),
    retok=st.booleans(),
    reserialize=st.booleans(),
    weight_bump=st.booleans(),
)
ops_strategy = st.lists(
    st.one_of(
        turns,
        turns,
        turns,
        st.builds(Compact, agent=st.integers(0, 3), summary_len=st.integers(0, 6)),
        st.builds(SpawnSub, task_len=st.integers(1, 6)),
        st.builds(RewriteOld, agent=st.integers(0, 3)),
    ),
    min_size=0,
    max_size=30,
)
modes = st.sampled_from([TokenizationMode.EXACT, TokenizationMode.CANONICAL])
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _session(ops: list[Op], mode: TokenizationMode, seed: int, delta: bool = True) -> list[ModelCallRecorded]:
    return simulate_session("s-prop", ops, mode, random.Random(seed), delta=delta)


def _sampled(calls: list[ModelCallRecorded]) -> dict[int, list[tuple[int, float, int]]]:
    return {
        c.call_index: [
            (t, lp, c.weight_version) for t, lp in zip(c.completion_token_ids, c.completion_logprobs, strict=True)
        ]
        for c in calls
    }


def _trainable(result: BuildResult) -> list[tuple[int, float, int]]:
    out = []
    for trace in result.traces:
        for t, m, lp, v in zip(trace.tokens, trace.loss_mask, trace.logprobs, trace.weight_versions, strict=True):
            if m:
                out.append((t, lp, v))
    return out


def _check_faithful(result: BuildResult, calls: list[ModelCallRecorded]) -> None:
    sampled = _sampled(calls)
    seen: list[int] = []
    for trace in result.traces:
        trainable = [
            (t, lp, v)
            for t, m, lp, v in zip(trace.tokens, trace.loss_mask, trace.logprobs, trace.weight_versions, strict=True)
            if m
        ]
        # Trainable positions are exactly the sampled tokens of this trace's calls, in order, with their sampling
        # logprobs and weight versions; masked positions carry logprob 0 and version -1.
        assert trainable == [x for i in trace.call_indices for x in sampled[i]]
        for m, lp, v in zip(trace.loss_mask, trace.logprobs, trace.weight_versions, strict=True):
            if not m:
                assert lp == 0.0 and v == -1
        assert not any(trace.loss_mask[: trace.prompt_len])
        seen.extend(trace.call_indices)
    # No call dropped, none duplicated.
    assert sorted(seen) == [c.call_index for c in calls]


@PROPS
@given(ops=ops_strategy, mode=modes, seed=st.integers(0, 2**16), delta=st.booleans())
def test_every_trainable_token_is_sampled_with_its_logprob(
    ops: list[Op], mode: TokenizationMode, seed: int, delta: bool
) -> None:
    calls = _session(ops, mode, seed, delta)
    for builder in ("per_request", "prefix_merging"):
        _check_faithful(build_trajectories(calls, builder), calls)


@PROPS
@given(ops=ops_strategy, mode=modes, seed=st.integers(0, 2**16))
def test_builders_carry_the_same_multiset_of_sampled_tokens(ops: list[Op], mode: TokenizationMode, seed: int) -> None:
    calls = _session(ops, mode, seed)
    per_request = build_trajectories(calls, "per_request")
    merged = build_trajectories(calls, "prefix_merging")
    assert Counter(_trainable(per_request)) == Counter(_trainable(merged))
    assert per_request.stats.trainable_tokens == merged.stats.trainable_tokens
    assert merged.stats.chains <= per_request.stats.chains
    assert merged.stats.total_tokens <= per_request.stats.total_tokens
    # Every call either merged or opened a chain.
    s = merged.stats
    assert s.merged + s.unmatched + s.breaks == s.calls == len(calls)
    assert s.unmatched + s.breaks == s.chains


@PROPS
@given(ops=ops_strategy, seed=st.integers(0, 2**16))
def test_exact_mode_merges_without_check_failures_and_context_is_what_was_sampled(ops: list[Op], seed: int) -> None:
    calls = _session(ops, TokenizationMode.EXACT, seed)
    result = build_trajectories(calls, "prefix_merging")
    assert result.stats.breaks == 0, result.stats.break_reasons
    by_index = {i: (p, c) for i, p, c in build_full_prompts(calls)}
    for trace in result.traces:
        # Walk the trace: just before each call's sampled tokens, the trace's tokens are exactly that call's prompt,
        # i.e. the trainer rebuilds precisely the context the model was conditioned on.
        pos = trace.prompt_len
        mask = trace.loss_mask
        for i in trace.call_indices:
            prompt, completion = by_index[i]
            while pos < len(mask) and not mask[pos]:
                pos += 1
            if completion:
                assert trace.tokens[:pos] == prompt
            pos += len(completion)


@PROPS
@given(ops=ops_strategy, seed=st.integers(0, 2**16))
def test_canonical_mode_with_known_eot_never_breaks_on_ordinary_histories(ops: list[Op], seed: int) -> None:
    calls = _session(ops, TokenizationMode.CANONICAL, seed)
    result = build_trajectories(calls, "prefix_merging", eot_token_ids={EOT})
    assert result.stats.breaks == 0, result.stats.break_reasons
    _check_faithful(result, calls)


def _check_turn_boundaries(result: BuildResult, calls: list[ModelCallRecorded]) -> None:
    """Every merge is an exact extension or follows the end-of-turn rule.

    Exact extension: the call's prompt continues the previous prompt with the previous *sampled* answer (the trainer
    sees what the model saw). Otherwise, against the simulator's ChatML rendering: after the previous sampled answer
    comes exactly one end-of-turn token (sampled, or inserted masked after a truncated answer), then the template's
    newline; every later answer is preceded by the generation prompt."""
    completions = {c.call_index: tuple(c.completion_token_ids) for c in calls}
    prompts = {i: p for i, p, _ in build_full_prompts(calls)}
    for trace in result.traces:
        starts: list[int] = []
        pos = trace.prompt_len
        for i in trace.call_indices:
            while pos < len(trace.tokens) and not trace.loss_mask[pos]:
                pos += 1
            starts.append(pos)
            assert trace.tokens[pos : pos + len(completions[i])] == completions[i]
            pos += len(completions[i])
        for n in range(1, len(trace.call_indices)):
            i, prev = trace.call_indices[n], trace.call_indices[n - 1]
            start = starts[n]
            assert trace.tokens[start - len(GEN_PROMPT) : start] == GEN_PROMPT
            base = len(prompts[prev])
            if prompts[i][base : base + len(completions[prev])] == completions[prev]:
                continue  # merged by exact extension: locally, the trace is the prompt the model saw
            end = starts[n - 1] + len(completions[prev])
            expected = (NEWLINE,) if completions[prev][-1:] == (EOT,) else (EOT, NEWLINE)
            assert trace.tokens[end : end + len(expected)] == expected
            assert not any(trace.loss_mask[end : end + len(expected)])


@PROPS
@given(ops=ops_strategy, mode=modes, seed=st.integers(0, 2**16))
def test_prefix_merging_closes_each_turn_with_exactly_one_end_of_turn(
    ops: list[Op], mode: TokenizationMode, seed: int
) -> None:
    calls = [c for c in _session(ops, mode, seed)]
    _check_turn_boundaries(build_trajectories(calls, "prefix_merging", eot_token_ids={EOT}), calls)
    # Auto-detected end-of-turn id gives the same traces whenever some answer stopped on its own.
    if any(c.finish_reason != "length" and c.completion_token_ids for c in calls):
        assert build_trajectories(calls, "prefix_merging") == build_trajectories(
            calls, "prefix_merging", eot_token_ids={EOT}
        )


def build_full_prompts(calls: list[ModelCallRecorded]) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    from rollout.calls import decode_calls

    return [(d.call_index, d.prompt, d.completion) for d in decode_calls(calls)]
