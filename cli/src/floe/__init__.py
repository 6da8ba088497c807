"""floe floe."""
