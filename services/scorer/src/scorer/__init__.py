"""floe scorer."""
