"""The GRPO policy loss, aggregation weights and the staleness filter: pure functions, CPU-tested.

Everything here works on flat per-token tensors (one entry per *target* token of a packed micro-batch) and has no
model, no I/O and no global state, so ``tests/test_grpo.py`` can compare it with a straightforward loop-based
reference on random inputs.

The objective, per trainable token ``t`` of a sequence with advantage ``A``::

    rho_t  = min(pi_prox(t) / pi_behav(t), tis_cap)            # truncated importance weight, no gradient
    r_t    = pi_theta(t) / pi_prox(t)                          # PPO ratio against the proximal policy
    pg_t   = -min(r_t * A, clip(r_t, 1 - clip_low, 1 + clip_high) * A)
    kl_t   = exp(ref_t - logp_t) - (ref_t - logp_t) - 1        # k3 estimator of KL(pi_theta || pi_ref), >= 0
    loss   = sum_t w_t * (rho_t * pg_t + kl_coef * kl_t)

where ``pi_behav`` is the sampler's recorded logprob (the weights that *sampled* the token, possibly several
versions old, possibly a different numeric engine), ``pi_prox`` is the learner's own logprob with the weights at
the start of this optimizer step (no gradient) and ``w_t`` are aggregation weights that sum to one over the whole
global batch (see ``token_weights``).

Deviations from textbook GRPO (Shao et al. 2024), each on purpose:

1. **Decoupled off-policy correction.** Textbook GRPO/PPO clips ``pi_theta / pi_old`` where ``pi_old`` sampled the
   data. Our samples come from an asynchronous inference fleet whose weights may lag by several versions and whose
   numerics differ from training. The clip is taken against the proximal (current) policy and the sampler gap is
   corrected by a separate, *truncated* importance weight ``rho`` (truncated IS, as Polar's recipe ``--use-tis``
   and slime's PPO with recomputed old logprobs; cf. the decoupled PPO objective of Hilton et al. 2021).
   With one optimizer step per batch ``pi_prox == pi_theta`` numerically, so ``r == 1`` and the clip only bites when
   ``optimizer_steps_per_batch > 1``.
2. **Asymmetric clipping** ``[1 - 0.2, 1 + 0.28]`` (DAPO "clip-higher", Polar's recipe) instead of a symmetric eps.
3. **Advantages come precomputed in the batch.** The rollout service computes them with
   ``contracts.group_advantages`` (its docstring lists the methods and the default; ``FLOE_ROLLOUT_ADVANTAGE``
   picks one); the learner only reads the ``advantage`` column. Every token of a sequence shares the sequence's
   advantage (outcome reward, no critic).
4. **KL to a frozen reference inside the loss** with the low-variance k3 estimator (as GRPO), but a small default
   coefficient 0.001 (Polar) and *not* multiplied by the importance weight ``rho``.
5. **Aggregation** is configurable: ``token-mean`` (default; every trainable token of the batch weighs the same,
   DAPO/Dr.GRPO, no length bias), ``seq-mean-token-mean`` (textbook GRPO: mean over tokens, then over sequences) or
   ``session-mean`` (mean over tokens, then over a session's traces weighted by ``session_weight``, then over
   sessions, so an agent session split into many traces does not weigh more). The weights are computed once for the
   whole global batch, so micro-batching and data parallelism do not change the result.
6. **Staleness filter.** Tokens sampled by weights more than ``max_staleness`` versions behind the learner are
   dropped (masked), per token, because floe stamps the serving version on every call. Tokens that claim a version
   newer than the learner's, or no version at all, are dropped as invalid. Polar only has an admission window.
7. **No entropy bonus, no length penalty, no reward normalisation across the batch** (Polar: entropy 0, slime's
   ``--normalize-advantages`` off).

Limits: log-ratios are clamped to ``[-20, 20]`` before ``exp`` so a wild token cannot overflow (the clamp only
matters where the clip or truncation already cuts the term off); masked positions are sanitised *before* any
``exp`` so they get exactly zero gradient and never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "LossConfig",
    "StalenessResult",
    "policy_loss",
    "staleness_filter",
    "token_weights",
]

Aggregation = Literal["token-mean", "seq-mean-token-mean", "session-mean"]
AGGREGATIONS: tuple[Aggregation, ...] = ("token-mean", "seq-mean-token-mean", "session-mean")

_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0  # truncation of pi_prox / pi_behav; math.inf disables the truncation (plain IS)
    kl_coef: float = 0.001

    def __post_init__(self) -> None:
        assert 0.0 <= self.clip_low < 1.0, f"clip_low must be in [0, 1), got {self.clip_low}"
        assert self.clip_high >= 0.0, f"clip_high must be >= 0, got {self.clip_high}"
        assert self.tis_cap > 0.0, f"tis_cap must be > 0, got {self.tis_cap}"
        assert self.kl_coef >= 0.0, f"kl_coef must be >= 0, got {self.kl_coef}"


def policy_loss(
    logprobs: Tensor,
    behav_logprobs: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    prox_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The weighted GRPO loss of one micro-batch and its statistics as *sums* over trainable tokens.

    All inputs have the same shape (any shape; usually ``(B, T)``). ``logprobs`` carries the gradient; ``mask`` is
    bool; ``weights`` are the aggregation weights (zero where masked). ``prox_logprobs`` defaults to
    ``logprobs.detach()`` (one optimizer step per batch). Returns ``(loss, stats)``: ``loss`` is this micro-batch's
    share of the global loss (sum the losses of all micro-batches and ranks to get the batch loss); ``stats`` are
    sums to be reduced across micro-batches and ranks, with ``stats["tokens"]`` the count to divide by.
    """
    assert logprobs.shape == behav_logprobs.shape == advantages.shape == weights.shape == mask.shape, "shape mismatch"
    mask = mask.bool()
    prox = logprobs.detach() if prox_logprobs is None else prox_logprobs.detach()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    # Truncated importance weight for the sampler -> learner gap (staleness + engine mismatch). No gradient.
    log_rho = torch.where(mask, prox - behav_logprobs, zero).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    rho_full = torch.exp(log_rho)
    rho = rho_full.clamp(max=cfg.tis_cap)

    # PPO ratio against the proximal policy, asymmetric clip. Sanitise masked positions before exp.
    log_ratio = torch.where(mask, logprobs - prox, zero).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    # max(), but a tie picks the unclipped branch: torch.maximum would split the gradient of a tie in half.
    clipped = pg_clipped > pg_unclipped
    pg = torch.where(clipped, pg_clipped, pg_unclipped)
    per_token = rho * pg

    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None and cfg.kl_coef > 0.0:
        delta = torch.where(mask, ref_logprobs.detach() - logprobs, zero).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + cfg.kl_coef * kl

    loss = (torch.where(mask, per_token, zero) * weights).sum()

    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        gap = (prox - behav_logprobs) * m
        stats = {
            "tokens": m.sum(),
            "pg_loss": (pg * rho * weights * m).sum(),  # weighted: sums to the batch's policy-gradient loss
            "kl_loss": (kl * weights * m).sum(),
            "kl": (kl * m).sum(),
            "clip_frac": (clipped & mask).to(logprobs.dtype).sum(),
            "ratio": (ratio * m).sum(),
            "rho": (rho_full * m).sum(),
            "rho_truncated_frac": ((rho_full > cfg.tis_cap) & mask).to(logprobs.dtype).sum(),
            "logprob_gap": gap.sum(),  # mean of log pi_learner - log pi_sampler
            "logprob_abs_gap": gap.abs().sum(),
            "rho_max": torch.where(mask, rho_full, zero).max() if mask.any() else zero,
            "logprob": (prox * m).sum(),
            "behav_logprob": (behav_logprobs * m).sum(),
        }
    return loss, stats


