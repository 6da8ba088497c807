"""Synthetic models and trajectory batches for the learner's tests and benchmarks: no real sessions involved.

A test fixture, so it lives with the tests: ``tests/`` is a package (``from .synthetic import ...``); the benchmarks
under ``bench/learner*`` put this directory on ``sys.path`` and ``import synthetic``.

- ``save_tiny_model``: a random-init Qwen2-style causal LM (fixed seed) saved as safetensors + config.json, so the
  learner can be exercised without downloading anything.
- ``synthetic_sessions``: multi-turn agent sessions made of model calls whose prompts extend each other exactly
  (prompt_i = prompt_{i-1} + completion_{i-1} + tool tokens), with per-token sampling logprobs and versions.
- ``per_request_rows`` / ``prefix_merging_rows``: the two trajectory forms of the same sessions
  (docs/polar-comparison.md, "Per-request traces" and "Prefix merging"): one row per call with its full prompt, or one
  merged row per session chain whose tool/template tokens are masked. Rows are ``contracts.TrajectoryRow``.
- ``masked_micro_batch``: a padded ``learner.data.MicroBatch`` of random ids trained on its completions only.

Limits: token ids and logprobs are random, not sampled from a model; use them for speed and plumbing, never to
claim learning. Chains never break here (real prefix merging may split a session into several chains).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from contracts import TrajectoryRow, group_advantages
from learner.data import MicroBatch

__all__ = [
    "SyntheticCall",
    "masked_micro_batch",
    "per_request_rows",
    "prefix_merging_rows",
    "save_tiny_model",
    "synthetic_sessions",
    "trajectory_row",
]


def save_tiny_model(
    out: Path,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    seed: int = 0,
) -> Path:
    """Save a random-init Qwen2 causal LM to ``out`` (deterministic for a given seed) and return ``out``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    return out


def masked_micro_batch(rows: list[tuple[int, int]], vocab_size: int, holes: bool = False, seed: int = 0) -> MicroBatch:
    """A right-padded micro-batch of random ids, one row per ``(prompt_len, completion_len)``, trained on the
    completion only (as ``data.microbatches`` builds it); ``holes`` also masks every third completion token."""
    gen = torch.Generator().manual_seed(seed)
    b, t = len(rows), max(p + c for p, c in rows)
    ids = torch.zeros(b, t, dtype=torch.int64)
    attention = torch.zeros(b, t, dtype=torch.int64)
    mask = torch.zeros(b, t - 1, dtype=torch.bool)
    for j, (p, c) in enumerate(rows):
        ids[j, : p + c] = torch.randint(2, vocab_size, (p + c,), generator=gen)
        attention[j, : p + c] = 1
        mask[j, p - 1 : p + c - 1] = True  # target i is predicted at position i - 1
        if holes:
            mask[j, p - 1 : p + c - 1 : 3] = False
    weights = mask / mask.sum().clamp(min=1)
    return MicroBatch(
        input_ids=ids,
        attention_mask=attention,
        mask=mask,
        behav_logprobs=torch.where(mask, -1.0, 0.0),
        advantages=torch.ones(b, t - 1),
        weights=weights,
        versions=torch.where(mask, 0, -1),
        num_tokens=int(attention.sum()),
    )


def trajectory_row(
    *,
    session_id: str,
    group_id: str,
    prompt: list[int],
    response: list[int],
    response_mask: list[int],
    response_logprobs: list[float],
    response_versions: list[int],
    reward: float,
    advantage: float,
    trace_index: int = 0,
    num_traces: int = 1,
    builder: str = "per_request",
    status: str = "DONE",
) -> TrajectoryRow:
    """One trajectory row; prompt positions are masked with logprob 0 and version -1."""
    assert len(response) == len(response_mask) == len(response_logprobs) == len(response_versions), "misaligned"
    masked_versions = [v if m else -1 for v, m in zip(response_versions, response_mask, strict=True)]
    masked_lps = [lp if m else 0.0 for lp, m in zip(response_logprobs, response_mask, strict=True)]
    return TrajectoryRow(
        session_id=session_id,
        group_id=group_id,
        task_id=group_id,
        harness="synthetic",
        builder=builder,
        trace_index=trace_index,
        num_traces=num_traces,
        prompt_len=len(prompt),
        tokens=(*prompt, *response),
        loss_mask=(0,) * len(prompt) + tuple(response_mask),
        logprobs=(0.0,) * len(prompt) + tuple(masked_lps),
        weight_versions=(-1,) * len(prompt) + tuple(masked_versions),
        reward=reward,
        advantage=advantage,
        session_weight=1.0 / num_traces,
        status=status,
    )


