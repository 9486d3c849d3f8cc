"""The run configuration: typed, documented, sparse.

Invariant: a config is valid or it is not built. `load_config` reads a YAML
file that sets only what differs from the defaults, applies dotted overrides
(`trainer.lr=3e-4`), and raises ConfigError with one message that names each
bad field and what it allows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from posttrain.errors import ConfigError
from posttrain.model.pretrain import BaseConfig
from posttrain.monitor.config import MonitorConfig
from posttrain.pipeline.config import PipelineConfig, Runtime
from posttrain.sandbox.config import SandboxConfig
from posttrain.scale.config import EngineConfig
from posttrain.tasks.config import TasksConfig
from posttrain.trainer.config import TrainerConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(Section):
    """Which model to post-train."""

    path: str | None = None
    """A local Hugging Face model directory; None builds (or reuses) the embedded base."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto picks CUDA when present."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the policy."""


class RolloutConfig(Section):
    """How rollouts are sampled each step."""

    prompts_per_step: int = Field(32, ge=1, le=4096)
    """Tasks drawn per training step."""
    group_size: int = Field(8, ge=2, le=256)
    """Samples per task (G): advantages are relative within a group."""
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    """Sampling temperature of rollouts."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_tokens: int | None = Field(None, ge=1, le=32768)
    """A cap over every domain's tokens per turn (None: no cap). Each domain generates with its
    own budget (declared, or `tasks.domains.<name>.max_tokens`), in batches of equal budget; a
    completion that hits it finishes with reason `length`."""
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (they carry no signal) and count them."""


class EvalConfig(Section):
    """Held-out evaluation: distinct versioned held-out sets, intervals, probes, contamination checks."""

    tasks_per_domain: int = Field(100, ge=1, le=100_000)
    """Distinct held-out tasks per domain in the core set (fewer when the domain's eval split
    holds fewer; the table then says so)."""
    every_steps: int = Field(25, ge=0)
    """Evaluate the fixed subset (and a rotation slice) every N training steps, as well as the
    full set before and after (0: before and after only). The drift guard and the held-out
    alarms act on these evaluations."""
    subset_tasks: int = Field(50, ge=1, le=100_000)
    """The fixed subset evaluated during training: the first N items of each core set (every
    curve point, before and after included, is measured on it, so points compare)."""
    rotation_tasks: int = Field(16, ge=0, le=100_000)
    """Fresh distinct held-out items per domain drawn anew at each evaluation during training
    (none equal to a core item), reported apart from the core (0: off)."""
    max_tokens: int | None = Field(None, ge=1, le=32768)
    """A cap over every domain's tokens at eval (None: no cap); each domain is evaluated with the
    budget it is trained with (declared, or `tasks.domains.<name>.max_tokens`)."""
    batch_size: int = Field(256, ge=1, le=65536)
    """Prompts per generation call at eval."""
    seed: int = Field(0, ge=0)
    """Seed of the held-out sets (0: indices from 0, as before) and of sampled metrics."""
    samples: int = Field(8, ge=0, le=1024)
    """Sampled completions per core item, before and after training, for pass@k and maj@k
    (0: greedy accuracy only)."""
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    """Sampling temperature of pass@k / maj@k."""
    k: tuple[int, ...] = (1, 4, 8)
    """The k of pass@k and maj@k (unbiased estimators); each at most `samples`."""
    above_tasks: int = Field(50, ge=0, le=100_000)
    """Generalisation probe: distinct held-out tasks one level above each trained domain's level
    (where it has one) and per transfer family (0: off)."""
    transfer_domains: dict[str, int] = Field(default_factory=dict)
    """Generalisation probe: families never trained on, each with its level (e.g. {mul: 1}),
    evaluated before and after and reported apart."""
    contamination: bool = True
    """At run start, report the n-gram overlap of the held-out prompts with the run's first
    `contamination_train_tasks` training draws."""
    contamination_train_tasks: int = Field(2000, ge=1, le=10_000_000)
    """Training draws compared with the held-out set."""
    ngram: int = Field(8, ge=1, le=64)
    """n of the contamination n-grams (a prompt shorter than n counts as one n-gram)."""
    exposure: bool = True
    """At run start, check the base model's exposure to the held-out answers (log-likelihood
    margin of gold over wrong answers, held-out against matched control items)."""
    exposure_tasks: int = Field(64, ge=2, le=100_000)
    """Held-out items (and as many control items) per domain in the exposure check."""
    exposure_threshold: float = Field(1.0, gt=0.0, le=1000.0)
    """Nats per item by which the held-out margin must exceed the control margin (interval
    excluding 0) for a domain to be flagged as memorised."""

    @field_validator("k")
    @classmethod
    def _ks(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(k < 1 for k in v):
            raise ValueError("eval.k must list ks >= 1")
        return tuple(sorted(set(v)))

    @model_validator(mode="after")
    def _k_within_samples(self) -> EvalConfig:
        if self.samples and max(self.k) > self.samples:
            raise ValueError(f"eval.k: every k must be at most eval.samples={self.samples}, got {list(self.k)}")
        return self


class SandboxSection(SandboxConfig):
    """The sandbox pool the execute stage runs programs on: the pool's settings
    (backend, workers, per-domain caps, ...) and run-wide caps over the limits
    each domain asks for."""

    max_memory_mb: int | None = Field(None, ge=16, le=1_048_576)
    """Cap on any one program's memory, MiB (None: each domain's own limit)."""
    max_wall_s: float | None = Field(None, gt=0.0, le=86_400.0)
    """Cap on any one program's wall and CPU seconds (None: each domain's own limit)."""

    def pool_config(self) -> SandboxConfig:
        """The pool's part (what `posttrain.sandbox.Pool` takes)."""
        return SandboxConfig(**self.model_dump(exclude={"max_memory_mb", "max_wall_s"}))


