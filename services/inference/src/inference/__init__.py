"""floe inference."""
