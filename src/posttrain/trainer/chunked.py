"""Token log-probs and entropies from hidden states, the LM head applied a chunk of positions at a time.

Invariant: no tensor of more than `chunk` positions x vocabulary is alive at once, forward or
backward: each chunk's logits, log-softmax and entropy are computed, reduced to one log-prob
and one entropy per position, and dropped; with gradient, each chunk runs under
torch.utils.checkpoint (non-reentrant), so its backward recomputes that chunk's logits alone
and frees them before the next chunk's. The values are those of one pass over every position
(`log_softmax(head(h) / T)` gathered at the target, and the entropy of that distribution) up
to float rounding; with `chunk` None, or no more positions than `chunk`, it is that one pass.
The head is any module or callable (a LoRA-wrapped head, a tied embedding): its gradient
reaches whatever parameters it uses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

_FLOAT32_BYTES = 4


def chunk_positions(chunk_mib: float | None, vocab: int) -> int | None:
    """Positions per LM-head chunk so that one chunk's float32 logits take at most
    `chunk_mib` MiB (at least one position); None: no chunking."""
    if chunk_mib is None:
        return None
    return max(1, int(chunk_mib * 2**20) // (_FLOAT32_BYTES * vocab))


def token_logp_entropy(
    head: Callable[[Tensor], Tensor],
    hidden_nh: Tensor,
    target_n: Tensor,
    temperature_n: Tensor,
    chunk: int | None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor]:
    """(log-prob of each target token, entropy of each position's distribution), both n-long,
    from `hidden_nh` (n positions x hidden) through `head` (hidden -> logits), at each
    position's temperature, `chunk` positions at a time. The entropy carries a gradient
    only with `entropy_grad` (the entropy bonus); without, it is detached."""
    n = hidden_nh.shape[0]
    if chunk is None or n <= chunk:
        return _one_chunk(head, hidden_nh, target_n, temperature_n, entropy_grad)
    recompute = torch.is_grad_enabled()
    logp, entropy = [], []
    for start in range(0, n, chunk):
        part = (hidden_nh[start : start + chunk], target_n[start : start + chunk], temperature_n[start : start + chunk])
        if recompute:
            logp_c, entropy_c = checkpoint(_one_chunk, head, *part, entropy_grad, use_reentrant=False)
        else:
            logp_c, entropy_c = _one_chunk(head, *part, entropy_grad)
        logp.append(logp_c)
        entropy.append(entropy_c)
    return torch.cat(logp), torch.cat(entropy)


def _one_chunk(
    head: Callable[[Tensor], Tensor], hidden_ch: Tensor, target_c: Tensor, temperature_c: Tensor, entropy_grad: bool
) -> tuple[Tensor, Tensor]:
    logp_cv = (head(hidden_ch).float() / temperature_c[:, None]).log_softmax(-1)
    logp_c = logp_cv.gather(-1, target_c[:, None]).squeeze(-1)
    if entropy_grad:
        return logp_c, -(logp_cv.exp() * logp_cv).sum(-1)  # not entr(p): its gradient at p = 0 is inf x 0
    with torch.no_grad():
        return logp_c, torch.special.entr(logp_cv.exp()).sum(-1)
