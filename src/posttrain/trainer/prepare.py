"""Turn the trainer's scale options into changes of the model it trains.

Invariant: `prepare_model` with every option off returns the model untouched;
each option, when on, is applied in one fixed order (determinism, gradient
checkpointing, LoRA, FSDP sharding) before the optimizer sees any parameter,
and the returned module is the one to train and to checkpoint.
"""

from __future__ import annotations

from typing import Any

from posttrain.configs.trainer import TrainerConfig


def prepare_model(model: Any, config: TrainerConfig) -> Any:
    from posttrain.trainer.memory import enable_gradient_checkpointing, pin_determinism

    if config.deterministic:
        pin_determinism()
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if config.lora is not None:
        from posttrain.trainer.lora import apply_lora

        model = apply_lora(model, config.lora)
    if config.fsdp:
        from posttrain.trainer.fsdp import shard_model

        model = shard_model(model)
    return model
