"""Numerical tests of the pure loss module against straightforward loop implementations."""

from __future__ import annotations

import math
import random

import pytest
import torch

from learner.grpo import AGGREGATIONS, LossConfig, policy_loss, staleness_filter, token_weights


def reference_loss(lp, behav, adv, w, mask, cfg, prox=None, ref=None):
    """Token-by-token, float64, no vectorisation: the objective as written in grpo.py's docstring."""
    total = torch.zeros((), dtype=torch.float64)
    for i in range(lp.numel()):
        if not mask[i]:
            continue
        p = float(prox[i]) if prox is not None else float(lp[i].detach())
        rho = min(math.exp(p - float(behav[i])), cfg.tis_cap)
        r = torch.exp(lp[i].double() - p)
        a = float(adv[i])
        pg = -torch.minimum(r * a, torch.clamp(r, 1 - cfg.clip_low, 1 + cfg.clip_high) * a)
        term = rho * pg
        if ref is not None and cfg.kl_coef > 0:
            d = float(ref[i]) - lp[i].double()
            term = term + cfg.kl_coef * (torch.exp(d) - d - 1)
        total = total + float(w[i]) * term
    return total


def reference_weights(mask, rows, sessions, sw, agg):
    n_rows = len(sessions)
    toks = [sum(1 for j in range(len(mask)) if rows[j] == r and mask[j]) for r in range(n_rows)]
    live = [r for r in range(n_rows) if toks[r] > 0]
    out = [0.0] * len(mask)
    if not live:
        return out
    total = sum(toks)
    live_sessions = sorted({sessions[r] for r in live})
    for j in range(len(mask)):
        if not mask[j]:
            continue
        r = rows[j]
        if agg == "token-mean":
            out[j] = 1 / total
        elif agg == "seq-mean-token-mean":
            out[j] = 1 / toks[r] / len(live)
        else:
            in_session = sum(sw[q] for q in live if sessions[q] == sessions[r])
            out[j] = (sw[r] / in_session) / toks[r] / len(live_sessions)
    return out


def random_case(seed: int, n: int = 64, n_rows: int = 6, off_policy: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, generator=g, dtype=torch.float64) * 4
    behav = lp + torch.randn(n, generator=g, dtype=torch.float64) * off_policy
    prox = lp + torch.randn(n, generator=g, dtype=torch.float64) * 0.3
    ref = lp + torch.randn(n, generator=g, dtype=torch.float64) * 0.5
    rows = torch.sort(torch.randint(0, n_rows, (n,), generator=g)).values
    adv_row = torch.randn(n_rows, generator=g, dtype=torch.float64)
    sessions = torch.tensor([0, 0, 1, 2, 2, 2][:n_rows])
    sw = torch.tensor([1 / 2, 1 / 2, 1.0, 1 / 3, 1 / 3, 1 / 3][:n_rows], dtype=torch.float64)
    mask = torch.rand(n, generator=g) < 0.7
    return lp, behav, prox, ref, rows, adv_row[rows], sessions, sw, mask


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_token_weights_match_reference(agg):
    for seed in range(5):
        _, _, _, _, rows, _, sessions, sw, mask = random_case(seed)
        got = token_weights(mask, rows, sessions, sw, agg)
        want = reference_weights(mask.tolist(), rows.tolist(), sessions.tolist(), sw.tolist(), agg)
        torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-9)
        assert got.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_session_mean_does_not_favour_sessions_with_more_traces():
    # Session 0: one row of 4 tokens. Session 1: three rows of 4 tokens. Each session must weigh 1/2.
    rows = torch.repeat_interleave(torch.arange(4), 4)
    mask = torch.ones(16, dtype=torch.bool)
    w = token_weights(mask, rows, torch.tensor([0, 1, 1, 1]), torch.tensor([1.0, 1 / 3, 1 / 3, 1 / 3]), "session-mean")
    assert w[:4].sum().item() == pytest.approx(0.5)
    assert w[4:].sum().item() == pytest.approx(0.5)
    tm = token_weights(mask, rows, torch.tensor([0, 1, 1, 1]), torch.ones(4), "token-mean")
    assert tm[:4].sum().item() == pytest.approx(0.25)


@pytest.mark.parametrize("with_prox", [False, True])
@pytest.mark.parametrize("with_ref", [False, True])
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_loss_and_gradient_match_reference(agg, with_ref, with_prox):
    cfg = LossConfig(kl_coef=0.05)
    for seed in range(4):
        lp0, behav, prox, ref, rows, adv, sessions, sw, mask = random_case(seed)
        w = token_weights(mask, rows, sessions, sw, agg).double()
        lp = lp0.clone().requires_grad_(True)
        loss, _ = policy_loss(
            lp,
            behav,
            adv,
            w,
            mask,
            cfg,
            prox_logprobs=prox if with_prox else None,
            ref_logprobs=ref if with_ref else None,
        )
        (g,) = torch.autograd.grad(loss, lp)
        lp_ref = lp0.clone().requires_grad_(True)
        want = reference_loss(lp_ref, behav, adv, w, mask, cfg, prox if with_prox else None, ref if with_ref else None)
        (g_ref,) = torch.autograd.grad(want, lp_ref)
        torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_masked_tokens_get_exactly_zero_gradient_even_with_extreme_values():
    lp0, behav, prox, ref, rows, adv, sessions, sw, mask = random_case(0)
    behav = torch.where(mask, behav, torch.tensor(0.0, dtype=torch.float64))
    lp0 = torch.where(mask, lp0, torch.tensor(-500.0, dtype=torch.float64))  # exp(+-500) overflows if not sanitised
    ref = torch.where(mask, ref, torch.tensor(400.0, dtype=torch.float64))
    adv = torch.where(mask, adv, torch.tensor(1e30, dtype=torch.float64))
    lp = lp0.clone().requires_grad_(True)
    w = token_weights(mask, rows, sessions, sw, "token-mean").double()
    loss, _ = policy_loss(lp, behav, adv, w, mask, LossConfig(kl_coef=0.1), prox_logprobs=prox, ref_logprobs=ref)
    (g,) = torch.autograd.grad(loss, lp)
    assert torch.isfinite(loss)
    assert torch.all(g[~mask] == 0.0)
    assert torch.all(g[mask] != 0.0)


