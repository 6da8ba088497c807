"""Batched sampling: greedy, top-k/top-p filtering, per-request seeds independent of batch composition."""

from __future__ import annotations

import torch

from inference.sampling import SamplingParams, sample_batch


def _logits(rows: int = 3, vocab: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    return logits, torch.log_softmax(logits, dim=-1)


def test_greedy_top_k_1_and_tiny_top_p_pick_the_argmax() -> None:
    logits, raw = _logits()
    params = [
        SamplingParams(max_tokens=1, temperature=0.0),
        SamplingParams(max_tokens=1, top_k=1),
        SamplingParams(max_tokens=1, top_p=1e-6),
    ]
    for u in (0.0, 0.5, 0.999999):
        tokens = sample_batch(logits, raw, params, torch.full((3,), u))
        assert tokens.tolist() == raw.argmax(dim=-1).tolist()


def test_top_k_restricts_support() -> None:
    logits, raw = _logits(rows=1)
    allowed = set(torch.topk(logits[0], 5).indices.tolist())
    seen = {
        int(sample_batch(logits, raw, [SamplingParams(max_tokens=1, top_k=5)], torch.tensor([u / 200]))[0])
        for u in range(200)
    }
    assert seen <= allowed and len(seen) >= 3


def test_sampling_follows_the_distribution() -> None:
    logits, raw = _logits(rows=1, vocab=8)
    probs = torch.softmax(logits[0], dim=-1)
    n = 4000
    us = torch.rand(n, generator=torch.Generator().manual_seed(1))
    counts = torch.zeros(8)
    for u in us:
        counts[int(sample_batch(logits, raw, [SamplingParams(max_tokens=1)], u.view(1))[0])] += 1
    assert torch.allclose(counts / n, probs, atol=0.03)


def test_row_result_depends_only_on_its_own_row_and_uniform() -> None:
    logits, raw = _logits(rows=4)
    params = [SamplingParams(max_tokens=1, temperature=0.8, top_p=0.9, top_k=20)] * 4
    u = torch.tensor([0.1, 0.7, 0.3, 0.9])
    together = sample_batch(logits, raw, params, u)
    alone = [int(sample_batch(logits[i : i + 1], raw[i : i + 1], params[:1], u[i : i + 1])[0]) for i in range(4)]
    assert together.tolist() == alone


def test_mixed_batches_do_not_change_a_rows_sample() -> None:
    logits, raw = _logits(rows=3)
    plain, filtered = SamplingParams(max_tokens=1), SamplingParams(max_tokens=1, top_p=0.8)
    u = torch.tensor([0.42, 0.42, 0.42])
    mixed = sample_batch(logits, raw, [plain, filtered, plain], u).tolist()
    assert mixed[0] == int(sample_batch(logits[:1], raw[:1], [plain], u[:1])[0])
    assert mixed[1] == int(sample_batch(logits[1:2], raw[1:2], [filtered], u[:1])[0])
