"""Sequence packing without padding (trainer.packing_tokens): rows back to back in one sequence,
position ids restarting per row, attention within each row; the step equals the padded step."""

from __future__ import annotations

import random

import pytest
import torch
from test_trainer_chunked import _grads, _llama, _mib
from trainer_testlib import VOCAB, tiny_model

from posttrain.configs.trainer import TrainerConfig, load_trainer_config
from posttrain.errors import ConfigError
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer, pack_bins, pack_sequence


def test_pack_bins_by_hand():
    # first fit by decreasing length into 10 tokens: 7 -> bin 0 (room 3), 6 -> bin 1 (room 4),
    # 4 -> bin 1 (room 0), 3 -> bin 0 (room 0), 2 -> bin 2; a 12-token row is a bin of its own
    assert pack_bins([3, 7, 2, 6, 4], 10) == [[0, 1], [3, 4], [2]]
    assert pack_bins([12, 1], 10) == [[0], [1]]
    assert pack_bins([], 10) == []


def test_pack_sequence_restarts_positions_per_row():
    rows = [
        TrainRow((1, 2, 3), (4, 5), (-1.0, -2.0), 1.0, "g", (1, 0)),
        TrainRow((6,), (7, 8, 9), (-3.0, -4.0, -5.0), 0.0, "g", (1, 1, 1)),
    ]
    p = pack_sequence(rows, torch.device("cpu"))
    assert p.input_ids_bs.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert p.position_bs is not None and p.position_bs.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    # loss tokens: row 0's token 4 (predicted at 2), row 1's 7, 8, 9 (at 5 + 0, 1, 2)
    assert (p.row_n.tolist(), p.pos_n.tolist(), p.target_n.tolist()) == ([0, 1, 1, 1], [2, 5, 6, 7], [4, 7, 8, 9])
    assert p.sequence_n.tolist() == [0, 0, 0, 0] and "attention_mask" not in p.decoder_inputs()


def _mixed_batch(seed: int = 0) -> TrainBatch:
    """4 groups of 4 rows, prompts of 3-20 tokens and completions of 1-30: lengths from 4 to 50."""
    rng = random.Random(seed)
    rows = []
    for g in range(4):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(3, 20)))
        for k in range(4):
            completion = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 30)))
            behaviour = tuple(-4.0 - 0.1 * rng.random() for _ in completion)
            mask = tuple(int(i % 5 != 3) for i in range(len(completion)))
            rows.append(TrainRow(prompt, completion, behaviour, float(k % 2), g, mask, 0.8, entropy_coef=0.01 * g))
    return TrainBatch(tuple(rows))


@pytest.mark.parametrize("name", ["qwen2", "llama-tied", "qwen2-forward"])
def test_a_packed_step_equals_the_padded_step(name):
    """Rows packed into sequences of at most 64 tokens (LM head in chunks of 5; or, for
    qwen2-forward, the model's own forward) against right-padded micro-batches of 3 rows (one
    pass over the head): the same loss, entropy and gradient of every parameter, with a
    reference model for the KL term."""
    build = _llama if name == "llama-tied" else (lambda: tiny_model(0))
    padded = Trainer(build(), TrainerConfig(micro_batch_size=3, logits_chunk_mib=None, kl_coef=0.05), build())
    packed = Trainer(build(), TrainerConfig(packing_tokens=64, logits_chunk_mib=_mib(5, VOCAB), kl_coef=0.05), build())
    if name == "qwen2-forward":
        packed._split_head, packed._ref_head = None, False  # the policy's and reference's forward
    batch = _mixed_batch()
    prepared = packed._prepare(batch)
    cuts = packed._micro_batches(prepared)
    assert 1 < len(cuts) < len(prepared.rows)  # several rows share each sequence
    assert all(sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows) <= 64 for rows, _, _ in cuts)
    loss_a, entropy_a, grads_a = _grads(padded, batch)
    loss_b, entropy_b, grads_b = _grads(packed, batch)
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert entropy_b == pytest.approx(entropy_a, rel=1e-5)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


class _NoPositions(torch.nn.Module):
    """A causal LM that drops position ids: packed rows would attend across each other."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def test_a_model_that_cannot_pack_is_refused():
    assert Trainer(tiny_model(0), TrainerConfig(packing_tokens=32)).config.packing_tokens == 32
    with pytest.raises(ConfigError, match="packing_tokens"):
        Trainer(_NoPositions(tiny_model(0)), TrainerConfig(packing_tokens=32))
    with pytest.raises(ConfigError, match="packing_tokens"):
        load_trainer_config({"packing_tokens": 0})
