"""The recorded harness sessions (``bench/recordings/data``) decode with ``contracts`` and rebuild consistently.

Recordings are real CLIs (pi, Codex, Claude Code, Qwen Code, Gemini CLI, OpenCode, mini-swe-agent) through the real
gateway against a scripted engine behind the real inference app, with the real SmolLM2-135M-Instruct tokenizer and
chat template (``bench/recordings/record.py``). For every session, both trajectory builders must carry exactly the
recorded sampled tokens with their sampling logprobs (token faithfulness), and in exact mode prefix merging must
find every chain the gateway built: zero chain-check failures, except where the harness itself rewrote the model's
previous answer in its history (Claude Code normalises Bash commands and adds ``replace_all`` to Edit calls); such a
break must then lie inside the previous call's sampled completion, never inside a prompt the gateway built.
"""

from __future__ import annotations

import gzip
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import contracts
from contracts import ModelCallRecorded
from rollout.builders import build_trajectories

DATA = Path(__file__).resolve().parents[1] / "bench" / "recordings" / "data"
HARNESSES = ("pi", "codex", "claude-code", "qwen-code", "gemini-cli", "opencode", "mini-swe-agent")
DEV_VOCAB, SMOLLM2_VOCAB = 2048, 49152
FILES = sorted(DATA.glob("*.jsonl.gz"))
# Harnesses that rewrite the model's own previous answer when replaying history (see module docstring).
REWRITES_HISTORY = {"claude-code"}


def _sessions(path: Path) -> list[list[ModelCallRecorded]]:
    by: dict[str, list[ModelCallRecorded]] = defaultdict(list)
    with gzip.open(path, "rb") as fh:
        for line in fh:
            event = contracts.decode(ModelCallRecorded, line)
            by[event.session_id].append(event)
    return [sorted(calls, key=lambda c: c.call_index) for calls in by.values()]


def _sequences(calls: list[ModelCallRecorded]) -> dict[int, list[int]]:
    """call_index -> full prompt + completion, undoing the gateway's delta encoding."""
    prompts = contracts.decode_prompts(calls)
    return {c.call_index: [*p, *c.completion_token_ids] for c, p in zip(calls, prompts, strict=True)}


def test_every_harness_and_mode_is_recorded() -> None:
    names = {p.name for p in FILES}
    assert names == {f"{h}.{m}.jsonl.gz" for h in HARNESSES for m in ("exact", "canonical")}
    assert sum(p.stat().st_size for p in FILES) < 5 * 1024 * 1024


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_builders_carry_the_same_sampled_tokens(path: Path) -> None:
    harness, mode = path.name.split(".")[:2]
    sessions = _sessions(path)
    assert len(sessions) >= 3
    for calls in sessions:
        assert len(calls) >= 5, "a multi-turn session"
        assert [c.call_index for c in calls] == list(range(len(calls)))
        assert all(c.tokenization.value == mode for c in calls)
        # The real tokenizer's ids (the first recordings used the 2048-id dev tokenizer).
        top = max(t for c in calls for t in [*c.prompt_token_ids, *c.completion_token_ids])
        assert DEV_VOCAB <= top < SMOLLM2_VOCAB
        _sequences(calls)
        recorded = Counter(
            (t, lp) for c in calls for t, lp in zip(c.completion_token_ids, c.completion_logprobs, strict=True)
        )
        carried = {}
        for builder in ("per_request", "prefix_merging"):
            result = build_trajectories(calls, builder)
            carried[builder] = Counter(
                (tok, lp)
                for trace in result.traces
                for tok, lp, m in zip(trace.tokens, trace.logprobs, trace.loss_mask, strict=True)
                if m
            )
        assert carried["per_request"] == carried["prefix_merging"] == recorded, (harness, mode)


@pytest.mark.parametrize("path", [p for p in FILES if ".exact." in p.name], ids=lambda p: p.name)
def test_exact_mode_merges_without_chain_failures(path: Path) -> None:
    harness = path.name.split(".")[0]
    for calls in _sessions(path):
        result = build_trajectories(calls, "prefix_merging")
        seq = _sequences(calls)
        by_index = {c.call_index: c for c in calls}
        rewritten = 0
        for c in calls:
            parent = c.prefix_call_index
            if parent is None or c.prefix_len >= len(seq[parent]):
                continue
            if c.prefix_len <= 64:  # a new conversation (side call, sub-agent) sharing only the template start
                continue
            # The call continues ``parent`` but not all of its sampled answer: the harness changed that answer.
            assert c.prefix_len >= by_index[parent].prompt_len, (harness, c.call_index)
            rewritten += 1
        if harness in REWRITES_HISTORY:
            assert result.stats.breaks == rewritten > 0
            assert set(result.stats.break_reasons) == {"exact_not_extended"}
        else:
            assert result.stats.breaks == 0, result.stats.break_reasons
            assert rewritten == 0
        # Side calls and sub-agents are separate conversations; everything else is one chain.
        assert result.stats.chains == len(result.traces) >= 1
