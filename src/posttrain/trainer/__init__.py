"""The RL trainer: GRPO-family losses, AdamW, a loss-spike guard, checkpoints, and its
scale-out options: LoRA (`lora`), FSDP2 (`fsdp`), bf16 autocast, gradient checkpointing,
memory-sized micro-batches and pinned RNG (`memory`, `prepare`), and the torchrun
leader/follower (`distributed`).

Invariant: importing this package (and its `batch` module; the config is
`posttrain.configs.trainer`) does not import torch or transformers; `losses`,
`trainer`, `checkpoint` and the scale-out modules do, so import them only where
training happens. Nothing here is a second trainer: `prepare_model` turns the
Trainer's options into changes of the model it trains (adapters, sharding,
checkpointing), and the Trainer's own step uses the `memory` and `fsdp` helpers;
with every option off the Trainer computes exactly what it computed before.
"""
