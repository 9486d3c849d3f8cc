"""Trainer.step on a tiny random Qwen2: log-probs, micro-batching, filtering, KL, the guard."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_testlib import (
    optimizer_tensors,
    params_of,
    reference_logprobs,
    same_params,
    sample,
    synthetic_batch,
    tiny_model,
)

from posttrain.configs.trainer import DrGRPOLossConfig, GuardConfig, TrainerConfig
from posttrain.errors import ConfigError, TrainerError
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer


def grads_after_one_backward(model, config, batch):
    """Run a step with lr ~ 0 and capture the accumulated gradient before it is zeroed."""
    trainer = Trainer(model, config)
    captured = []
    capture = lambda: captured.extend(p.grad.clone() for p in trainer.params)  # noqa: E731
    trainer.optimizer.step = capture  # type: ignore[method-assign]
    stats = trainer.step(batch)
    return stats, captured


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_on_policy_ratios_are_one(temperature):
    """Tokens sampled by an engine-like loop (log_softmax(logits / T)) score the same here."""
    model = tiny_model(0)
    gen = torch.Generator().manual_seed(1)
    rows = []
    for g in range(2):
        prompt = tuple(range(3 + g, 7 + 2 * g))
        for k in range(3):
            t = temperature if temperature > 0 else 1.0
            completion, logps = sample(model, prompt, 2 + k, t, gen)
            rows.append(TrainRow(prompt, completion, logps, float(k == 0), g, (1,) * len(completion), temperature))
    stats = Trainer(model, TrainerConfig(micro_batch_size=2)).step(TrainBatch(tuple(rows)))
    assert stats.outcome == "applied"
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.ratio_max == pytest.approx(1.0, abs=1e-5)
    assert stats.clip_frac == 0.0
    assert stats.n_tokens == sum(len(r.completion_ids) for r in rows)


def test_engine_logprobs_match_the_trainer():
    """The hf engine's KV-cached sampling and the trainer's padded forward agree."""
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import random_model
    from posttrain.types import GenerationRequest, SamplingParams

    model, tok = random_model("micro", seed=3)
    engine = HFEngine(model, tok, seed=5)
    params = SamplingParams(max_tokens=6, temperature=0.8, n=4)
    prompts = [tuple(tok.encode("ab")), tuple(tok.encode("hello there"))]
    groups = engine.generate([GenerationRequest(p, params) for p in prompts])
    rows = tuple(
        TrainRow.from_completion(c, float(j % 2), i, 0.8) for i, g in enumerate(groups) for j, c in enumerate(g)
    )
    stats = Trainer(model, TrainerConfig(micro_batch_size=3)).step(TrainBatch(rows))
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert stats.ratio_max == pytest.approx(1.0, abs=1e-4)


def test_padding_matches_one_sequence_at_a_time():
    """Right-padded micro-batches give each row the log-probs of its own unpadded forward."""
    model = tiny_model(0)
    batch = synthetic_batch(seed=3, model=None)
    with_ref = TrainBatch(
        tuple(
            TrainRow(
                r.prompt_ids,
                r.completion_ids,
                reference_logprobs(model, r.prompt_ids, r.completion_ids),
                r.reward,
                r.group_id,
                r.loss_mask,
            )
            for r in batch.rows
        )
    )
    stats = Trainer(model, TrainerConfig(micro_batch_size=5)).step(with_ref)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5) and stats.ratio_max == pytest.approx(1.0, abs=1e-5)


def test_micro_batching_gives_the_full_batch_gradient():
    batch = synthetic_batch(seed=4)
    _, full = grads_after_one_backward(tiny_model(0), TrainerConfig(micro_batch_size=64, grad_clip=1e9), batch)
    stats, split = grads_after_one_backward(tiny_model(0), TrainerConfig(micro_batch_size=3, grad_clip=1e9), batch)
    assert stats.n_sequences == 8
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("normalise", ["sampled", "kept"])
def test_all_zero_advantage_groups_contribute_nothing(normalise):
    """Dropping a group without signal, inside the trainer or before it (then counted in
    filtered_rows/filtered_tokens under `sampled`), gives the same gradient."""
    batch = synthetic_batch(seed=5)  # group g2 has reward 1 everywhere
    dropped = [r for r in batch.rows if r.group_id == "g2"]
    counts = {"filtered_rows": len(dropped), "filtered_tokens": sum(r.n_loss_tokens for r in dropped)}
    signal_only = TrainBatch(
        tuple(r for r in batch.rows if r.group_id != "g2"), **(counts if normalise == "sampled" else {})
    )
    config = TrainerConfig(normalise=normalise)
    s_all, g_all = grads_after_one_backward(tiny_model(0), config, batch)
    s_sig, g_sig = grads_after_one_backward(tiny_model(0), config, signal_only)
    assert (s_all.n_groups, s_all.zero_adv_groups, s_all.n_rows, s_all.n_sequences) == (3, 1, 12, 8)
    assert s_sig.zero_adv_groups == 0
    for a, b in zip(g_all, g_sig):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo"])
def test_sampled_normalisation_scales_the_step_by_the_informative_share(loss):
    """The first step from the same weights: every token weight of `sampled` is the `kept`
    one times kept/sampled (sequences for grpo and dr_grpo: 8 of 12; loss tokens for dapo),
    so the loss and the gradient norm scale by exactly that share."""
    batch = synthetic_batch(seed=5)  # 3 groups of 4; g2 carries no signal
    kept_rows = [r for r in batch.rows if r.group_id != "g2"]
    share = {
        "grpo": 8 / 12,
        "dr_grpo": 8 / 12,
        "dapo": sum(r.n_loss_tokens for r in kept_rows) / sum(r.n_loss_tokens for r in batch.rows),
    }[loss]
    loss_config = {"type": loss, "max_completion_tokens": 6} if loss == "dr_grpo" else {"type": loss}
    stats = {}
    for normalise in ("kept", "sampled"):
        config = TrainerConfig(loss=loss_config, normalise=normalise, grad_clip=1e9)
        stats[normalise], _ = grads_after_one_backward(tiny_model(0), config, batch)
    assert stats["sampled"].loss == pytest.approx(stats["kept"].loss * share, rel=1e-5)
    assert stats["sampled"].grad_norm == pytest.approx(stats["kept"].grad_norm * share, rel=1e-5)
    assert stats["sampled"].n_sequences == stats["kept"].n_sequences == 8


def test_a_batch_without_signal_does_not_step_without_coast():
    model = tiny_model(0)
    before = params_of(model)
    rows = tuple(TrainRow((1, 2), (3, 4), (-1.0, -1.0), 0.5, "g", (1, 1)) for _ in range(4))
    trainer = Trainer(model, TrainerConfig(weight_decay=0.1, coast=False))
    stats = trainer.step(TrainBatch(rows))
    assert stats.outcome == "no_signal" and not stats.weights_changed and stats.zero_adv_groups == 1
    assert same_params(before, params_of(model)) and not trainer.optimizer.state


@pytest.mark.parametrize("filtered_before", [False, True])
def test_a_step_without_signal_is_adams_zero_gradient_step(filtered_before):
    """With trainer.coast (the default) a step whose groups all carry no signal (passed in, or all filtered
    before the trainer: no rows, only counts) is the optimizer step of a zero gradient,
    derived by hand from the AdamW update: m <- b1 m, v <- b2 v, t <- t + 1,
    p <- p (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)."""
    model = tiny_model(0)
    config = TrainerConfig(weight_decay=0.1, lr=1e-2)
    trainer = Trainer(model, config)
    assert trainer.step(synthetic_batch(seed=5)).outcome == "applied"
    before = [p.detach().clone() for p in trainer.params]
    state = [trainer.optimizer.state[p] for p in trainer.params]
    m0, v0 = [s["exp_avg"].clone() for s in state], [s["exp_avg_sq"].clone() for s in state]
    t = int(state[0]["step"]) + 1
    rows = tuple(TrainRow((1, 2), (3, 4), (-1.0, -1.0), 0.5, "g", (1, 1)) for _ in range(4))
    batch = TrainBatch((), filtered_rows=4, filtered_tokens=8) if filtered_before else TrainBatch(rows)
    stats = trainer.step(batch)
    assert stats.outcome == "coasted" and stats.weights_changed and stats.loss == 0.0 and stats.grad_norm == 0.0
    (b1, b2), lr, wd, eps = config.betas, config.lr, config.weight_decay, 1e-8
    moved = 0
    for p, p0, m, v in zip(trainer.params, before, m0, v0):
        m, v = b1 * m, b2 * v
        expected = p0 * (1 - lr * wd) - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-7)
        moved += int(not torch.equal(p.detach(), p0))
    assert moved == len(before)  # every tensor moved: the moments carried the update on
    assert trainer.steps == 2 and len(trainer.guard.state_dict()["losses"]) == 1  # the guard judged no zero step


def test_a_batch_of_no_rows_needs_filtered_rows():
    with pytest.raises(TrainerError, match="nothing was sampled"):
        TrainBatch(())


def test_masked_tokens_are_not_trained_but_condition_later_ones():
    model = tiny_model(0)
    prompt, completion = (5, 6, 7), (8, 9, 10, 11)
    lp = reference_logprobs(model, prompt, completion)
    masked = [TrainRow(prompt, completion, (lp[0], -500.0, -500.0, lp[3]), r, "g", (1, 0, 0, 1)) for r in (1.0, 0.0)]
    stats = Trainer(model, TrainerConfig()).step(TrainBatch(tuple(masked)))
    assert stats.n_tokens == 4 and stats.ratio_max == pytest.approx(1.0, abs=1e-5)


def test_kl_needs_a_reference_model():
    with pytest.raises(ConfigError, match="kl_coef"):
        Trainer(tiny_model(0), TrainerConfig(kl_coef=0.1))
    with pytest.raises(ConfigError, match="kl_coef"):
        Trainer(tiny_model(0), TrainerConfig(), ref_model=tiny_model(0))


def test_kl_to_reference_starts_at_zero_then_grows():
    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig(kl_coef=0.1, lr=1e-2), ref_model=copy.deepcopy(model))
    first = trainer.step(synthetic_batch(seed=6))
    second = trainer.step(synthetic_batch(seed=7))
    assert first.kl == 0.0
    assert second.kl > 1e-6


def test_bad_rows_are_rejected_with_the_field_named():
    with pytest.raises(TrainerError, match="behaviour_logprobs"):
        TrainRow((1,), (2, 3), (-1.0,), 1.0, "g", (1, 1))
    with pytest.raises(TrainerError, match="loss_mask"):
        TrainRow((1,), (2,), (-1.0,), 1.0, "g", (2,))
    with pytest.raises(TrainerError, match="prompt_ids"):
        TrainRow((), (2,), (-1.0,), 1.0, "g", (1,))
    with pytest.raises(TrainerError, match="reward"):
        TrainRow((1,), (2,), (-1.0,), float("nan"), "g", (1,))
    with pytest.raises(TrainerError, match="rows"):
        TrainBatch(())
    out_of_vocab = TrainBatch(
        (TrainRow((1,), (64,), (-1.0,), 1.0, "g", (1,)), TrainRow((1,), (2,), (-1.0,), 0.0, "g", (1,)))
    )
    with pytest.raises(TrainerError, match=r"rows\[0\]\.completion_ids"):
        Trainer(tiny_model(0), TrainerConfig()).step(out_of_vocab)


# ---------------------------------------------------------------- the guard


def nan_logits(model):
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out * float("nan"))


def test_nan_step_is_skipped_and_changes_nothing():
    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig())
    trainer.step(synthetic_batch(seed=1))
    before, opt_before = params_of(model), optimizer_tensors(trainer.optimizer)
    hook = nan_logits(model)
    stats = trainer.step(synthetic_batch(seed=2))
    hook.remove()
    assert stats.outcome == "skipped" and "non-finite" in stats.guard_reason and stats.skipped_total == 1
    assert same_params(before, params_of(model))
    assert same_params(opt_before, optimizer_tensors(trainer.optimizer))
    assert all(p.grad is None for p in trainer.params)
    assert trainer.step(synthetic_batch(seed=3)).outcome == "applied"  # training continues


def test_rollback_restores_the_last_good_state_exactly():
    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig(guard=GuardConfig(action="rollback")))
    trainer.step(synthetic_batch(seed=1))
    good, opt_good = params_of(model), optimizer_tensors(trainer.optimizer)  # start of the last good step
    assert trainer.step(synthetic_batch(seed=2)).outcome == "applied"
    assert not same_params(good, params_of(model))
    hook = nan_logits(model)
    stats = trainer.step(synthetic_batch(seed=3))
    hook.remove()
    assert stats.outcome == "rolled_back" and stats.rolled_back_total == 1 and stats.weights_changed
    assert same_params(good, params_of(model))
    assert same_params(opt_good, optimizer_tensors(trainer.optimizer))


def test_grad_norm_spike_is_skipped():
    config = TrainerConfig(loss=DrGRPOLossConfig(max_completion_tokens=6), guard=GuardConfig(min_history=2))
    model = tiny_model(0)
    trainer = Trainer(model, config)
    for seed in range(3):
        assert trainer.step(synthetic_batch(seed=seed)).outcome == "applied"
    spiky = synthetic_batch(seed=9)
    spiky = TrainBatch(
        tuple(
            TrainRow(r.prompt_ids, r.completion_ids, r.behaviour_logprobs, 1e4 * r.reward, r.group_id, r.loss_mask)
            for r in spiky.rows
        )
    )
    before = params_of(model)
    stats = trainer.step(spiky)
    assert stats.outcome == "skipped" and "spike" in stats.guard_reason
    assert same_params(before, params_of(model))
    assert trainer.state_dict()["guard"]["grad_norms"].__len__() == 3  # the spike did not enter the median


@pytest.mark.parametrize(
    "loss",
    [
        {"type": "grpo"},
        {"type": "dr_grpo", "max_completion_tokens": 1},
        {"type": "dapo"},
        {"type": "rloo"},
        {"type": "reinforce_pp"},
        {"type": "gspo"},
        {"type": "cispo"},
    ],
)
def test_rl_raises_the_probability_of_rewarded_tokens(loss):
    """A one-token bandit: reward 1 for a token id below 32. On-policy GRPO-family
    steps must move probability mass onto the rewarded half of the vocabulary."""
    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig(loss=loss, lr=1e-2))
    prompt, gen = (3, 4, 5), torch.Generator().manual_seed(0)

    def p_rewarded() -> float:
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([prompt])).logits[0, -1].softmax(-1)[:32].sum())

    before = p_rewarded()
    for _ in range(15):
        rows = []
        for g in range(4):
            for _ in range(8):
                tok, lp = sample(model, prompt, 1, 1.0, gen)
                rows.append(TrainRow(prompt, tok, lp, float(tok[0] < 32), g, (1,)))
        trainer.step(TrainBatch(tuple(rows)))
    assert p_rewarded() > before + 0.3, (before, p_rewarded())


def test_a_cpu_step_hands_its_freed_memory_back(monkeypatch):
    import posttrain.trainer.trainer as trainer_module

    calls = []
    monkeypatch.setattr(trainer_module, "release_freed_memory", lambda device: calls.append(device.type) or True)
    trainer = Trainer(tiny_model(0), TrainerConfig())
    trainer.step(synthetic_batch(seed=4))
    assert calls == ["cpu"]  # once, after the step's activations are freed
