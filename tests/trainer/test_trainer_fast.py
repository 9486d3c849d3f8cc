"""The fast defaults: automatic micro-batches, the LM head on loss tokens only, tensor packing.
None of them may change what a step computes (only float summation order)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from trainer_testlib import VOCAB, reference_logprobs, synthetic_batch, tiny_model

from posttrain.configs.trainer import TrainerConfig, load_trainer_config
from posttrain.errors import ConfigError
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer, cost_slices, pack_rows, split_head


class ScaledLogits(torch.nn.Module):
    """A causal LM whose logits are 2 x lm_head(hidden): splitting off the head would be wrong."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def get_decoder(self):
        return self.inner.get_decoder()

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids, attention_mask, logits_to_keep=0):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep)
        out.logits = out.logits * 2.0
        return out


def test_cost_slices_by_hand():
    # one pass costs 128 + rows x longest. [10]*4 + [50]: together 128 + 5*50 = 378, apart
    # (128 + 4*10) + (128 + 50) = 346 -> cut. [10, 10, 12]: together 164, apart 288 -> one pass.
    assert cost_slices([10, 10, 10, 10, 50], None) == [(0, 4), (4, 5)]
    assert cost_slices([10, 10, 12], None) == [(0, 3)]
    assert cost_slices([], None) == []
    # the padded-token budget still binds: 3 x 10 = 30 fits 30, not 25
    assert cost_slices([10, 10, 10], 30) == [(0, 3)]
    assert cost_slices([10, 10, 10], 25) == [(0, 2), (2, 3)]


def test_split_head_only_when_it_gives_the_model_logits():
    model = tiny_model(0)
    assert split_head(model) is not None
    assert split_head(ScaledLogits(tiny_model(0))) is None


def test_packing_indexes_every_loss_token():
    rows = [
        TrainRow((1, 2, 3), (4, 5), (-1.0, -2.0), 1.0, "g", (1, 0)),
        TrainRow((6,), (7, 8, 9), (-3.0, -4.0, -5.0), 0.0, "g", (1, 1, 1)),
    ]
    p = pack_rows(rows, torch.device("cpu"))
    assert p.input_ids_bs.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert p.attention_bs.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert p.index_bc.tolist() == [[2, 3, 3], [0, 1, 2]]  # prompt length - 1 + c, padding clamped
    assert (p.row_n.tolist(), p.pos_n.tolist(), p.target_n.tolist()) == ([0, 1, 1, 1], [2, 0, 1, 2], [4, 7, 8, 9])
    assert p.behaviour_bc.tolist() == [[-1.0, -2.0, 0.0], [-3.0, -4.0, -5.0]]


@pytest.mark.parametrize("wrap", [False, True])
def test_auto_micro_batches_and_the_split_head_give_the_same_step(wrap):
    """Auto micro-batches with the head on loss tokens, against micro-batches of 3 through the
    model's forward (a wrapper the trainer cannot split): same loss and gradient norm."""
    batch = synthetic_batch(seed=4)
    ref = Trainer(tiny_model(0), TrainerConfig(micro_batch_size=3, grad_clip=1e9))
    ref._split_head = None  # the model's own forward
    model = ScaledLogits(tiny_model(0)) if wrap else tiny_model(0)
    fast = Trainer(model, TrainerConfig(grad_clip=1e9))
    assert (fast._split_head is None) == wrap
    a = ref.step(batch)
    b = fast.step(batch)
    if wrap:  # doubled logits: a different policy, but still run through its forward
        assert b.outcome == "applied"
        return
    assert b.loss == pytest.approx(a.loss, abs=1e-6)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    assert b.entropy == pytest.approx(a.entropy, rel=1e-5)


def test_on_policy_ratios_are_one_through_the_split_head():
    model = tiny_model(0)
    batch = synthetic_batch(seed=3)
    rows = tuple(
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
    stats = Trainer(model, TrainerConfig()).step(TrainBatch(rows))
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5) and stats.ratio_max == pytest.approx(1.0, abs=1e-5)


def test_micro_batch_size_is_auto_or_a_positive_int():
    assert TrainerConfig().micro_batch_size == "auto"
    assert load_trainer_config({"micro_batch_size": 256}).micro_batch_size == 256
    with pytest.raises(ConfigError, match="micro_batch_size"):
        load_trainer_config({"micro_batch_size": 0})
    with pytest.raises(ConfigError, match="normalise"):
        load_trainer_config({"normalise": "tokens"})


def test_cost_slices_with_shared_prompts_by_hand():
    # 8 rows of prompt A (5 tokens + 1) and 8 of prompt B (40 + 1). Whole sequences: together
    # 128 + 16*41 = 784, apart (128 + 8*6) + (128 + 8*41) = 632 -> cut. Each distinct prompt once:
    # together 2*128 + 2*40 + 16*(1 - 1) = 336; apart min(176, 261) + min(456, 296) = 472 -> one pass.
    lengths = [6] * 8 + [41] * 8
    a, b = (1,) * 5, (2,) * 40
    assert cost_slices(lengths, None) == [(0, 8), (8, 16)]
    assert cost_slices(lengths, None, [a] * 8 + [b] * 8) == [(0, 16)]
    # the padded-token budget still binds: 16 x 41 > 400, 9 x 41 <= 400
    assert cost_slices(lengths, 400, [a] * 8 + [b] * 8) == [(0, 9), (9, 16)]


