"""floe task sets: SWE-bench-format instances and their repository snapshots."""
