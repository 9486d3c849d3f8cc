"""The LM head a chunk of positions at a time (trainer.logits_chunk_mib, trainer/chunked.py): the
same log-probs, entropies, losses and gradients as one pass over every loss position, and no
positions x vocabulary tensor held, forward or backward."""

from __future__ import annotations

import random

import pytest
import torch
from trainer_testlib import VOCAB, synthetic_batch, tiny_model

from posttrain.configs.trainer import LoraConfig, TrainerConfig
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.chunked import chunk_positions, token_logp_entropy
from posttrain.trainer.trainer import Trainer

SMOLLM2_VOCAB = 49_152


def _mib(positions: int, vocab: int) -> float:
    """The trainer.logits_chunk_mib that gives chunks of `positions` positions."""
    return positions * 4 * vocab / 2**20


def test_chunk_positions_from_the_memory_cap():
    # 64 MiB of float32 logits over 49,152 tokens: 2^26 / (4 x 49,152) = 341.33 -> 341 positions
    assert chunk_positions(64.0, SMOLLM2_VOCAB) == 341
    assert chunk_positions(_mib(3, VOCAB), VOCAB) == 3
    assert chunk_positions(1e-9, VOCAB) == 1  # never below one position
    assert chunk_positions(None, VOCAB) is None


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunks_give_the_one_pass_values_and_gradients(entropy_grad):
    """11 positions in chunks of 3 (the last one short) against one pass: log-probs, entropies,
    and the gradients of a loss over both into the hidden states and the head (fp32)."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 50)
    hidden_nh = torch.randn(11, 8, generator=gen)
    target_n = torch.randint(0, 50, (11,), generator=gen)
    temperature_n = torch.tensor([1.0, 0.7, 1.3] * 3 + [1.0, 0.5])
    weight_n, entropy_weight_n = torch.randn(11, generator=gen), torch.randn(11, generator=gen)
    results = []
    for chunk in (None, 3):
        head.zero_grad(set_to_none=True)
        h = hidden_nh.clone().requires_grad_()
        logp_n, entropy_n = token_logp_entropy(head, h, target_n, temperature_n, chunk, entropy_grad)
        loss = (weight_n * logp_n).sum() + (entropy_weight_n * entropy_n).sum()
        loss.backward()
        assert entropy_n.requires_grad == entropy_grad
        results.append((logp_n.detach(), entropy_n.detach(), h.grad, head.weight.grad, head.bias.grad))
    for one_pass, chunked in zip(*results):
        torch.testing.assert_close(chunked, one_pass, rtol=1e-6, atol=1e-6)


def _grads(trainer: Trainer, batch: TrainBatch) -> tuple[float, float, list[torch.Tensor]]:
    acc = trainer._accumulate(trainer._prepare(batch))
    grads = [p.grad.clone() for p in trainer.params]
    trainer.optimizer.zero_grad(set_to_none=True)
    return acc.loss, acc.entropy_sum, grads


def _llama(vocab: int = VOCAB):
    """A tiny LlamaForCausalLM shaped like SmolLM2 (tied embeddings, grouped KV heads)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config)


MODELS = {
    "qwen2": lambda: tiny_model(0),
    "qwen2-tied": lambda: tiny_model(0, tied=True),
    "llama-tied": _llama,
}


def _bonus_batch() -> TrainBatch:
    """synthetic_batch with an entropy bonus on half its rows and two temperatures."""
    rows = []
    for i, r in enumerate(synthetic_batch(seed=4).rows):
        rows.append(
            TrainRow(
                r.prompt_ids,
                r.completion_ids,
                r.behaviour_logprobs,
                r.reward,
                r.group_id,
                r.loss_mask,
                temperature=0.7 if i % 3 else 1.0,
                entropy_coef=0.05 if i % 2 else 0.0,
            )
        )
    return TrainBatch(tuple(rows))


