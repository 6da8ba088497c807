"""vLLM worker extension (serve.sh passes it): on the CPU build, ``reload_weights`` must reach a tied lm_head too.

The bug (vLLM 0.32.0, CPU platform): a ``ParallelLMHead`` computes the logits with a GEMM handle that
``UnquantizedEmbeddingMethod.process_weights_after_loading`` builds from its weight when the model is loaded
(``dispatch_cpu_unquantized_gemm``: oneDNN keeps its own copy of the weight). With tied embeddings (SmolLM2,
the small Qwen2.5 models) the head shares ``embed_tokens.weight`` and no checkpoint tensor is its own, so the in-place
reload (``model_loader/reload``) updates the shared Parameter but never processes the head again: the input
embeddings are the new checkpoint's, the logits still come from the start weights. Seen here: a learner checkpoint
whose embedding rows changed left every greedy token as before, until the handle was rebuilt
(``services/inference/tests/test_vllm_learner_checkpoint.py``).

The fix: importing this module (vLLM imports it to resolve ``--worker-extension-cls``, in every worker process,
before the model is loaded) wraps ``Worker.reload_weights`` so that after each reload the tied heads are processed
again, which rebuilds their handle from the current weight. It does nothing on a GPU (no ``cpu_linear``: there the
head multiplies by the shared Parameter itself; read in vLLM's code, not run here), nor to a head with weights of its
own (the reload processes it). ``floe_repack_tied_lm_heads`` is also callable by hand:
``POST /collective_rpc {"method": "floe_repack_tied_lm_heads"}`` answers the number of heads rebuilt.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.v1.worker.gpu_worker import Worker

__all__ = ["FloeCpuReload", "repack_tied_lm_heads"]


def repack_tied_lm_heads(model: nn.Module) -> int:
    """Process every CPU-dispatched lm_head that shares an input embedding's weight again; return how many."""
    modules = list(model.modules())
    embeddings = {
        m.weight.data_ptr()
        for m in modules
        if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
    }
    heads = [
        m
        for m in modules
        if isinstance(m, ParallelLMHead) and hasattr(m, "cpu_linear") and m.weight.data_ptr() in embeddings
    ]
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


class FloeCpuReload:
    """Mixed into vLLM's worker class by ``--worker-extension-cls floe_cpu_reload.FloeCpuReload``."""

    def floe_repack_tied_lm_heads(self) -> int:
        return repack_tied_lm_heads(self.get_model())  # type: ignore[attr-defined]


def _wrap(reload: Any) -> Any:
    @functools.wraps(reload)
    def reload_weights(self: Any, *args: Any, **kwargs: Any) -> None:
        reload(self, *args, **kwargs)
        repack_tied_lm_heads(self.get_model())

    reload_weights.floe_wrapped = True  # type: ignore[attr-defined]
    return reload_weights


if not getattr(Worker.reload_weights, "floe_wrapped", False):
    Worker.reload_weights = _wrap(Worker.reload_weights)  # type: ignore[method-assign]
