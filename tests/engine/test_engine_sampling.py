"""Seeded Gumbel sampling: the hash, exactness of the sampled distribution, top-p."""
from __future__ import annotations

import torch

from posttrain.engine.sampling import gumbel_noise, mix32, mix32_t, row_key, sample_next, top_p_mask


def test_tensor_hash_equals_the_scalar_hash():
    xs = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xDEADBEEF]
    assert mix32_t(torch.tensor(xs, dtype=torch.int64)).tolist() == [mix32(x) for x in xs]
    assert mix32(0xDEADBEEF) != mix32(0xDEADBEEE)


def test_row_keys_differ_by_seed_and_sample():
    keys = {row_key(s, j) for s in (0, 1, 2**40, -3) for j in range(8)}
    assert len(keys) == 32
    assert row_key(5, 3) == row_key(5, 3)


def test_noise_is_a_pure_function_of_key_step_and_index():
    keys = torch.tensor([row_key(1, 0), row_key(1, 1)])
    a = gumbel_noise(keys, 3, 50)
    b = gumbel_noise(keys.flip(0), 3, 50).flip(0)
    assert torch.equal(a, b) and not torch.equal(a, gumbel_noise(keys, 4, 50))
    assert torch.isfinite(a).all()


def test_samples_follow_the_tempered_distribution():
    # logits (2, 1, 0, -inf-ish) at T=1: p = e^x / sum = (0.665, 0.245, 0.090, 0)
    logits = torch.tensor([2.0, 1.0, 0.0, -30.0])
    rows = 20000
    keys = torch.tensor([row_key(9, j) for j in range(rows)])
    tokens, lps = sample_next(logits.expand(rows, 4), torch.ones(rows), torch.ones(rows), keys, 0)
    freq = torch.bincount(tokens, minlength=4).float() / rows
    want = torch.softmax(logits, -1)
    assert (freq - want).abs().max() < 0.015  # 4 sigma of a 20k-sample frequency
    assert torch.allclose(lps, torch.log_softmax(logits, -1)[tokens])


def test_top_p_keeps_the_smallest_nucleus():
    # probs (0.5, 0.3, 0.15, 0.05): mass above each = (0, 0.5, 0.8, 0.95)
    logp = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]] * 3))
    kept = torch.isfinite(top_p_mask(logp, torch.tensor([0.45, 0.75, 0.85])))
    assert kept.tolist() == [
        [False, True, False, False],   # top_p 0.45: only 0.5
        [False, True, False, True],    # top_p 0.75: 0.5 + 0.3 (0.15 has 0.8 above it)
        [True, True, False, True],     # top_p 0.85: mass above 0.15 is 0.8 < 0.85
    ]


def test_top_p_sampling_never_draws_outside_the_nucleus_but_logprob_is_untruncated():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    rows = 2000
    keys = torch.tensor([row_key(4, j) for j in range(rows)])
    tokens, lps = sample_next(logits.expand(rows, 4), torch.ones(rows), torch.full((rows,), 0.8), keys, 0)
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(lps, logits[tokens], atol=1e-6)


def test_greedy_rows_take_the_argmax_with_temperature_one_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    tokens, lps = sample_next(logits, torch.tensor([0.0, 0.0]), torch.ones(2), torch.tensor([1, 2]), 0)
    assert tokens.tolist() == [1, 1]
    assert torch.allclose(lps, torch.log_softmax(logits[0], -1)[1].expand(2))