def token_weights(
    mask: Tensor,
    seq_index: Tensor,
    session_index: Tensor,
    session_weight: Tensor,
    agg: Aggregation,
) -> Tensor:
    """Per-token aggregation weights over one *global* batch; they sum to 1 (or are all 0 if nothing is trainable).

    ``mask`` (N,) bool over flat tokens; ``seq_index`` (N,) the row of each token; ``session_index`` (R,) and
    ``session_weight`` (R,) per row. Rows and sessions without any trainable token do not count in the means.
    """
    assert agg in AGGREGATIONS, f"unknown aggregation {agg!r}; choose one of {AGGREGATIONS}"
    m = mask.to(torch.float64)
    n_rows = int(session_index.numel())
    if m.sum() == 0:
        return torch.zeros_like(m, dtype=torch.float32)
    if agg == "token-mean":
        return (m / m.sum()).to(torch.float32)
    tokens_per_row = torch.zeros(n_rows, dtype=torch.float64).index_add_(0, seq_index, m)  # (R,)
    live = tokens_per_row > 0
    per_token_in_row = torch.where(live, 1.0 / tokens_per_row.clamp(min=1.0), 0.0)  # token-mean inside a row
    if agg == "seq-mean-token-mean":
        row_weight = live.to(torch.float64) / live.sum()
    else:  # session-mean
        sw = session_weight.to(torch.float64) * live
        n_sessions = int(session_index.max().item()) + 1 if n_rows else 0
        sw_per_session = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, session_index, sw)
        live_sessions = (sw_per_session > 0).sum()
        # Renormalise inside each session over its *live* traces (a filtered trace must not shrink its session).
        row_weight = torch.where(live, sw / sw_per_session[session_index].clamp(min=1e-30), 0.0) / live_sessions
    return (m * (row_weight * per_token_in_row)[seq_index]).to(torch.float32)


@dataclass(frozen=True)
class StalenessResult:
    keep: Tensor  # (N,) bool: trainable after the filter
    dropped_stale: int  # trainable tokens older than max_staleness
    dropped_invalid: int  # trainable tokens with no version or a version newer than the learner's
    max_lag: int  # largest lag among kept tokens (0 if none)
    mean_lag: float  # mean lag among kept tokens


def staleness_filter(
    loss_mask: Tensor, weight_versions: Tensor, current_version: int, max_staleness: int | None
) -> StalenessResult:
    """Drop trainable tokens whose sampling weights lag the learner's ``current_version`` by more than
    ``max_staleness`` versions (``None`` keeps every valid token). Lag = current_version - weight_version."""
    trainable = loss_mask.bool()
    versions = weight_versions.to(torch.int64)
    lag = current_version - versions
    invalid = trainable & ((versions < 0) | (lag < 0))
    stale = trainable & ~invalid & (lag > max_staleness) if max_staleness is not None else torch.zeros_like(trainable)
    keep = trainable & ~invalid & ~stale
    kept_lag = lag[keep]
    return StalenessResult(
        keep=keep,
        dropped_stale=int(stale.sum()),
        dropped_invalid=int(invalid.sum()),
        max_lag=int(kept_lag.max()) if kept_lag.numel() else 0,
        mean_lag=float(kept_lag.double().mean()) if kept_lag.numel() else 0.0,
    )
