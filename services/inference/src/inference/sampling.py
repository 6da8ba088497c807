"""Token sampling for one row of logits: temperature, top-k, top-p, seeded generators.

Role: pick the next token and report the logprob that the *policy* assigned to it. Logprobs are the raw model
distribution (``log_softmax`` of the float32 logits, before temperature/top-k/top-p), which is vLLM's default
``--logprobs-mode raw_logprobs`` and exactly what a teacher-forced forward pass recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SamplingParams", "sample_batch"]


@dataclass(frozen=True)
class SamplingParams:
    """Engine-level sampling parameters (already validated and defaulted by the API layer)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; 0: the sampled token's logprob only; k: plus the k most likely tokens.
    logprobs: int | None = None
    extra: dict[str, object] = field(default_factory=dict)


def sample_batch(
    logits: torch.Tensor, raw_logprobs: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor
) -> torch.Tensor:
    """Sample one token per row of ``(B, V)`` float32 logits; returns ``(B,)`` token ids.

    Each row draws with its own uniform number (``uniforms[i]``, taken from the request's seeded generator), by
    inverse-CDF over its filtered distribution, so a seeded request gives the same tokens whatever it is batched
    with. Temperature <= 0 is greedy. Top-k keeps the k highest scores; top-p keeps the smallest prefix of the sorted
    distribution whose mass reaches p (the most likely token always stays).
    """
    bsz, vocab = logits.shape
    temps = torch.tensor([max(p.temperature, 1e-6) for p in params], dtype=logits.dtype)
    scores = logits / temps[:, None]
    # Rows without top-k/top-p sample in token-id order; rows with filtering in descending-probability order (sorting
    # (B, V) is the costliest op here, so only those rows pay for it). Each row's order depends on its own parameters
    # only, so a seeded request samples the same tokens whatever it is batched with.
    order = torch.arange(vocab).repeat(bsz, 1)  # (B, V)
    probs = torch.softmax(scores, dim=-1)
    filtered = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
    if filtered:
        rows = torch.tensor(filtered)
        sorted_scores, sorted_order = torch.sort(scores[rows], dim=-1, descending=True)
        rank = torch.arange(vocab)[None, :]
        top_k = torch.tensor([params[i].top_k if 0 < params[i].top_k < vocab else vocab for i in filtered])
        sorted_scores = sorted_scores.masked_fill(rank >= top_k[:, None], float("-inf"))
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        top_p = torch.tensor([params[i].top_p for i in filtered], dtype=probs.dtype)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        probs[rows] = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)
        order[rows] = sorted_order
    cdf = probs.cumsum(dim=-1)  # (B, V), unnormalised
    target = uniforms.to(cdf.dtype) * cdf[:, -1]
    picked = torch.searchsorted(cdf, target[:, None], right=True).clamp(max=vocab - 1)  # (B, 1)
    # right=True never lands on a zero-probability slot (plateaus of the CDF); clamp covers rounding at u -> 1.
    tokens = order.gather(1, picked).squeeze(1)
    greedy = torch.tensor([p.temperature <= 0.0 for p in params])
    if bool(greedy.any()):
        tokens = torch.where(greedy, raw_logprobs.argmax(dim=-1), tokens)
    assert tokens.shape == (bsz,)
    return tokens
