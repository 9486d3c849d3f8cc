"""Which fields a resumed run may change (`posttrain train --resume RUN field=value ...`).

Invariant: a resumed run stays the same run. A field may change on resume only when it is
listed in SAFE (how long the run goes on, the learning rate and the gradient clip from the
checkpoint on, how often it evaluates, checkpoints and logs, how a step is split into passes);
every other field that differs is refused, each by name with why (REFUSED, the most specific
prefix first), in one ConfigError. Torch-free: it compares two validated configs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from posttrain.errors import ConfigError

SAFE: dict[str, str] = {
    "run.steps": "the run's length: more steps continue it from its newest checkpoint",
    "run.cpu_budget_s": "when the run stops",
    "run.checkpoint_every": "how often it checkpoints",
    "run.progress": "what it shows while it runs",
    "run.threads": "torch CPU threads: speed (float rounding may differ), not what is trained",
    "trainer.lr": "the learning rate from the checkpoint on (set on the restored optimizer)",
    "trainer.grad_clip": "the gradient-norm clip from the checkpoint on",
    "trainer.keep_checkpoints": "how many checkpoints are kept",
    "trainer.micro_batch_size": "how a step is split into passes (memory), not its loss",
    "trainer.micro_batch_tokens": "how a step is split into passes (memory), not its loss",
    "trainer.sort_by_length": "how a step is split into passes (memory), not its loss",
    "trainer.gradient_checkpointing": "memory against compute, not the loss",
    "trainer.logits_chunk_mib": "memory against compute, not the loss",
    "trainer.packing_tokens": "how a step is split into passes (memory), not its loss",
    "eval.every_steps": "how often it evaluates during training",
    "eval.batch_size": "prompts per generation call at evaluation",
    "monitor.report": "whether the HTML report is written at the end",
    "monitor.loggers": "where metrics are also written (TensorBoard, W&B)",
    "sft": "`posttrain train` does not read it",
}
"""Dotted field (or section) -> why changing it on resume keeps the run the same run."""

REFUSED: dict[str, str] = {
    "run.seed": "it seeds the run's sampling and task order",
    "run.name": "it names the run's folder (--resume gives the folder)",
    "run.out_dir": "it names the run's folder (--resume gives the folder)",
    "trainer.seed": "it seeds the trainer",
    "trainer.loss": "the objective the run trains",
    "trainer.kl_coef": "the objective the run trains (and whether a reference model is loaded)",
    "trainer.lora": "which weights train (the checkpoint holds those)",
    "trainer": "how the trainer updates the weights (the checkpoint's optimizer and guard state belong to it)",
    "model": "the model the run trains",
    "base": "the base model the run's weights start from",
    "tasks": "what the run trains on (domains, weights, curriculum)",
    "rollout.group_size": "the group each sample's advantage is relative to",
    "rollout": "how each step samples its groups",
    "eval": "the held-out sets and measures the before/after tables compare",
    "monitor": "the alarms and actions whose state the checkpoint carries",
    "pipeline": "how the run's rollouts are produced (its checkpoints carry the stream's state)",
    "runtime": "how the run's rollouts are produced",
    "sandbox": "the limits the run's programs run under",
    "engine": "the engine the run samples from and pushes weights to",
}
"""Dotted field (or section) -> why it may not change on resume; the most specific prefix wins."""

BRANCH_HINT = "start a new run from its checkpoint instead: posttrain train [CONFIG] --from RUN/checkpoints/step_N"


@dataclass(frozen=True)
class Change:
    """One field whose value differs between the run's config and the one it resumes with."""

    field: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "from": self.old, "to": self.new}


def changes(old: BaseModel, new: BaseModel, prefix: str = "") -> list[Change]:
    """Every field (dotted) whose value differs between `old` and `new`, in field order: nested
    sections of one class are compared field by field, anything else (a dict of domains, a loss
    of another type) as one value."""
    out: list[Change] = []
    for name in type(old).model_fields:
        a, b = getattr(old, name), getattr(new, name)
        field = f"{prefix}{name}"
        if isinstance(a, BaseModel) and type(a) is type(b):
            out += changes(a, b, field + ".")
        elif _plain(a) != _plain(b):
            out.append(Change(field, _plain(a), _plain(b)))
    return out


def _plain(value: Any) -> Any:
    return to_jsonable_python(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _rule(table: Mapping[str, str], field: str) -> str | None:
    """The entry of the longest prefix of `field` (whole dotted parts) in `table`, else None."""
    parts = field.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table:
            return table[key]
    return None


def why_refused(field: str) -> str | None:
    """Why `field` may not change on resume, or None when it may (SAFE)."""
    if _rule(SAFE, field) is not None:
        return None
    return _rule(REFUSED, field) or "it changes what the run does"


def check_resume(old: BaseModel, new: BaseModel, run: str) -> list[Change]:
    """The changes of `new` against the run's config `old` when every one is SAFE; otherwise one
    ConfigError that names each refused field, its values and why, and how to branch instead."""
    found = changes(old, new)
    refused = [(c, why_refused(c.field)) for c in found]
    bad = [f"{c.field} ({_short(c.old)} -> {_short(c.new)}): {why}" for c, why in refused if why is not None]
    if bad:
        raise ConfigError(
            f"--resume {run}: a resumed run stays the same run; these fields may not change: "
            + "; ".join(bad)
            + f". Fields that may change: {', '.join(SAFE)}. To change the others, {BRANCH_HINT}"
        )
    return found
