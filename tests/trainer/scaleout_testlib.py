"""Helpers shared by the scale tests: a tiny random Qwen2, synthetic off-policy batches."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random  # noqa: E402

import torch  # noqa: E402

from posttrain.trainer.batch import TrainBatch, TrainRow  # noqa: E402

VOCAB = 64


def tiny_model(seed: int = 0, tied: bool = False, layers: int = 2):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return AutoModelForCausalLM.from_config(config)


def batch(seed: int, n_groups: int = 4, group_size: int = 4) -> TrainBatch:
    """Prompts of 2-5 tokens, completions of 1-7, mixed 0/1 rewards in every group,
    fixed off-policy behaviour log-probs (so ratios differ from 1 and clipping acts)."""
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 5)))
        for k in range(group_size):
            completion = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 7)))
            behaviour = tuple(-4.0 - 0.2 * rng.random() for _ in completion)
            reward = float(k % 2 == 0) if g % 2 == 0 else float(rng.random() < 0.5 or k == 0)
            if k == group_size - 1 and reward == 1.0 and g % 2:
                reward = 0.0
            rows.append(TrainRow(prompt, completion, behaviour, reward, f"g{g}", (1,) * len(completion), 1.0))
    return TrainBatch(tuple(rows))


def step_grads(trainer, rows) -> dict[str, torch.Tensor]:
    """The full gradient of one real `trainer.step(rows)`, captured just before AdamW applies it."""
    grads: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in trainer.model.named_parameters()}

    def capture(optimizer, args, kwargs):
        grads.update(
            {
                names[id(p)]: p.grad.detach().cpu().clone()
                for g in optimizer.param_groups
                for p in g["params"]
                if p.grad is not None
            }
        )

    handle = trainer.optimizer.register_step_pre_hook(capture)
    try:
        assert trainer.step(rows).outcome == "applied"
    finally:
        handle.remove()
    return grads