@pytest.mark.parametrize("name", [*MODELS, "qwen2-lora-head"])
def test_a_chunked_step_equals_the_one_pass_step(name):
    """Chunks of 3 loss positions against every position at once: the same loss, entropy and
    gradient of every trainable parameter (untied, tied, a Llama, LoRA on the head itself),
    with the entropy bonus's gradient and two temperatures in the batch."""
    lora = LoraConfig(rank=4, target_modules=("q_proj", "lm_head")) if name.endswith("lora-head") else None
    build = MODELS.get(name, MODELS["qwen2"])
    one_pass = Trainer(build(), TrainerConfig(logits_chunk_mib=None, lora=lora))
    chunked = Trainer(build(), TrainerConfig(logits_chunk_mib=_mib(3, VOCAB), lora=lora))
    assert chunked._chunk == 3 and one_pass._chunk is None and chunked._split_head is not None
    batch = _bonus_batch()
    loss_a, entropy_a, grads_a = _grads(one_pass, batch)
    loss_b, entropy_b, grads_b = _grads(chunked, batch)
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert entropy_b == pytest.approx(entropy_a, rel=1e-6)
    assert len(grads_a) == len(grads_b) > 0
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_chunked_token_logprobs_and_the_reference_model_match():
    """token_logprobs (no gradient, chunked by a plain loop) and the KL term's reference
    log-probs give the one-pass values."""
    batch = synthetic_batch(seed=2)
    cfgs = [TrainerConfig(kl_coef=0.1, logits_chunk_mib=m) for m in (None, _mib(2, VOCAB))]
    trainers = [Trainer(tiny_model(0), cfg, ref_model=tiny_model(1)) for cfg in cfgs]
    a, b = (t.token_logprobs(batch.rows) for t in trainers)
    assert [len(x) for x in a] == [len(x) for x in b]
    assert torch.allclose(torch.tensor(sum(a, ())), torch.tensor(sum(b, ())), atol=1e-6)
    (loss_a, _, grads_a), (loss_b, _, grads_b) = (_grads(t, batch) for t in trainers)
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    for x, y in zip(grads_a, grads_b):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-7)


class _Recorder:
    """Records the shape of every input the LM head sees, and every tensor saved for backward
    outside a checkpointed chunk, whose size reaches the vocabulary."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.head_inputs: list[tuple[int, ...]] = []
        self.saved: list[tuple[int, ...]] = []

    def head_hook(self, _module, args) -> None:
        self.head_inputs.append(tuple(args[0].shape))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.vocab in t.shape:
            self.saved.append(tuple(t.shape))
        return t


def test_the_head_never_sees_more_than_a_chunk_with_smollm2s_vocabulary():
    """A Llama with SmolLM2's 49,152-token vocabulary, 4 rows of 40-token prompts and
    250-token completions (1,000 loss tokens in one micro-batch): with the default 64 MiB,
    every LM-head call, forward or recomputed in backward, covers at most 341 positions and
    no [batch, sequence, vocabulary] or [loss tokens, vocabulary] tensor is saved for backward."""
    model = _llama(SMOLLM2_VOCAB)
    trainer = Trainer(model, TrainerConfig())
    assert trainer._chunk == 341
    rng = random.Random(0)
    rows = tuple(
        TrainRow(
            tuple(rng.randrange(SMOLLM2_VOCAB) for _ in range(40)),
            tuple(rng.randrange(SMOLLM2_VOCAB) for _ in range(250)),
            (-10.0,) * 250,
            float(k % 2),
            "g",
            (1,) * 250,
        )
        for k in range(4)
    )
    rec = _Recorder(SMOLLM2_VOCAB)
    handle = model.get_output_embeddings().register_forward_pre_hook(rec.head_hook)
    try:
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            stats = trainer.step(TrainBatch(rows))
    finally:
        handle.remove()
    assert stats.outcome == "applied" and stats.n_tokens == 1000
    # forward: 341 + 341 + 318; backward recomputes each chunk once
    assert sorted(s[0] for s in rec.head_inputs) == sorted([341, 341, 318] * 2)
    assert all(len(s) == 2 for s in rec.head_inputs)  # gathered loss positions, never [batch, seq, hidden]
    assert rec.saved == [] or max(torch.Size(s).numel() for s in rec.saved) <= 341 * SMOLLM2_VOCAB
