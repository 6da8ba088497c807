"""The policy model: load any ``transformers`` causal LM from a local directory and score target tokens.

Role: ``load_causal_lm`` and ``target_logprobs`` (per-token log pi(x_t | x_<t) for a padded or packed micro-batch, at
the sampler's temperature). Any architecture ``AutoModelForCausalLM`` knows works (tests: a tiny Qwen2 and the real
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

Packed micro-batches (``data.MicroBatch.packed``): one ``(1, N)`` row of concatenated sequences, ``position_ids`` that
restart at 0 per sequence, no ``attention_mask``, and the flash-attention varlen kwargs ``cu_seq_lens_q/k`` and
``max_length_q/k`` (what ``transformers.DataCollatorWithFlattening`` produces). A model loaded with ``sdpa`` (the
default wherever it is supported) is switched to ``PACKED_SDPA``, an sdpa that runs each sequence of a packed row as
its own causal attention (``sum L_i^2`` work, no ``N x N`` mask) and is plain ``sdpa`` for everything else.
``flash_attention_2/3`` read the same kwargs natively; any other implementation (``eager``, ``flex_attention``)
gets the block-diagonal causal mask transformers derives from the restarting ``position_ids`` (correct, but an
``N x N`` mask).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, AutoModelForCausalLM, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.utils import logging as hf_logging

from learner.data import MicroBatch

__all__ = ["PACKED_SDPA", "autocast", "load_causal_lm", "target_logprobs"]

# The attention implementation name the learner gives sdpa models (registered below, at import).
PACKED_SDPA = "floe_packed_sdpa"


def load_causal_lm(path: str | Path, device: torch.device, gradient_checkpointing: bool = False) -> nn.Module:
    """Load a causal LM (safetensors + config.json) in fp32 onto ``device``; no network access."""
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # bars on stderr would break the JSON log
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    if model.config._attn_implementation == "sdpa":
        # Same results as sdpa for padded micro-batches, no N x N mask for packed ones (module docstring). Not saved:
        # transformers leaves ``_attn_implementation`` out of config.json, so checkpoints stay plain sdpa models.
        model.set_attn_implementation(PACKED_SDPA)
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
    inputs = _model_inputs(mb)
    if not all_positions and _slices_logits(model):
        mask = mb.mask.bool()  # (B, T-1)
        keep = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)  # (B, T): the last position has no target
        # transformers applies the model's own head (lm_head, and any logit scaling or soft-capping after it) to
        # hidden_states[keep] only: (N, V) logits, N = mask.sum(). Through the model's forward, not its base model
        # + get_output_embeddings(), so DDP's and FSDP2's forward hooks run as usual.
        out = model(**inputs, use_cache=False, logits_to_keep=keep)
        logits = out.logits
        n = int(mask.sum())
        assert logits.ndim == 2 and logits.shape[0] == n, f"logits_to_keep ignored: {tuple(logits.shape)}, {n} rows"
        flat: Tensor = _TargetLogprobs.apply(logits, mb.input_ids[:, 1:][mask], temperature)  # (N,) fp32
        return flat.new_zeros(b, t - 1).masked_scatter(mask, flat)
    out = model(**inputs, use_cache=False)
    logits = out.logits  # (B, T, V)
    v = logits.shape[-1]
    # The full T positions, not logits[:, :-1]: a slice would be copied to flatten it and padded back in backward
    # (two more logits-sized tensors); the last position's target is a dummy 0 and its value is dropped.
    targets = torch.cat([mb.input_ids[:, 1:], mb.input_ids.new_zeros(b, 1)], dim=1)  # (B, T)
    full: Tensor = _TargetLogprobs.apply(logits.reshape(b * t, v), targets.reshape(b * t), temperature)  # (B*T,)
    return full.view(b, t)[:, :-1]


def _model_inputs(mb: MicroBatch) -> dict[str, Any]:
    """The forward's inputs: padded rows with their attention mask, or a packed row with its sequence boundaries."""
    if mb.cu_seq_lens is None:
        return {"input_ids": mb.input_ids, "attention_mask": mb.attention_mask}
    # No attention_mask: with one, transformers would treat the row as a single sequence (its packing detection
    # only runs without a mask). The kwargs are the names flash-attention's varlen path and PACKED_SDPA read.
    return {
        "input_ids": mb.input_ids,
        "position_ids": mb.position_ids,
        "cu_seq_lens_q": mb.cu_seq_lens,
        "cu_seq_lens_k": mb.cu_seq_lens,
        "max_length_q": mb.max_length,
        "max_length_k": mb.max_length,
    }


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