class RunConfig(Section):
    """The run itself."""

    steps: int = Field(60, ge=0, le=10_000_000)
    """Training steps."""
    seed: int = 0
    """Seed of sampling, task order and training."""
    out_dir: str = "runs"
    """Parent folder of run directories."""
    name: str | None = None
    """Run directory name (default: a timestamp)."""
    threads: int = Field(2, ge=1, le=512)
    """torch CPU threads."""
    checkpoint_every: int = Field(20, ge=0)
    """Save a checkpoint every N steps (0: only at the end)."""
    progress: bool = True
    """Show a progress bar with live per-domain reward."""
    cpu_budget_s: float | None = Field(None, gt=0)
    """Stop after the step at which training has spent this many seconds of CPU time (this
    process, every thread; counted from the first step, so the held-out evaluation before
    training is not; a resumed run continues the count), then run the final evaluation and
    checkpoint as at a normal end. None: run all `steps`. See monitor/budget.py."""


class Config(Section):
    """Everything `posttrain train` needs."""

    model: ModelSection = ModelSection()
    base: BaseConfig = BaseConfig()
    tasks: TasksConfig = TasksConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()
    monitor: MonitorConfig = MonitorConfig()
    pipeline: PipelineConfig = PipelineConfig()
    """The rollout pipeline: stage workers, queues, scheduler, staleness, replacement."""
    runtime: Runtime = "embedded"
    """Where rollout workers run: embedded (threads and processes here) or ray (actors on a Ray cluster)."""
    sandbox: SandboxSection = SandboxSection()
    """The sandbox pool of the execute stage (backend, workers, limit caps)."""
    engine: EngineConfig = EngineConfig()
    """Inference engine: hf (in process, default) or openai (a server that takes weight updates over HTTP)."""


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(tree: dict[str, Any], dotted: str) -> None:
    """Set `a.b.c=value` in a nested dict (value parsed as YAML)."""
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like section.field=value")
    key, _, raw = dotted.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {dotted!r} has an empty field name")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = _parse_scalar(raw)


def _describe(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field"
    return f"{loc}: {err['msg']} (got {err.get('input')!r})"


def _allowed_fields(model: type[BaseModel], loc: tuple) -> str:
    node: Any = model
    for part in loc[:-1]:
        field = getattr(node, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return ""
        node = field.annotation
    names = sorted(getattr(node, "model_fields", {}))
    return f"; allowed: {', '.join(names)}" if names else ""


def validate(tree: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            hint = _allowed_fields(Config, err["loc"]) if err["type"] == "extra_forbidden" else ""
            lines.append(_describe(err) + hint)
        raise ConfigError(f"{source}: " + "; ".join(lines)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: malformed YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    tree = read_yaml(path) if path else {}
    for item in overrides:
        apply_override(tree, item)
    return validate(tree, str(path or "config"))


def split_cli_args(config: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """A command line's optional config file and its dotted overrides: a first
    positional argument that contains '=' is an override, not a file."""
    if config and "=" in config:
        return None, [config, *overrides]
    return config, list(overrides)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
