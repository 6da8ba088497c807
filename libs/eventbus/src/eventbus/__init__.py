"""floe eventbus."""
