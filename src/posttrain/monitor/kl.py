"""KL of the current policy to a frozen reference, measured on the step's own samples.

Invariant: the estimate is the k3 estimator exp(d) - d - 1, d = log ref - log
policy, averaged over sampled completion tokens: non-negative for every
token, unbiased for KL(policy || reference) at the sampling temperature,
and it needs one no-grad forward of the reference on at most `rows` rows.
The policy's log-probs are the behaviour log-probs the engine recorded.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from posttrain.trainer.batch import TrainRow
from posttrain.trainer.trainer import pack_rows


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
    kwargs = {}
    if "logits_to_keep" in inspect.signature(reference.forward).parameters:
        kwargs["logits_to_keep"] = packed.input_ids_bs.shape[1] - packed.first_index
    logits_bsv = reference(input_ids=packed.input_ids_bs, attention_mask=packed.attention_bs, **kwargs).logits.float()
    vocab, offset = logits_bsv.shape[-1], packed.input_ids_bs.shape[1] - logits_bsv.shape[1]
    logits_bcv = logits_bsv.gather(1, (packed.index_bc - offset)[..., None].expand(-1, -1, vocab))
    ref_bc = (logits_bcv / packed.temperature_b[:, None, None]).log_softmax(-1)
    ref_bc = ref_bc.gather(-1, packed.target_bc[..., None]).squeeze(-1)
    d_bc = torch.where(packed.mask_bc > 0, ref_bc - packed.behaviour_bc, 0.0)
    k3_b = ((d_bc.exp() - d_bc - 1.0) * packed.mask_bc).sum(-1) / packed.mask_bc.sum(-1).clamp(min=1.0)
    sums: dict[str, list[float]] = {}
    for r, value in zip(picked, k3_b.tolist()):
        sums.setdefault(r.task.domain, []).append(value)
    return {d: sum(v) / len(v) for d, v in sorted(sums.items())}
