"""The RL trainer: GRPO-family losses, AdamW, a loss-spike guard, checkpoints.

Invariant: importing this package (and its `config` and `batch` modules)
does not import torch or transformers; `losses`, `trainer` and `checkpoint`
do, so import them only where training happens.
"""
