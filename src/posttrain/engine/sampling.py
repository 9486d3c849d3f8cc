"""Per-row seeded sampling from next-token logits, independent of the batch.

Invariant: the token drawn for a row depends only on that row's logits, its
sampling parameters, its 32-bit key and the step number, never on which other
rows share the batch or on the device: the randomness is a counter-based hash
(key, step, vocab index) -> uniform, turned into Gumbel noise, so
`argmax(log p + gumbel)` is an exact sample of p. The reported log-prob is
`log_softmax(logits / T)` of the chosen token with T = 1 for greedy rows
(temperature 0), before any top-p truncation.
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_STEP_MUL = 0x85EBCA6B
_MIX_A = 0x7FEB352D
_MIX_B = 0x846CA68B
_UNIFORM_BITS = 23  # exact in float32: (i + 0.5) / 2**23 for i < 2**23 is in (0, 1)


def mix32(x: int) -> int:
    """lowbias32 integer hash of a 32-bit value (Python scalar version)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _MIX_A) & MASK32
    x ^= x >> 15
    x = (x * _MIX_B) & MASK32
    x ^= x >> 16
    return x


def row_key(seed: int, sample_index: int) -> int:
    """The 32-bit key of sample `sample_index` of a request seeded with `seed`
    (any Python int; reduced modulo 2**64)."""
    seed %= 1 << 64
    base = mix32((seed & MASK32) ^ mix32(seed >> 32))
    return mix32(base + mix32(sample_index + _GOLDEN))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for int64 x in [0, 2**32), without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32_t(x: torch.Tensor) -> torch.Tensor:
    """`mix32` on an int64 tensor of values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX_A)
    x = x ^ (x >> 15)
    x = _mul32(x, _MIX_B)
    return x ^ (x >> 16)


def gumbel_noise(keys_b: torch.Tensor, step: int, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape (batch, vocab), float32, a pure function of
    (key, step, vocab index)."""
    step_key = mix32((step * _STEP_MUL + 1) & MASK32)
    h_b = mix32_t(keys_b ^ step_key)
    offsets_v = _mul32(torch.arange(vocab, device=keys_b.device, dtype=torch.int64), _GOLDEN)
    h_bv = mix32_t((h_b[:, None] + offsets_v[None, :]) & MASK32)
    u_bv = ((h_bv >> (32 - _UNIFORM_BITS)).to(torch.float32) + 0.5) / float(1 << _UNIFORM_BITS)
    return -torch.log(-torch.log(u_bv))


def top_p_mask(logp_bv: torch.Tensor, top_p_b: torch.Tensor) -> torch.Tensor:
    """Log-probs with tokens outside each row's nucleus set to -inf: a token is
    kept when the probability mass strictly above it is below top_p (so the
    most likely token is always kept)."""
    sorted_bv, order_bv = torch.sort(logp_bv, dim=-1, descending=True)
    probs_bv = sorted_bv.exp()
    mass_before_bv = probs_bv.cumsum(dim=-1) - probs_bv
    drop_sorted_bv = mass_before_bv >= top_p_b[:, None]
    drop_bv = torch.zeros_like(drop_sorted_bv).scatter(-1, order_bv, drop_sorted_bv)
    return logp_bv.masked_fill(drop_bv, float("-inf"))


def sample_next(
    logits_bv: torch.Tensor,
    temperature_b: torch.Tensor,
    top_p_b: torch.Tensor,
    keys_b: torch.Tensor,
    step: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob. Rows with temperature 0 are greedy.

    logits_bv: float32 (batch, vocab); temperature_b, top_p_b: float32 (batch,);
    keys_b: int64 (batch,) in [0, 2**32). Returns (tokens_b int64, logprobs_b float32).
    """
    greedy_b = temperature_b <= 0
    t_eff_b = torch.where(greedy_b, torch.ones_like(temperature_b), temperature_b)
    logp_bv = torch.log_softmax(logits_bv / t_eff_b[:, None], dim=-1)
    tokens_b = logits_bv.argmax(dim=-1)
    if not bool(greedy_b.all()):
        nucleus_bv = top_p_mask(logp_bv, top_p_b) if bool((top_p_b < 1).any()) else logp_bv
        drawn_b = (nucleus_bv + gumbel_noise(keys_b, step, logits_bv.shape[-1])).argmax(dim=-1)
        tokens_b = torch.where(greedy_b, tokens_b, drawn_b)
    logprobs_b = logp_bv.gather(-1, tokens_b[:, None]).squeeze(-1)
    return tokens_b, logprobs_b
