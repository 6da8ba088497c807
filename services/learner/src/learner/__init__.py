"""floe learner."""
