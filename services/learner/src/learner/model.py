"""The policy model: load any ``transformers`` causal LM from a local directory and score target tokens.

Role: ``load_causal_lm`` and ``target_logprobs`` (per-token log pi(x_t | x_<t) for a padded micro-batch, at the
sampler's temperature). Any architecture ``AutoModelForCausalLM`` knows works (tests: a tiny Qwen2 and the real
SmolLM2-135M, a Llama with tied embeddings).

The dtype rule: parameters, gradients and AdamW state are always fp32 (the master copy: an update of lr 1e-6 is far
below bf16's resolution, 2^-8 relative, and would round away). Compute is bf16 on CUDA (``autocast`` here, or FSDP2's
mixed precision) and fp32 on CPU, where a bf16 step was 7.4x slower (SmolLM2, AVX2, no AVX-512); the learner's
``bf16`` setting overrides the device default either way.

Limits: the full ``(B, T, V)`` logits of a micro-batch are materialised (the model's output dtype), and backward adds
one gradient buffer of the same size; size the micro-batch token budget for that (fp32, 8k tokens: ``V`` = 152k for
Qwen ~ 5 GB, SmolLM2's 49k ~ 1.6 GB). The log-softmax itself runs in fp32 chunks of ~256 MB.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from learner.data import MicroBatch

__all__ = ["autocast", "load_causal_lm", "target_logprobs"]


def load_causal_lm(path: str | Path, device: torch.device, gradient_checkpointing: bool = False) -> nn.Module:
    """Load a causal LM (safetensors + config.json) in fp32 onto ``device``; no network access."""
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # bars on stderr would break the JSON log
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    model.to(device)
    if gradient_checkpointing:
        # transformers 5 renamed it (the old name warns, which our tests turn into errors); 4.x has only the old one.
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        model.config.use_cache = False
    return model  # type: ignore[no-any-return]


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast when asked (the learner asks on CUDA by default, on CPU only when set); a no-op otherwise."""
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def target_logprobs(model: nn.Module, mb: MicroBatch, temperature: float = 1.0) -> Tensor:
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]) for every position: shape (B, T-1), fp32."""
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    logits = out.logits  # (B, T, V)
    b, t, v = logits.shape
    # The full T positions, not logits[:, :-1]: a slice would be copied to flatten it and padded back in backward
    # (two more logits-sized tensors); the last position's target is a dummy 0 and its value is dropped.
    targets = torch.cat([mb.input_ids[:, 1:], mb.input_ids.new_zeros(b, 1)], dim=1)  # (B, T)
    flat: Tensor = _TargetLogprobs.apply(logits.reshape(b * t, v), targets.reshape(b * t), temperature)  # (B*T,)
    return flat.view(b, t)[:, :-1]


# Rows of the (N, V) logits turned into fp32 at a time: bounds the temporaries to ~256 MB whatever the vocabulary.
_CHUNK_ELEMENTS = 1 << 26


class _TargetLogprobs(torch.autograd.Function):
    """``log_softmax(logits / temperature)[target]`` per row, with a backward that allocates one gradient buffer.

    Why not plain autograd: ``gather - logsumexp`` over a ``logits[:, :-1]`` slice keeps several logits-sized
    tensors alive in backward (the softmax, the scattered gradient of the gather, their sum, the slice's padded
    gradient), and the logits are the largest tensors of a step. Here backward writes
    ``(onehot(target) - softmax(logits / T)) * grad / T`` chunk by chunk into one buffer of the logits' dtype.
    Measured on SmolLM2 (vocabulary 49k), 8 x 512 tokens, gradient checkpointing: the backward's peak above the
    resident set fell from 2.3 GiB to 1.25 GiB.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, temperature: float) -> Tensor:  # (N, V), (N,) -> (N,)
        n, v = logits.shape
        step = max(1, _CHUNK_ELEMENTS // v)
        out = torch.empty(n, dtype=torch.float32, device=logits.device)
        for lo in range(0, n, step):
            x = logits[lo : lo + step].float() / temperature  # (c, V) fp32
            out[lo : lo + step] = x.gather(-1, targets[lo : lo + step, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)
        ctx.save_for_backward(logits, targets)
        ctx.temperature = temperature
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        logits, targets = ctx.saved_tensors
        temperature: float = ctx.temperature
        n, v = logits.shape
        step = max(1, _CHUNK_ELEMENTS // v)
        grad = torch.empty_like(logits)
        for lo in range(0, n, step):
            p = torch.softmax(logits[lo : lo + step].float() / temperature, dim=-1)  # (c, V) fp32
            p.neg_().scatter_add_(-1, targets[lo : lo + step, None], p.new_ones(p.shape[0], 1))
            p.mul_(grad_out[lo : lo + step, None] / temperature)
            grad[lo : lo + step] = p
        return grad, None, None
