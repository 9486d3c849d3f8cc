"""Seeded Gumbel sampling: the hash, exactness of the sampled distribution, top-p."""

from __future__ import annotations

import torch

from posttrain.engine.sampling import (
    GUMBEL_MAX_VOCAB,
    gumbel_noise,
    inverse_cdf,
    mix32,
    mix32_t,
    row_key,
    sample_next,
    top_p_mask,
    uniform_at,
)


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
        [False, True, False, False],  # top_p 0.45: only 0.5
        [False, True, False, True],  # top_p 0.75: 0.5 + 0.3 (0.15 has 0.8 above it)
        [True, True, False, True],  # top_p 0.85: mass above 0.15 is 0.8 < 0.85
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


def test_inverse_cdf_samples_follow_the_distribution():
    # the same hand-worked p = (0.665, 0.245, 0.090, ~0) as the Gumbel test
    logits = torch.tensor([2.0, 1.0, 0.0, -30.0])
    rows = 20000
    keys = torch.tensor([row_key(9, j) for j in range(rows)])
    tokens = inverse_cdf(torch.log_softmax(logits, -1).expand(rows, 4), keys, 0)
    freq = torch.bincount(tokens, minlength=4).float() / rows
    assert (freq - torch.softmax(logits, -1)).abs().max() < 0.015
    masked = torch.tensor([[0.0, float("-inf"), float("-inf")]] * 50)
    assert inverse_cdf(masked, keys[:50], 1).tolist() == [0] * 50  # never a zero-probability token


def test_uniforms_are_in_the_open_unit_interval_and_differ():
    u = uniform_at(torch.tensor([row_key(3, j) for j in range(1000)]), 5)
    assert bool(((u > 0) & (u < 1)).all()) and len(set(u.tolist())) == 1000
    assert abs(float(u.mean()) - 0.5) < 0.05


def large_vocab_logits(rows: int, seed: int = 0) -> torch.Tensor:
    vocab = GUMBEL_MAX_VOCAB + 1000
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4


def test_large_vocabularies_sample_per_row_whatever_the_batch():
    logits = large_vocab_logits(6)
    keys = torch.tensor([row_key(1, j) for j in range(6)])
    temp, top_p = torch.tensor([1.0, 0.7, 1.0, 0.0, 1.3, 1.0]), torch.tensor([1.0, 1.0, 0.9, 1.0, 0.95, 0.5])
    together, lps = sample_next(logits, temp, top_p, keys, 3)
    alone = [
        sample_next(logits[i : i + 1], temp[i : i + 1], top_p[i : i + 1], keys[i : i + 1], 3)[0].item()
        for i in range(6)
    ]
    assert together.tolist() == alone
    assert together[3] == logits[3].argmax()
    other = sample_next(logits, temp, top_p, keys, 4)[0]
    assert other.tolist() != together.tolist()
    assert torch.allclose(
        lps,
        torch.log_softmax(logits / temp.clamp(min=1e-9).where(temp > 0, 1)[:, None], -1)
        .gather(-1, together[:, None])
        .squeeze(-1),
    )


def test_top_p_looking_at_the_top_k_first_equals_a_full_sort():
    logp = torch.log_softmax(large_vocab_logits(8, seed=1), -1)
    top_p = torch.tensor([0.1, 0.5, 0.9, 0.99, 0.999, 1.0, 0.7, 0.3])
    fast, full = top_p_mask(logp, top_p, first_k=4), top_p_mask(logp, top_p, first_k=logp.shape[-1])
    assert torch.equal(torch.isfinite(fast), torch.isfinite(full))
    assert torch.equal(fast[torch.isfinite(fast)], logp[torch.isfinite(fast)])
