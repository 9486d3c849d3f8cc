"""bf16 autocast, gradient checkpointing, token-capped micro-batches and pinned RNG on the one Trainer path."""

from __future__ import annotations

import torch
from scaleout_testlib import batch, step_grads, tiny_model

from posttrain.configs.trainer import TrainerConfig
from posttrain.trainer.memory import bytes_per_token, token_budget
from posttrain.trainer.trainer import Trainer


def _grads(cfg: TrainerConfig, counter: list[int] | None = None) -> tuple[Trainer, dict[str, torch.Tensor]]:
    model = tiny_model(0)
    trainer = Trainer(model, cfg)  # its construction runs probe forwards (split_head, shares_prompts): not counted
    if counter is not None:
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *a: counter.append(1))
    grads = step_grads(trainer, batch(5))
    return trainer, grads


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def test_gradient_checkpointing_recomputes_and_keeps_gradients():
    plain_calls, ckpt_calls = [], []
    _, plain = _grads(TrainerConfig(micro_batch_size=4), plain_calls)
    _, ckpt = _grads(TrainerConfig(micro_batch_size=4, gradient_checkpointing=True), ckpt_calls)
    assert len(ckpt_calls) == 2 * len(plain_calls)  # each layer body (its mlp) runs again in backward
    assert _close(plain, ckpt, 1e-6)


def test_token_cap_cuts_more_micro_batches_same_gradient():
    few, many = [], []
    _, full = _grads(TrainerConfig(micro_batch_size=16), few)
    _, capped = _grads(TrainerConfig(micro_batch_size=16, micro_batch_tokens=20), many)
    assert len(many) > len(few)
    assert _close(full, capped, 1e-6)


def test_bf16_autocast_step_is_close_and_keeps_fp32_weights():
    ref = Trainer(tiny_model(0), TrainerConfig(lr=1e-3)).step(batch(5))
    trainer = Trainer(tiny_model(0), TrainerConfig(lr=1e-3, precision="bf16_autocast"))
    st = trainer.step(batch(5))
    assert st.outcome == "applied"
    assert abs(st.loss - ref.loss) < 0.05 * max(abs(ref.loss), 1e-2)
    assert abs(st.grad_norm - ref.grad_norm) < 0.05 * ref.grad_norm
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_pinned_rng_gives_identical_steps():
    try:
        runs = []
        for _ in range(2):
            trainer = Trainer(tiny_model(0), TrainerConfig(lr=1e-2, deterministic=True))
            for s in range(2):
                trainer.step(batch(20 + s))
            runs.append([p.detach().clone() for p in trainer.model.parameters()])
        assert torch.are_deterministic_algorithms_enabled()
        assert all(torch.equal(a, b) for a, b in zip(*runs))
    finally:
        torch.use_deterministic_algorithms(False)


def test_auto_budget_is_none_on_cpu_and_estimate_scales():
    model = tiny_model(0)
    assert token_budget("auto", model, torch.device("cpu"), False) is None
    assert token_budget(64, model, torch.device("cpu"), False) == 64
    assert bytes_per_token(model, True) < bytes_per_token(model, False)
