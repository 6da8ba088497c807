"""``learner.model``: the hand-written log-softmax backward equals autograd's, and the dtype rule."""

from __future__ import annotations

import pytest
import torch

from learner import model as model_mod
from learner.data import MicroBatch
from learner.model import autocast, target_logprobs


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


def test_bf16_autocast_only_when_asked():
    cpu = torch.device("cpu")
    x = torch.randn(4, 4)
    with autocast(cpu, bf16=False):
        assert (x @ x).dtype == torch.float32
    with autocast(cpu, bf16=True):  # the setting overrides the device default on a CPU too
        assert (x @ x).dtype == torch.bfloat16
