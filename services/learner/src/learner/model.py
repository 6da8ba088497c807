"""The policy model: load any ``transformers`` causal LM from a local directory and score target tokens.

Role: ``load_causal_lm`` and ``target_logprobs`` (per-token log pi(x_t | x_<t) for a padded micro-batch, at the
sampler's temperature). Any architecture ``AutoModelForCausalLM`` knows works (tests: a tiny Qwen2 and the real
SmolLM2-135M, a Llama with tied embeddings).

The dtype rule: parameters, gradients and AdamW state are always fp32 (the master copy: an update of lr 1e-6 is far
below bf16's resolution, 2^-8 relative, and would round away). Compute is bf16 on CUDA (``autocast`` here, or FSDP2's
mixed precision) and fp32 on CPU, where a bf16 step was 7.4x slower (SmolLM2, AVX2, no AVX-512); the learner's
``bf16`` setting overrides the device default either way.

Only trained targets get logits: the model is asked for the lm_head rows of ``mb.mask`` alone (``logits_to_keep``
as a bool mask), so prompt, padding and masked positions cost the decoder layers but neither the ``V``-wide head
nor the log-softmax (for the demo's 45-token prompts + 6 sampled tokens, 6 of 51 rows).

Limits: the ``(N, V)`` logits of a micro-batch's N trained targets are materialised (the model's output dtype), and
backward adds one gradient buffer of the same size; size the micro-batch token budget for that (fp32, 8k trained
tokens: ``V`` = 152k for Qwen ~ 5 GB, SmolLM2's 49k ~ 1.6 GB). The log-softmax itself runs in fp32 chunks of
~256 MB. On transformers 4 (no bool ``logits_to_keep``) every position's logits are computed, as before.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, PreTrainedModel
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


def target_logprobs(model: nn.Module, mb: MicroBatch, temperature: float = 1.0, all_positions: bool = False) -> Tensor:
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]): shape (B, T-1), fp32.

    By default only at the trained targets (``mb.mask``) and 0 elsewhere: the loss, its statistics, the proximal
    and the reference logprobs are all read through that mask (``grpo.policy_loss``), so the lm_head and the
    log-softmax run on those rows only. ``all_positions=True`` (or a model that cannot slice, see
    ``_slices_logits``) computes every position's logits.
    """
    b, t = mb.input_ids.shape
    if not all_positions and _slices_logits(model):
        mask = mb.mask.bool()  # (B, T-1)
        keep = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)  # (B, T): the last position has no target
        # transformers applies the model's own head (lm_head, and any logit scaling or soft-capping after it) to
        # hidden_states[keep] only: (N, V) logits, N = mask.sum(). Through the model's forward, not its base model
        # + get_output_embeddings(), so DDP's and FSDP2's forward hooks run as usual.
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False, logits_to_keep=keep)
        logits = out.logits
        n = int(mask.sum())
        assert logits.ndim == 2 and logits.shape[0] == n, f"logits_to_keep ignored: {tuple(logits.shape)}, {n} rows"
        flat: Tensor = _TargetLogprobs.apply(logits, mb.input_ids[:, 1:][mask], temperature)  # (N,) fp32
        return flat.new_zeros(b, t - 1).masked_scatter(mask, flat)
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    logits = out.logits  # (B, T, V)
    v = logits.shape[-1]
    # The full T positions, not logits[:, :-1]: a slice would be copied to flatten it and padded back in backward
    # (two more logits-sized tensors); the last position's target is a dummy 0 and its value is dropped.
    targets = torch.cat([mb.input_ids[:, 1:], mb.input_ids.new_zeros(b, 1)], dim=1)  # (B, T)
    full: Tensor = _TargetLogprobs.apply(logits.reshape(b * t, v), targets.reshape(b * t), temperature)  # (B*T,)
    return full.view(b, t)[:, :-1]


def _slices_logits(model: nn.Module) -> bool:
    """Whether ``model(..., logits_to_keep=<(B, T) bool mask>)`` returns the (N, V) logits of the kept positions.

    transformers >= 5 routes ``logits_to_keep`` through ``modeling_utils.slice_logits_to_keep``, which takes a bool
    mask, in every causal LM's forward (Llama, Qwen2, Gemma2's soft-capped head, ...): the hidden states are sliced
    before the head, so the kept logits are the full path's rows. transformers 4 slices ``hidden[:, keep, :]``,
    which a (B, T) mask would break: there, and for modules that are not a transformers model (test doubles), the
    full path.
    """
    inner = getattr(model, "module", model)  # DDP wraps; FSDP2 shards in place
    if not isinstance(inner, PreTrainedModel) or not _mask_slicing():
        return False
    return "logits_to_keep" in inspect.signature(inner.forward).parameters  # tens of us, next to a forward pass


@functools.cache
def _mask_slicing() -> bool:
    try:
        from transformers.modeling_utils import slice_logits_to_keep
    except ImportError:
        return False
    probe = slice_logits_to_keep(torch.zeros(2, 3, 1), torch.tensor([[True, False, False], [False, True, True]]))
    return tuple(probe.shape) == (3, 1)


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
