"""Exposure of the base model to the held-out set: has it seen these answers?

Invariant: the check reads the model and writes nothing; for each domain it
compares the log-likelihood margin of the gold answer over a matched wrong
answer (`domain.wrong`, e.g. the answer plus one) on held-out items against
the same margin on matched control items (train-split items of the same
level, from a seeded region of the index space). A model that can do the
task raises both margins alike; a model that memorised the held-out answers
raises only the held-out one. A domain is flagged when the held-out margin
exceeds the control margin by more than `threshold` nats per item and the
95% interval of that gap excludes 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from posttrain.domains.base import stable_hash
from posttrain.evaluate.heldout import HeldoutSet
from posttrain.evaluate.stats import Z95
from posttrain.types import Task


@dataclass(frozen=True)
class Exposure:
    domain: str
    level: int
    n: int
    heldout_margin: float
    control_margin: float
    gap: float
    low: float
    high: float
    threshold: float
    flagged: bool

    def message(self) -> str:
        verdict = "LOOKS MEMORISED" if self.flagged else "no sign of exposure"
        return (
            f"{self.domain}: gold-vs-wrong log-likelihood margin {self.heldout_margin:+.2f} on held-out items, "
            f"{self.control_margin:+.2f} on control items; gap {self.gap:+.2f} [{self.low:+.2f},{self.high:+.2f}] "
            f"nats: {verdict}"
        )


def answer_logprobs(model: Any, tokenizer: Any, pairs: Sequence[tuple[Task, str]], batch_size: int = 64) -> list[float]:
    """Sum of log-probs of each answer's tokens and end-of-sequence after its task's chat prompt."""
    import torch

    device = next(model.parameters()).device
    rows = []
    for task, answer in pairs:
        chat = [{"role": m.role, "content": m.content} for m in task.prompt]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        p_ids = tokenizer.encode(text, add_special_tokens=False)
        a_ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append((p_ids, a_ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            width = max(len(p) + len(a) for p, a in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attn = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width))
            for i, (p, a) in enumerate(chunk):
                ids[i, : len(p) + len(a)] = torch.tensor(p + a)
                attn[i, : len(p) + len(a)] = 1
                mask[i, len(p) : len(p) + len(a)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1)
            out.extend((logp * mask[:, 1:].to(device)).sum(dim=1).tolist())
    return out


def _margins(model: Any, tokenizer: Any, tasks: Sequence[Task]) -> list[float]:
    from posttrain.domains.registry import get

    pairs = []
    for t in tasks:
        dom = get(t.domain)
        pairs += [(t, dom.gold(t)), (t, dom.wrong(t))]
    lps = answer_logprobs(model, tokenizer, pairs)
    return [lps[i] - lps[i + 1] for i in range(0, len(lps), 2)]


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0)


def control_tasks(domain: str, level: int, n: int, seed: int = 0) -> list[Task]:
    from posttrain.domains.registry import get

    start = stable_hash("exposure-control", seed, domain, level) % 10**12
    return [get(domain).sample(start + i, "train", level) for i in range(n)]


def check_exposure(
    model: Any, tokenizer: Any, heldout: HeldoutSet, tasks: int = 64, threshold: float = 1.0, seed: int = 0
) -> dict[str, Exposure]:
    """Per core domain: the held-out vs control margin gap, flagged where the model looks memorised."""
    out = {}
    for name, s in heldout.of_kind("core").items():
        held = s.head(tasks).tasks()
        if not held:
            continue
        h = _margins(model, tokenizer, held)
        c = _margins(model, tokenizer, control_tasks(name, s.level, len(held), seed))
        (hm, hv), (cm, cv) = _mean_var(h), _mean_var(c)
        gap = hm - cm
        half = Z95 * math.sqrt(hv / len(h) + cv / len(c))
        out[name] = Exposure(
            name, s.level, len(held), hm, cm, gap, gap - half, gap + half, threshold, gap > threshold and gap - half > 0
        )
    return out


def exposure_json(result: Mapping[str, Exposure]) -> dict[str, Any]:
    return {k: asdict(v) for k, v in result.items()}
