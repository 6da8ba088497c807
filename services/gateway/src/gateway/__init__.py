"""floe gateway."""
