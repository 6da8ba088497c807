"""The policy model: load any ``transformers`` causal LM from a local directory and score target tokens.

Role: ``load_causal_lm`` (fp32 master weights; bf16 is applied as autocast on CUDA or by FSDP2's mixed precision)
and ``target_logprobs`` (per-token log pi(x_t | x_<t) for a padded micro-batch, at the sampler's temperature).

Limits: the full ``(B, T, V)`` logits of a micro-batch are materialised in fp32 for the log-softmax; size the
micro-batch token budget for that (``V`` = 152k for Qwen: 8k tokens ~ 5 GB).
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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model  # type: ignore[no-any-return]


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA when asked; a no-op otherwise (CPU training stays fp32 for exact tests)."""
    if bf16 and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def target_logprobs(model: nn.Module, mb: MicroBatch, temperature: float = 1.0) -> Tensor:
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]) for every position: shape (B, T-1), fp32."""
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()  # (B, T-1, V)
    if temperature != 1.0:
        logits = logits / temperature
    targets = mb.input_ids[:, 1:].unsqueeze(-1)  # (B, T-1, 1)
    # gather - logsumexp == log_softmax at the target, without a second (B, T-1, V) tensor.
    logprobs: Tensor = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logprobs