def _grads(trainer: Trainer, batch: TrainBatch) -> tuple[float, float, list[torch.Tensor]]:
    prepared = trainer._prepare(batch)
    acc = trainer._accumulate(prepared)
    grads = [p.grad.clone() for p in trainer.params]
    trainer.optimizer.zero_grad(set_to_none=True)
    return acc.loss, acc.entropy_sum, grads


def test_each_prompt_forwarded_once_gives_the_same_gradients():
    """Rows sharing prompts (groups of 6, tool tokens masked out, one-token completions among
    them) through the prompts-once pass and through whole sequences: the same loss, entropy and
    gradient up to float summation order."""
    rng = random.Random(5)
    rows = []
    for g in range(4):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(20, 40)))
        for k in range(6):
            completion = tuple(rng.randrange(VOCAB) for _ in range(1 if k == 0 else rng.randint(2, 6)))
            mask = (1,) + tuple(int(i % 3 != 1) for i in range(1, len(completion)))
            behaviour = tuple(-4.0 - 0.1 * rng.random() for _ in completion)
            rows.append(TrainRow(prompt, completion, behaviour, float(k % 2), g, mask))
    batch = TrainBatch(tuple(rows))
    shared, whole = Trainer(tiny_model(0), TrainerConfig()), Trainer(tiny_model(0), TrainerConfig())
    whole._share_prompts = False
    assert shared._share_prompts  # the probe accepts a Qwen2 decoder
    assert pack_rows(rows, torch.device("cpu"), share=True).shared is not None  # the shared pass is taken
    assert any(len(r.completion_ids) == 1 for r in rows) and any(0 in r.loss_mask for r in rows)
    loss_a, entropy_a, grads_a = _grads(whole, batch)
    loss_b, entropy_b, grads_b = _grads(shared, batch)
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert entropy_b == pytest.approx(entropy_a, rel=1e-5)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_prompts_are_shared_only_when_that_forwards_fewer_tokens():
    distinct = [TrainRow((i, i + 1, i + 2), (4, 5), (-1.0, -1.0), 0.0, i, (1, 1)) for i in range(8)]
    assert pack_rows(distinct, torch.device("cpu"), share=True).shared is None  # nothing shared
    group = [TrainRow(tuple(range(1, 30)), (4, 5, k % 7 + 1), (-1.0,) * 3, 0.0, 0, (1, 1, 1)) for k in range(8)]
    p = pack_rows(group, torch.device("cpu"), share=True).shared
    assert p is not None and p.prompt_ids_us.shape == (1, 29) and p.input_ids_bc.tolist() == [[4, 5]] * 8
    assert p.position_bc[0].tolist() == [29, 30] and p.last_u.tolist() == [28]


@pytest.mark.parametrize("loss", [{"type": "grpo"}, {"type": "dr_grpo", "max_completion_tokens": 8}, {"type": "rloo"}])
def test_a_row_with_a_baseline_is_judged_against_it_not_its_group(loss):
    """TrainRow.baseline (a derived task's fresh-attempt reward, tasks.branch.baseline: fresh): the row's
    advantage is reward - baseline whatever the loss; a group of equal rewards below its baseline carries
    signal (pushed down) and is trained; the rows without one keep the loss's group advantages."""
    rng = random.Random(3)

    def row(group, reward, baseline=None):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(6))
        completion = tuple(rng.randrange(VOCAB) for _ in range(3))
        return TrainRow(prompt, completion, (-4.0,) * 3, reward, group, (1, 1, 1), baseline=baseline)

    rows = (row(0, 0.0, 0.25), row(0, 0.0, 0.25), row(1, 1.0, 0.25), row(1, 0.0, 0.25), row(2, 1.0), row(2, 0.0))
    trainer = Trainer(tiny_model(0), TrainerConfig(loss=loss))
    prepared = trainer._prepare(TrainBatch(rows))
    adv = prepared.batch_advantage_b.tolist()
    assert adv[:4] == pytest.approx([-0.25, -0.25, 0.75, -0.25])
    plain = trainer._prepare(TrainBatch(rows[4:])).batch_advantage_b.tolist()
    assert adv[4:] == pytest.approx(plain) and plain[0] > 0 > plain[1]
    assert prepared.zero_adv_groups == 0 and len(prepared.rows) == 6  # group 0: equal rewards, still trained
    # the same group without its baseline has no signal and is left out
    assert trainer._prepare(TrainBatch(tuple(replace(r, baseline=None) for r in rows[:2]))).zero_adv_groups == 1
