"""torch.distributed plumbing: process group, device, DDP / FSDP2 wrapping, small collectives.

Role: everything rank-aware lives here so ``train.py`` can read as one loop. Launch with ``torchrun``; without the
torchrun environment (``WORLD_SIZE`` unset) the learner runs as a single process and nothing is initialised.

- ``ddp``: ``DistributedDataParallel`` over a full replica per rank (models that fit one device).
- ``fsdp``: FSDP2 ``fully_shard`` per decoder layer and then the root, for models that do not fit one device;
  on CUDA with bf16 the parameters stay fp32 (master weights) and compute runs in bf16, gradients reduce in fp32.

Limits: one node or a shared filesystem (checkpoints are written by rank 0 and read by every rank); the backend is
NCCL on CUDA and gloo on CPU.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import PrefixStore  # type: ignore[attr-defined]  # public, not in the stubs
from torch.distributed.rendezvous import rendezvous

__all__ = [
    "DistInfo",
    "Strategy",
    "all_reduce_max",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "init_distributed",
    "shutdown",
    "unwrap",
    "wrap_model",
]

Strategy = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto") -> DistInfo:
    """Initialise the process group if launched by torchrun, and pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        # Long timeout: rank 0 may wait minutes on Kafka for the next batch while the others block in a broadcast.
        timeout = datetime.timedelta(hours=2)
        store, _, _ = next(rendezvous("env://", rank, world, timeout=timeout))
        # torchrun's agent keeps one TCP store for all restarts of the worker group, and the process group's keys
        # name no attempt: after a rank died, a restarted rank could read the dead rank's address from the last
        # attempt and fail to connect (seen in tests/e2e/test_scale_out.py). One key prefix per attempt.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            store=PrefixStore(f"floe/attempt-{attempt}", store),
            rank=rank,
            world_size=world,
            timeout=timeout,
            device_id=dev if use_cuda else None,
        )
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev)


def wrap_model(model: nn.Module, info: DistInfo, strategy: Strategy, bf16: bool) -> nn.Module:
    """Wrap ``model`` (already on ``info.device``) for data-parallel training; a no-op on one process."""
    if not info.distributed:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    assert strategy == "fsdp", f"unknown strategy {strategy!r}"
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if bf16:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks: the largest ``nn.ModuleList`` (``model.layers`` in Llama/Qwen)."""
    lists = [list(m) for m in model.modules() if isinstance(m, nn.ModuleList)]
    assert lists, "FSDP wrapping needs a model with a ModuleList of decoder layers"
    return max(lists, key=len)


def unwrap(model: nn.Module) -> nn.Module:
    """The user module inside a DDP wrapper (FSDP2 wraps in place, so it is already the module)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model


def all_reduce_sum(values: dict[str, torch.Tensor], info: DistInfo) -> dict[str, float]:
    """Sum scalar tensors across ranks (one collective) and return them as floats."""
    keys = sorted(values)
    if not keys:
        return {}
    packed = torch.stack([values[k].detach().double().reshape(()) for k in keys]).to(info.device)
    if info.distributed:
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    return dict(zip(keys, packed.cpu().tolist(), strict=True))


def all_reduce_max(value: float, info: DistInfo) -> float:
    if not info.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; used for batch payloads and control messages)."""
    if not info.distributed:
        return obj
    box = [obj if info.is_main else None]
    dist.broadcast_object_list(box, src=0, device=info.device if info.device.type == "cuda" else None)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def shutdown() -> None:
    """Free the process group and join its threads while the interpreter is still whole.

    ``destroy_process_group`` only drops c10d's own references. A DDP or FSDP model keeps the group alive through its
    reducer, and the learner sits in reference cycles, so without a collection first the group outlived the call and
    its gloo threads were torn down during interpreter finalization, where now and then a rank aborted at exit
    ("terminate called without an active exception": once in CI, 1 of 55 two-rank runs here on a loaded machine).
    """
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
