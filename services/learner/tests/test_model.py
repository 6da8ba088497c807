"""``learner.model``: the hand-written log-softmax backward equals autograd's, the trained-rows-only path equals
the all-positions path (values and gradients), and the dtype rule."""

from __future__ import annotations

import pytest
import torch

from learner import model as model_mod
from learner.data import MicroBatch
from learner.model import autocast, load_causal_lm, target_logprobs

from .synthetic import masked_micro_batch


class _Logits(torch.nn.Module):
    """A 'model' whose logits are a parameter, so the gradient of target_logprobs w.r.t. the logits is observable."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, input_ids, attention_mask, use_cache):
        return type("Out", (), {"logits": self.logits})()


def _micro_batch(ids: torch.Tensor) -> MicroBatch:
    zeros = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    return MicroBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        mask=zeros,
        behav_logprobs=zeros,
        advantages=zeros,
        weights=zeros,
        versions=zeros.long(),
        num_tokens=int(ids.numel()),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1 << 26, 40])  # one chunk, and chunks of 40 // V = 1 row (the loop's edges)
def test_target_logprobs_and_gradient_equal_autograd_log_softmax(monkeypatch, temperature, chunk):
    monkeypatch.setattr(model_mod, "_CHUNK_ELEMENTS", chunk)
    gen = torch.Generator().manual_seed(0)
    b, t, v = 3, 7, 11
    raw = torch.randn(b, t, v, generator=gen, dtype=torch.float64) * 3
    ids = torch.randint(0, v, (b, t), generator=gen)
    upstream = torch.randn(b, t - 1, generator=gen, dtype=torch.float64)

    ours = _Logits(raw.clone())
    lp = target_logprobs(ours, _micro_batch(ids), temperature)  # (B, T-1)
    (lp * upstream).sum().backward()

    ref = raw.clone().requires_grad_(True)
    ref_lp = torch.log_softmax(ref[:, :-1] / temperature, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (ref_lp * upstream).sum().backward()

    assert lp.shape == (b, t - 1) and lp.dtype == torch.float32
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)  # forward runs in fp32
    torch.testing.assert_close(ours.logits.grad, ref.grad, rtol=0, atol=1e-6)
    assert torch.all(ours.logits.grad[:, -1] == 0), "the last position has no target"


def assert_paths_agree(model, mb, temperature=1.0, lp_atol=1e-5, grad_tol=1e-4):
    """Trained rows only (the default) == all positions, at the trained targets: the logprobs, 0 elsewhere, and every
    parameter's gradient of a random weighting of them (to ``grad_tol`` times that gradient's largest entry); and
    the lm_head really saw only the trained rows."""
    mask = mb.mask
    upstream = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    rows = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, args, _o: rows.append(args[0].shape[:-1]))
    results = {}
    try:
        for all_positions in (True, False):
            model.zero_grad(set_to_none=True)
            lp = target_logprobs(model, mb, temperature, all_positions=all_positions)
            torch.where(mask, lp * upstream, 0.0).sum().backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results[all_positions] = (lp.detach(), grads)
    finally:
        hook.remove()
    (full, full_grads), (sel, sel_grads) = results[True], results[False]
    b, t = mb.input_ids.shape
    assert rows == [(b, t), (int(mask.sum()),)], rows
    assert sel.shape == full.shape == (b, t - 1) and sel.dtype == torch.float32
    assert torch.all(sel[~mask] == 0)
    torch.testing.assert_close(sel[mask], full[mask], rtol=0, atol=lp_atol)
    assert sel_grads.keys() == full_grads.keys() and len(sel_grads) == len(list(model.parameters()))
    for name, g in full_grads.items():
        scale = float(g.abs().max()) or 1.0
        torch.testing.assert_close(sel_grads[name], g, rtol=0, atol=grad_tol * scale, msg=name)


@pytest.mark.parametrize("grad_ckpt", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trained_rows_only_equal_all_positions_values_and_gradients(tiny_model_dir, grad_ckpt, temperature):
    model = load_causal_lm(tiny_model_dir, torch.device("cpu"), gradient_checkpointing=grad_ckpt).train()
    mb = masked_micro_batch([(5, 3), (9, 6), (2, 1), (7, 4)], vocab_size=64, holes=True)
    assert_paths_agree(model, mb, temperature)


def test_a_micro_batch_without_trained_targets_backpropagates_zeros(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, torch.device("cpu")).train()
    mb = masked_micro_batch([(4, 3), (6, 2)], vocab_size=64)
    mb = MicroBatch(**{**mb.__dict__, "mask": torch.zeros_like(mb.mask)})  # as data._empty pads ranks
    lp = target_logprobs(model, mb)
    assert torch.all(lp == 0) and lp.requires_grad
    (lp * mb.weights).sum().backward()
    assert all(p.grad is not None and torch.all(p.grad == 0) for p in model.parameters())


def test_bf16_autocast_only_when_asked():
    cpu = torch.device("cpu")
    x = torch.randn(4, 4)
    with autocast(cpu, bf16=False):
        assert (x @ x).dtype == torch.float32
    with autocast(cpu, bf16=True):  # the setting overrides the device default on a CPU too
        assert (x @ x).dtype == torch.bfloat16
