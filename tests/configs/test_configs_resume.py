"""Which fields a resume may change (configs/resume.py): every accepted override passes and is
listed, every refused one is named with its reason, all at once."""

from __future__ import annotations

import pytest

from posttrain.configs import load_config
from posttrain.configs.resume import changes, check_resume, why_refused
from posttrain.errors import ConfigError

RUN = load_config(None, ["run.steps=8", "run.name=r"])

ACCEPTED = {
    "run.steps=20": "run.steps",
    "run.cpu_budget_s=30": "run.cpu_budget_s",
    "run.checkpoint_every=2": "run.checkpoint_every",
    "run.progress=false": "run.progress",
    "run.threads=1": "run.threads",
    "trainer.lr=1e-4": "trainer.lr",
    "trainer.grad_clip=0.5": "trainer.grad_clip",
    "trainer.keep_checkpoints=5": "trainer.keep_checkpoints",
    "trainer.micro_batch_size=4": "trainer.micro_batch_size",
    "trainer.micro_batch_tokens=4096": "trainer.micro_batch_tokens",
    "trainer.sort_by_length=false": "trainer.sort_by_length",
    "trainer.gradient_checkpointing=true": "trainer.gradient_checkpointing",
    "trainer.logits_chunk_mib=16": "trainer.logits_chunk_mib",
    "trainer.packing_tokens=2048": "trainer.packing_tokens",
    "eval.every_steps=5": "eval.every_steps",
    "eval.batch_size=16": "eval.batch_size",
    "monitor.report=false": "monitor.report",
    "monitor.loggers.tensorboard=true": "monitor.loggers.tensorboard",
    "sft.lr=2e-3": "sft.lr",
}

REFUSED_OVERRIDES = {
    "run.seed=3": ("run.seed", "seeds the run's sampling"),
    "run.name=other": ("run.name", "names the run's folder"),
    "run.out_dir=elsewhere": ("run.out_dir", "names the run's folder"),
    "model.path=/some/model": ("model.path", "the model the run trains"),
    "model.dtype=bfloat16": ("model.dtype", "the model the run trains"),
    "base.steps=10": ("base.steps", "the base model"),
    "tasks.domains={add: {difficulty: 1}}": ("tasks.domains", "what the run trains on"),
    "rollout.group_size=4": ("rollout.group_size", "advantage is relative to"),
    "rollout.temperature=0.7": ("rollout.temperature", "how each step samples"),
    "trainer.seed=1": ("trainer.seed", "seeds the trainer"),
    "trainer.loss.type=gspo": ("trainer.loss", "the objective"),
    "trainer.loss={type: grpo, clip_high: 0.3}": ("trainer.loss.clip_high", "the objective"),
    "trainer.kl_coef=0.1": ("trainer.kl_coef", "reference model"),
    "trainer.lora.rank=4": ("trainer.lora", "which weights train"),
    "trainer.weight_decay=0.1": ("trainer.weight_decay", "optimizer and guard state"),
    "eval.tasks_per_domain=5": ("eval.tasks_per_domain", "before/after tables compare"),
    "eval.seed=2": ("eval.seed", "before/after tables compare"),
    "monitor.enabled=false": ("monitor.enabled", "alarms and actions"),
    "pipeline.mode=async": ("pipeline.mode", "rollouts are produced"),
    "runtime=ray": ("runtime", "rollouts are produced"),
    "sandbox.workers=3": ("sandbox.workers", "limits the run's programs"),
    "engine.timeout_s=30": ("engine.timeout_s", "the engine the run samples from"),
}


@pytest.mark.parametrize("override", sorted(ACCEPTED))
def test_an_accepted_override_passes_and_is_listed(override):
    found = check_resume(RUN, load_config(None, ["run.steps=8", "run.name=r", override]), "runs/r")
    assert [c.field for c in found] == [ACCEPTED[override]]


@pytest.mark.parametrize("override", sorted(REFUSED_OVERRIDES))
def test_a_refused_override_is_named_with_its_reason(override):
    field, why = REFUSED_OVERRIDES[override]
    with pytest.raises(ConfigError) as err:
        check_resume(RUN, load_config(None, ["run.steps=8", "run.name=r", override]), "runs/r")
    msg = str(err.value)
    assert f"{field} (" in msg and why in msg, msg
    assert "--from RUN/checkpoints/step_N" in msg  # how to change it anyway: a branch


def test_every_refused_field_is_named_at_once_and_accepted_ones_are_not():
    new = load_config(None, ["run.steps=20", "run.name=r", "trainer.lr=1e-4", "run.seed=2", "rollout.group_size=4"])
    with pytest.raises(ConfigError) as err:
        check_resume(RUN, new, "runs/r")
    refused = str(err.value).split("may not change:")[1].split(". Fields that may change")[0]
    assert "run.seed" in refused and "rollout.group_size" in refused
    assert "trainer.lr" not in refused and "run.steps" not in refused


def test_no_change_is_no_change_and_a_dict_field_is_one_change():
    assert changes(RUN, RUN) == []
    other = load_config(None, ["run.steps=8", "run.name=r", "tasks.domains={add: {difficulty: 1}, sort: {}}"])
    assert [c.field for c in changes(RUN, other)] == ["tasks.domains"]


def test_every_field_has_a_rule():
    """A new field is accepted or refused with its section's reason, never the catch-all by accident."""
    from pydantic import BaseModel

    from posttrain.configs import Config

    def walk(model: type[BaseModel], prefix: str = ""):
        for name, f in model.model_fields.items():
            sub = f.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                yield from walk(sub, f"{prefix}{name}.")
            else:
                yield prefix + name

    fields = list(walk(Config))
    assert len(fields) > 200
    for field in fields:
        assert why_refused(field) != "it changes what the run does", field
