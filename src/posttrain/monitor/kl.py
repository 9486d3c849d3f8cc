"""KL of the current policy to a frozen reference, measured on the step's own samples.

Invariant: the estimate is the k3 estimator exp(d) - d - 1, d = log ref - log
policy, averaged over sampled completion tokens: non-negative for every
token, unbiased for KL(policy || reference) at the sampling temperature,
and it needs one no-grad forward of the reference on at most `rows` rows.
The policy's log-probs are the behaviour log-probs the engine recorded. The reference's
log-probs come from the trainer's own computation (`trainer.loss_token_logp`): its LM head
applied `KL_CHUNK_MIB` of logits at a time, so no rows x positions x vocabulary tensor is
held (a 49,152-token vocabulary over 32 rows had taken the run from 7 to 16 GB).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posttrain.configs.trainer import TrainerConfig
from posttrain.trainer.batch import TrainRow
from posttrain.trainer.chunked import chunk_positions
from posttrain.trainer.trainer import loss_token_logp, pack_rows, split_head

KL_CHUNK_MIB: float = TrainerConfig.model_fields["logits_chunk_mib"].default
"""MiB of float32 logits per LM-head chunk: trainer.logits_chunk_mib's default, read from it."""


def pick_rows(groups: Sequence[Sequence[Any]], rows: int) -> list[Any]:
    """Up to `rows` rollouts with tokens, spread evenly over the groups (first samples first)."""
    live = [[r for r in g if r.completion.token_ids] for g in groups]
    picked: list[Any] = []
    for k in range(max((len(g) for g in live), default=0)):
        for g in live:
            if k < len(g) and len(picked) < rows:
                picked.append(g[k])
    return picked


@torch.no_grad()
def kl_to_reference(reference: Any, groups: Sequence[Sequence[Any]], temperature: float, rows: int) -> dict[str, float]:
    """Mean per-token KL estimate per domain."""
    picked = pick_rows(groups, rows)
    if not picked:
        return {}
    device = next(reference.parameters()).device
    batch = [TrainRow.from_completion(r.completion, 0.0, 0, temperature) for r in picked]
    packed = pack_rows(batch, device)
    vocab = getattr(getattr(reference, "config", None), "vocab_size", None)
    chunk = chunk_positions(KL_CHUNK_MIB, int(vocab)) if vocab else None
    logp_n = loss_token_logp(reference, split_head(reference), packed, chunk)[0]
    ref_bc = torch.zeros_like(packed.behaviour_bc).index_put((packed.row_n, packed.col_n), logp_n)
    d_bc = torch.where(packed.mask_bc > 0, ref_bc - packed.behaviour_bc, 0.0)
    k3_b = ((d_bc.exp() - d_bc - 1.0) * packed.mask_bc).sum(-1) / packed.mask_bc.sum(-1).clamp(min=1.0)
    sums: dict[str, list[float]] = {}
    for r, value in zip(picked, k3_b.tolist()):
        sums.setdefault(r.task.domain, []).append(value)
    return {d: sum(v) / len(v) for d, v in sorted(sums.items())}
