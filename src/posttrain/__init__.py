"""posttrain: RL post-training on verifiable tasks, closed loop to serving."""

__version__ = "0.1.0"
