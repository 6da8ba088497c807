"""floe rollout."""