def _packed_sdpa(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    sliding_window: int | None = None,
    cu_seq_lens_q: Tensor | None = None,
    cu_seq_lens_k: Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """sdpa, except that without a mask each sequence of a packed row attends causally to itself only.

    ``query`` is ``(B, H, T, D)``. With a mask (padded rows, a cache) this is ``sdpa_attention_forward`` as is. Without
    one (``_packed_mask`` returns none for a cache-less forward without padding), the sequences are the
    ``cu_seq_lens_q`` segments of the one row, or the runs of ``position_ids`` that restart at 0 (transformers'
    padding-free convention, for callers that pass only those), or else each whole row; each gets its own causal
    sdpa call, with the layer's sliding window as a mask when the sequence is longer than it. Per sequence, this is
    the computation sdpa does for the same sequence in a padded batch, so padded and packed agree to rounding.
    """
    b, _, t, _ = query.shape
    if attention_mask is not None or key.shape[2] != t:
        # A mask, or a cache (decoding: sdpa_mask drops the mask of a single query): sdpa's own semantics.
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = _segments(b, t, cu_seq_lens_q, position_ids)
    if bounds is None and sliding_window is None:
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)
    outs = []
    for lo, hi in bounds or [(0, t)]:
        mask = None
        if sliding_window is not None and hi - lo > sliding_window:
            i = torch.arange(hi - lo, device=query.device)
            # transformers' sliding window: key k is visible from query q when q - window < k <= q.
            mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - sliding_window)
        q, k, v = query[:, :, lo:hi], key[:, :, lo:hi], value[:, :, lo:hi]
        outs.append(sdpa_attention_forward(module, q, k, v, mask, **kwargs)[0])  # (B, L, H, D)
    return torch.cat(outs, dim=1), None


def _segments(b: int, t: int, cu_seq_lens: Tensor | None, position_ids: Tensor | None) -> list[tuple[int, int]] | None:
    """The ``[lo, hi)`` sequences of a packed ``(1, T)`` row, or None when the rows are not packed."""
    if cu_seq_lens is not None:
        cu = cu_seq_lens.tolist()  # a host sync per layer on CUDA: small next to a layer's kernels
    elif position_ids is not None and b == 1 and t > 1:
        starts = (position_ids.reshape(-1)[1:] == 0).nonzero().reshape(-1) + 1
        if not starts.numel():
            return None
        cu = [0, *starts.tolist(), t]
    else:
        return None
    assert b == 1 and cu[0] == 0 and cu[-1] == t, f"packed sequences {cu} do not tile a (1, {t}) row (batch {b})"
    return list(itertools.pairwise(cu))


def _packed_mask(**kwargs: Any) -> Tensor | None:
    """``sdpa_mask``, but none at all for a forward without padding or cache, where ``_packed_sdpa`` masks itself.

    A packed row reaches here with no ``attention_mask`` and transformers' packed-sequence function in
    ``mask_function``: sdpa_mask would materialise that ``(1, 1, N, N)`` block-diagonal mask (1 GiB of bools at 32k
    tokens) and the attention would then cost ``N^2`` instead of ``sum L_i^2``."""
    no_cache = kwargs.get("q_offset", 0) == 0 and kwargs.get("kv_offset", 0) == 0
    if kwargs.get("attention_mask") is None and no_cache and kwargs.get("q_length") == kwargs.get("kv_length"):
        return None
    return sdpa_mask(**kwargs)


AttentionInterface.register(PACKED_SDPA, _packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, _packed_mask)


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
