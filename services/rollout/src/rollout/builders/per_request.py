"""``per_request``: one trace per model call (Polar's default; docs/polar-comparison.md, "Per-request traces").

Every call becomes prompt (masked context) + its sampled completion (trainable, with its sampling logprobs and
weight version). Nothing is merged, so a T-turn session yields T traces that each repeat the growing prefix: simple,
always correct, and O(T²) trainer tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollout.calls import DecodedCall
from rollout.trace import BuildResult, ReconstructionStats, Trace

__all__ = ["build_per_request"]


def build_per_request(calls: Sequence[DecodedCall]) -> BuildResult:
    traces: list[Trace] = []
    stats = ReconstructionStats(calls=len(calls))
    for call in calls:
        n_prompt, n_out = len(call.prompt), len(call.completion)
        traces.append(
            Trace(
                tokens=call.prompt + call.completion,
                loss_mask=(0,) * n_prompt + (1,) * n_out,
                logprobs=(0.0,) * n_prompt + call.logprobs,
                weight_versions=(-1,) * n_prompt + (call.weight_version,) * n_out,
                prompt_len=n_prompt,
                call_indices=(call.call_index,),
            )
        )
        stats.unmatched += 1
    return BuildResult.of(traces, stats)
