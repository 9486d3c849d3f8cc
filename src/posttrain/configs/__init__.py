"""The run configuration: typed, documented, sparse. The root config (`Config`) and its
loading; each section lives in its own module of this package (`configs/trainer.py`, ...).

Invariant: a config is valid or it is not built. `load_config` reads a YAML
file that sets only what differs from the defaults, applies dotted overrides
(`trainer.lr=3e-4`), and raises ConfigError with one message that names each
bad field and what it allows. Importing this package imports no torch and no part
of posttrain other than `errors` (tests/configs/test_configs_light.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.configs.base import BaseConfig
from posttrain.configs.engine import EngineConfig
from posttrain.configs.eval import EvalConfig
from posttrain.configs.model import ModelSection
from posttrain.configs.monitor import MonitorConfig
from posttrain.configs.pipeline import PipelineConfig, Runtime
from posttrain.configs.rollout import RolloutConfig
from posttrain.configs.run import RunConfig
from posttrain.configs.sandbox import SandboxSection
from posttrain.configs.section import Section
from posttrain.configs.tasks import TasksConfig
from posttrain.configs.trainer import TrainerConfig
from posttrain.errors import ConfigError


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