def test_on_policy_ratio_is_one_and_clipping_changes_nothing():
    lp0, _, _, _, rows, adv, sessions, sw, mask = random_case(1)
    w = token_weights(mask, rows, sessions, sw, "seq-mean-token-mean").double()
    behav = lp0.clone()  # on-policy: the sampler's logprobs are the learner's
    results = []
    for cfg in (LossConfig(kl_coef=0.0), LossConfig(clip_low=0.0, clip_high=0.0, kl_coef=0.0), LossConfig(1e-9, 1e9)):
        lp = lp0.clone().requires_grad_(True)
        loss, stats = policy_loss(lp, behav, adv, w, mask, cfg)
        (g,) = torch.autograd.grad(loss, lp)
        n = stats["tokens"]
        assert (stats["ratio"] / n).item() == pytest.approx(1.0)
        assert (stats["rho"] / n).item() == pytest.approx(1.0)
        assert stats["clip_frac"].item() == 0.0
        results.append((loss.detach(), g))
    for loss, g in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        torch.testing.assert_close(g, results[0][1])
    # ...and equals the plain policy gradient -mean(A * logp) direction: d loss / d logp = -A * w.
    torch.testing.assert_close(results[0][1], torch.where(mask, -adv * w, torch.zeros_like(adv)))


def test_clipping_zeroes_gradient_outside_the_trust_region():
    lp = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64)).requires_grad_(True)
    prox = torch.log(torch.tensor([0.25, 0.25, 0.5, 0.5], dtype=torch.float64))  # ratios 2, 2, 1, 1
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(4, dtype=torch.bool)
    w = torch.full((4,), 0.25, dtype=torch.float64)
    loss, stats = policy_loss(lp, prox, adv, w, mask, LossConfig(kl_coef=0.0), prox_logprobs=prox)
    (g,) = torch.autograd.grad(loss, lp)
    # Token 0: ratio 2 > 1.28 with A > 0 -> clipped, no gradient. Token 1: A < 0, the unclipped branch is the
    # pessimistic one -> gradient flows (PPO keeps pushing a bad token down).
    assert g[0].item() == 0.0
    assert g[1].item() == pytest.approx(0.25 * 2.0)
    assert stats["clip_frac"].item() == 1.0


def test_truncated_importance_weight_is_capped():
    lp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    behav = torch.tensor([-5.0, -0.1, 0.0], dtype=torch.float64)  # rho = e^5 (capped at 2), e^0.1, 1
    adv = torch.ones(3, dtype=torch.float64)
    loss, stats = policy_loss(
        lp,
        behav,
        adv,
        torch.ones(3, dtype=torch.float64),
        torch.ones(3, dtype=torch.bool),
        LossConfig(tis_cap=2.0, kl_coef=0.0),
    )
    (g,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(g, -torch.tensor([2.0, math.exp(0.1), 1.0], dtype=torch.float64))
    assert stats["rho_truncated_frac"].item() == 1.0
    assert stats["rho_max"].item() == pytest.approx(math.exp(5))


def test_k3_kl_matches_formula_and_is_nonnegative():
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(50, generator=g, dtype=torch.float64) * 3
    ref = -torch.rand(50, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(50, dtype=torch.bool)
    _, stats = policy_loss(
        lp,
        lp,
        torch.zeros(50, dtype=torch.float64),
        torch.ones(50, dtype=torch.float64),
        mask,
        LossConfig(kl_coef=1.0),
        ref_logprobs=ref,
    )
    d = ref - lp
    assert stats["kl"].item() == pytest.approx((torch.exp(d) - d - 1).sum().item())
    assert stats["kl"].item() > 0


def test_staleness_filter_drops_exactly_the_right_tokens():
    rng = random.Random(0)
    current, max_lag = 10, 3
    versions = [rng.choice([-1, 0, 5, 6, 7, 8, 9, 10, 11, 12]) for _ in range(500)]
    mask = [rng.random() < 0.8 for _ in range(500)]
    res = staleness_filter(torch.tensor(mask), torch.tensor(versions, dtype=torch.int32), current, max_lag)
    want_keep = [m and v >= 0 and 0 <= current - v <= max_lag for m, v in zip(mask, versions, strict=True)]
    assert res.keep.tolist() == want_keep
    assert res.dropped_stale == sum(m and 0 <= v < current - max_lag for m, v in zip(mask, versions, strict=True))
    assert res.dropped_invalid == sum(m and (v < 0 or v > current) for m, v in zip(mask, versions, strict=True))
    assert res.max_lag == 3
    none = staleness_filter(torch.tensor(mask), torch.tensor(versions), current, None)
    assert none.dropped_stale == 0
    assert none.keep.sum().item() == sum(m and 0 <= v <= current for m, v in zip(mask, versions, strict=True))
