"""Scalar loggers beside metrics.jsonl: TensorBoard (tensorboardX) and W&B offline.

Invariant: metrics.jsonl is always written by the loop and stays the source
of truth; these loggers only mirror flat scalars to other tools. A logger
asked for in the config whose package is missing fails at start with a
ConfigError naming the field and the package, never silently mid-run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from posttrain.configs.monitor import LoggersConfig
from posttrain.errors import ConfigError


class ScalarLogger(Protocol):
    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def flatten(prefix: str, value: Any, out: dict[str, float]) -> dict[str, float]:
    """Nested mappings of numbers to {"a/b/c": float}; non-numbers are skipped."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            flatten(f"{prefix}/{k}" if prefix else str(k), v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        out[prefix] = float(value)
    return out


class TensorBoardLogger:
    def __init__(self, logdir: Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ConfigError(
                "monitor.loggers.tensorboard: tensorboardX is not installed (pip install tensorboardX)"
            ) from None
        self._writer = SummaryWriter(str(logdir))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    def __init__(self, run_dir: Path, project: str, name: str, config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("monitor.loggers.wandb: wandb is not installed (pip install wandb)") from None
        self._run = wandb.init(
            project=project, name=name, dir=str(run_dir), mode="offline", config=dict(config), reinit="finish_previous"
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


def build_loggers(cfg: LoggersConfig, run_dir: Path, config: Mapping[str, Any]) -> list[ScalarLogger]:
    loggers: list[ScalarLogger] = []
    if cfg.tensorboard:
        loggers.append(TensorBoardLogger(run_dir / "tensorboard"))
    if cfg.wandb:
        loggers.append(WandbLogger(run_dir, cfg.wandb_project, run_dir.name, config))
    return loggers