@dataclass(frozen=True)
class SyntheticCall:
    prompt: list[int]  # full prompt ids of this call
    completion: list[int]
    logprobs: list[float]
    version: int


def synthetic_sessions(
    n_groups: int,
    group_size: int,
    turns: int,
    rng: random.Random,
    vocab_size: int = 64,
    system_len: int = 64,
    completion_len: tuple[int, int] = (8, 32),
    tool_len: tuple[int, int] = (8, 48),
    version: int = 0,
) -> dict[str, tuple[str, float, list[SyntheticCall]]]:
    """``{session_id: (group_id, reward, calls)}`` for ``n_groups`` groups of ``group_size`` multi-turn sessions."""

    def toks(n: int) -> list[int]:
        return [rng.randrange(2, vocab_size) for _ in range(n)]

    out: dict[str, tuple[str, float, list[SyntheticCall]]] = {}
    for g in range(n_groups):
        task = toks(system_len)  # every session of a group starts from the same task prompt
        for i in range(group_size):
            prompt = list(task)
            calls = []
            for _ in range(turns):
                completion = toks(rng.randint(*completion_len))
                lps = [-rng.uniform(0.05, 3.0) for _ in completion]
                calls.append(SyntheticCall(prompt=list(prompt), completion=completion, logprobs=lps, version=version))
                prompt = prompt + completion + toks(rng.randint(*tool_len))
            # Random 0/1 outcomes, but the first two sessions differ so no group has all-zero advantages.
            reward = float(i == 0) if i < 2 else float(rng.random() < 0.5)
            out[f"s{g}-{i}"] = (f"g{g}", reward, calls)
    return out


def per_request_rows(sessions: dict[str, tuple[str, float, list[SyntheticCall]]]) -> list[TrajectoryRow]:
    """One row per call: its full prompt (untrainable) + its completion (trainable)."""
    ids = list(sessions)
    adv = dict(zip(ids, _advantages(sessions), strict=True))
    rows: list[TrajectoryRow] = []
    for sid in ids:
        group, reward, calls = sessions[sid]
        for t, c in enumerate(calls):
            rows.append(
                trajectory_row(
                    session_id=sid,
                    group_id=group,
                    prompt=c.prompt,
                    response=c.completion,
                    response_mask=[1] * len(c.completion),
                    response_logprobs=c.logprobs,
                    response_versions=[c.version] * len(c.completion),
                    reward=reward,
                    advantage=adv[sid],
                    trace_index=t,
                    num_traces=len(calls),
                    builder="per_request",
                )
            )
    return rows


def prefix_merging_rows(sessions: dict[str, tuple[str, float, list[SyntheticCall]]]) -> list[TrajectoryRow]:
    """One row per session chain: first prompt, then completions (trainable) interleaved with the tool/template
    tokens between calls (masked)."""
    ids = list(sessions)
    adv = dict(zip(ids, _advantages(sessions), strict=True))
    rows: list[TrajectoryRow] = []
    for sid in ids:
        group, reward, calls = sessions[sid]
        response: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        versions: list[int] = []
        for t, c in enumerate(calls):
            if t > 0:
                prev = calls[t - 1]
                inter = c.prompt[len(prev.prompt) + len(prev.completion) :]
                response += inter
                mask += [0] * len(inter)
                lps += [0.0] * len(inter)
                versions += [-1] * len(inter)
            response += c.completion
            mask += [1] * len(c.completion)
            lps += c.logprobs
            versions += [c.version] * len(c.completion)
        rows.append(
            trajectory_row(
                session_id=sid,
                group_id=group,
                prompt=calls[0].prompt,
                response=response,
                response_mask=mask,
                response_logprobs=lps,
                response_versions=versions,
                reward=reward,
                advantage=adv[sid],
                builder="prefix_merging",
            )
        )
    return rows


def _advantages(sessions: dict[str, tuple[str, float, list[SyntheticCall]]]) -> list[float]:
    """Leave-one-out advantages per session (in ``sessions`` order), with the rollout's own function."""
    groups: dict[str, list[str]] = {}
    for sid, (group, _, _) in sessions.items():
        groups.setdefault(group, []).append(sid)
    adv: dict[str, float] = {}
    for ids in groups.values():
        values = group_advantages([sessions[s][1] for s in ids], [True] * len(ids), "loo").advantages
        adv.update(zip(ids, values, strict=True))
    return [adv[s] for s in sessions]
