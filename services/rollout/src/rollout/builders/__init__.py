"""Trajectory builders: pure functions from one session's recorded calls to traces.

``build_trajectories(calls, builder)`` decodes the delta-encoded prompts and runs the selected builder:
``per_request`` (one trace per call) or ``prefix_merging`` (one trace per chain of prefix-linked calls).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Literal

from contracts import ModelCallRecorded
from rollout.builders.per_request import build_per_request
from rollout.builders.prefix_merging import build_prefix_merging, detect_eot_ids
from rollout.calls import DecodedCall, decode_calls
from rollout.trace import BuildResult

__all__ = [
    "BUILDERS",
    "BuilderName",
    "build_per_request",
    "build_prefix_merging",
    "build_trajectories",
    "detect_eot_ids",
]

BuilderName = Literal["per_request", "prefix_merging"]

BUILDERS: dict[str, Callable[[Sequence[DecodedCall], Collection[int] | None], BuildResult]] = {
    "per_request": lambda calls, _eot: build_per_request(calls),
    "prefix_merging": build_prefix_merging,
}


def build_trajectories(
    calls: Iterable[ModelCallRecorded], builder: str = "prefix_merging", eot_token_ids: Collection[int] | None = None
) -> BuildResult:
    """Rebuild one session's traces; raises ``ReconstructionError`` on inconsistent records, ``KeyError`` on an
    unknown builder name."""
    try:
        fn = BUILDERS[builder]
    except KeyError:
        raise KeyError(f"unknown builder {builder!r}; known: {', '.join(BUILDERS)}") from None
    return fn(decode_calls(calls), eot_token_ids)
