"""floe learner: GRPO in torch on Arrow trajectory batches; checkpoints and publishes weight versions.

``python -m learner`` runs the service (``learner.train.serve``); ``learner.grpo`` holds the loss,
``learner.data`` the Arrow -> tensor path, ``learner.checkpoint`` the on-disk format shared with inference.
"""

from learner.checkpoint import CheckpointMismatchError, LearnerState
from learner.data import BatchError
from learner.grpo import LossConfig, policy_loss, staleness_filter, token_weights
from learner.settings import LearnerSettings
from learner.train import Learner, StepResult, serve, train_files

__all__ = [
    "BatchError",
    "CheckpointMismatchError",
    "Learner",
    "LearnerSettings",
    "LearnerState",
    "LossConfig",
    "StepResult",
    "policy_loss",
    "serve",
    "staleness_filter",
    "token_weights",
    "train_files",
]
