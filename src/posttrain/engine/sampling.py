"""Per-row seeded sampling from next-token logits, independent of the batch.

Invariant: the token drawn for a row depends only on that row's logits, its
sampling parameters, its 32-bit key and the step number, never on which other
rows share the batch or on the device: the randomness is a counter-based hash.
For vocabularies up to GUMBEL_MAX_VOCAB, (key, step, vocab index) -> Gumbel
noise and `argmax(log p + gumbel)`; above it, (key, step) -> one uniform u
and the first token whose cumulative probability exceeds u (inverse CDF,
which avoids hashing every token of a large vocabulary). Both are exact
samples of p. The reported log-prob is
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
GUMBEL_MAX_VOCAB = 4096
"""Vocabularies up to this size sample by Gumbel-max (noise per token);
larger ones by inverse CDF (one uniform per row), which costs O(vocab) float
work instead of O(vocab) integer hashing."""


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


def _step_hash(keys: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """The per-(key, step) hash; `step` is one int for every row, or an int64 tensor of one
    step per row (speculative decoding, where rows are at different steps): equal values give
    equal hashes either way."""
    if isinstance(step, torch.Tensor):
        return mix32_t(keys ^ mix32_t((_mul32(step, _STEP_MUL) + 1) & MASK32))
    return mix32_t(keys ^ mix32((step * _STEP_MUL + 1) & MASK32))


def _to_gumbel(h: torch.Tensor) -> torch.Tensor:
    u = ((h >> (32 - _UNIFORM_BITS)).to(torch.float32) + 0.5) / float(1 << _UNIFORM_BITS)
    return -torch.log(-torch.log(u))


def gumbel_noise(keys_b: torch.Tensor, step: int | torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape (batch, vocab), float32, a pure function of
    (key, step, vocab index)."""
    offsets_v = _mul32(torch.arange(vocab, device=keys_b.device, dtype=torch.int64), _GOLDEN)
    return _to_gumbel(mix32_t((_step_hash(keys_b, step)[:, None] + offsets_v[None, :]) & MASK32))


def noise_at(keys_n: torch.Tensor, step: int, cols_n: torch.Tensor) -> torch.Tensor:
    """The entries (key_n, cols_n) of `gumbel_noise`, element by element."""
    return _to_gumbel(mix32_t((_step_hash(keys_n, step) + _mul32(cols_n, _GOLDEN)) & MASK32))


def uniform_at(keys_b: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """One float64 uniform in (0, 1) per row with 53 random bits, a pure
    function of (key, step)."""
    h1 = _step_hash(keys_b, step)
    h2 = mix32_t((h1 + _GOLDEN) & MASK32)
    bits = (h1 << 21) | (h2 >> 11)  # 53 bits, below 2**53: exact in float64
    return (bits.to(torch.float64) + 0.5) / float(1 << 53)


def gumbel_argmax(logp_bv: torch.Tensor, keys_b: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """A sample of softmax(logp) per row: argmax(logp + Gumbel noise)."""
    return (logp_bv + gumbel_noise(keys_b, step, logp_bv.shape[-1])).argmax(dim=-1)


def inverse_cdf(logp_bv: torch.Tensor, keys_b: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """A sample of softmax(logp) per row: the first token whose cumulative
    probability (float64, in vocabulary order) exceeds u * total. One uniform
    per row instead of one hash per token, so large vocabularies stay cheap."""
    probs_bv = logp_bv.exp().to(torch.float64)  # logp <= 0: no overflow; -inf -> 0
    cdf_bv = probs_bv.cumsum(dim=-1)
    target_b = uniform_at(keys_b, step) * cdf_bv[:, -1]
    token_b = torch.searchsorted(cdf_bv, target_b[:, None], right=True).squeeze(-1)
    token_b = token_b.clamp(max=logp_bv.shape[-1] - 1)
    possible_b = probs_bv.gather(-1, token_b[:, None]).squeeze(-1) > 0
    if not bool(possible_b.all()):  # u * total rounded up to total: past the last possible token
        token_b = torch.where(possible_b, token_b, logp_bv.argmax(dim=-1))
    return token_b


def top_p_mask(logp_bv: torch.Tensor, top_p_b: torch.Tensor, first_k: int = 256) -> torch.Tensor:
    """Log-probs with tokens outside each row's nucleus set to -inf: a token is
    kept when the probability mass strictly above it is below top_p (so the
    most likely token is always kept). Looks at the `first_k` most likely
    tokens first (growing 8x while some row's nucleus is larger), so a large
    vocabulary is sorted only when a nucleus spans most of it."""
    vocab = logp_bv.shape[-1]
    k = min(first_k, vocab)
    while True:
        if k * 4 >= vocab:
            k = vocab
        top_bk, order_bk = (
            torch.sort(logp_bv, dim=-1, descending=True) if k == vocab else torch.topk(logp_bv, k, dim=-1, sorted=True)
        )
        probs_bk = top_bk.exp()
        mass_before_bk = probs_bk.cumsum(dim=-1) - probs_bk
        if k == vocab or bool((mass_before_bk[:, -1] + probs_bk[:, -1] >= top_p_b).all()):
            break
        k *= 8
    kept_bk = top_bk.masked_fill(mass_before_bk >= top_p_b[:, None], float("-inf"))
    return torch.full_like(logp_bv, float("-inf")).scatter(-1, order_bk, kept_bk)


def sample_next(
    logits_bv: torch.Tensor,
    temperature_b: torch.Tensor,
    top_p_b: torch.Tensor,
    keys_b: torch.Tensor,
    step: int | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob. Rows with temperature 0 are greedy.

    logits_bv: float32 (batch, vocab); temperature_b, top_p_b: float32 (batch,);
    keys_b: int64 (batch,) in [0, 2**32); step: the generation step of every row, or an int64
    (batch,) tensor of each row's own step (the same draws as one int of that value).
    Returns (tokens_b int64, logprobs_b float32).
    """
    greedy_b = temperature_b <= 0
    t_eff_b = torch.where(greedy_b, torch.ones_like(temperature_b), temperature_b)
    logp_bv = torch.log_softmax(logits_bv / t_eff_b[:, None], dim=-1)
    all_greedy, any_greedy = bool(greedy_b.all()), bool(greedy_b.any())
    tokens_b = logits_bv.argmax(dim=-1) if any_greedy else None
    if not all_greedy:
        nucleus_bv = top_p_mask(logp_bv, top_p_b) if bool((top_p_b < 1).any()) else logp_bv
        draw = gumbel_argmax if logits_bv.shape[-1] <= GUMBEL_MAX_VOCAB else inverse_cdf
        drawn_b = draw(nucleus_bv, keys_b, step)
        tokens_b = drawn_b if tokens_b is None else torch.where(greedy_b, tokens_b, drawn_b)
    logprobs_b = logp_bv.gather(-1, tokens_b[:, None]).squeeze(-1)
    return tokens_b, logprobs_b
