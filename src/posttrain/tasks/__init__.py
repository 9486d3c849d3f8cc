"""Task pool: which task the loop trains on next.

Invariant: everything here is a deterministic function of the config, the
seed and the observed history, so a pool restored from `state_dict()` draws
exactly the tasks the original would have drawn.
"""

from posttrain.tasks.pool import TaskPool

__all__ = ["TaskPool"]
