"""floe rollout: GRPO groups, trajectory reconstruction (per_request, prefix_merging), advantages, Arrow batches.

Pure core (no broker, no clock): ``build_trajectories`` (builders), ``GroupAssembler`` (join calls + end + reward,
group-normalized advantages with ``contracts.group_advantages``), ``GroupSelector`` (zero-signal groups: off, refill,
drop), ``BatchEncoder`` (Arrow IPC inline or claim check), ``Scheduler`` (admission, stragglers, deadlines, periodic
eval), ``rebuild`` (offline replay). Service: ``RolloutService`` over Kafka transactions, ``create_app`` (HTTP
``/state``, ``/metrics``).
"""

from rollout.advantages import SessionOutcome, classify
from rollout.app import create_app
from rollout.batching import BatchEncoder, batch_id_for, load_batch_table
from rollout.builders import BUILDERS, build_per_request, build_prefix_merging, build_trajectories
from rollout.calls import DecodedCall, ReconstructionError, decode_calls
from rollout.dataset import export_sft, write_group
from rollout.groups import GroupAssembler, GroupResult
from rollout.metrics import RolloutMetrics
from rollout.replay import rebuild
from rollout.scheduler import RunSpec, Scheduler, SchedulerConfig
from rollout.selection import GroupSelector
from rollout.service import RolloutService, Topics
from rollout.settings import RolloutSettings, RunSettings
from rollout.trace import BuildResult, ReconstructionStats, Trace

__all__ = [
    "BUILDERS",
    "BatchEncoder",
    "BuildResult",
    "DecodedCall",
    "GroupAssembler",
    "GroupResult",
    "GroupSelector",
    "ReconstructionError",
    "ReconstructionStats",
    "RolloutMetrics",
    "RolloutService",
    "RolloutSettings",
    "RunSettings",
    "RunSpec",
    "Scheduler",
    "SchedulerConfig",
    "SessionOutcome",
    "Topics",
    "Trace",
    "batch_id_for",
    "build_per_request",
    "build_prefix_merging",
    "build_trajectories",
    "classify",
    "create_app",
    "decode_calls",
    "export_sft",
    "load_batch_table",
    "rebuild",
    "write_group",
]
