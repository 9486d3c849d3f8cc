"""A run directory: resolved config, metrics JSONL (written by `metrics_log`), checkpoints,
trace database, eval table.

Invariant: a run directory is self-describing: `config.yaml` is the resolved
config it goes on with (the one it was started with, unless a `--resume` changed
fields a resume may change: each change, and a branch's source, is a line of
`config_history.jsonl`, lineage.py), and everything the run wrote lives below it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from posttrain.configs import Config, dump_config, load_config
from posttrain.errors import ConfigError


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def trace_path(self) -> Path:
        return self.path / "trace.db"

    @property
    def eval_path(self) -> Path:
        return self.path / "eval.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @classmethod
    def create(cls, cfg: Config) -> RunDir:
        name = cfg.run.name or time.strftime("%Y%m%d-%H%M%S")
        path = Path(cfg.run.out_dir) / name
        if path.exists() and any(path.iterdir()):
            raise ConfigError(
                f"run.name: run directory {str(path)!r} exists and is not empty (use --resume to continue it)"
            )
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run.config_path.write_text(dump_config(cfg))
        return run

    @classmethod
    def open(cls, path: str | Path) -> tuple[RunDir, Config]:
        run = cls(Path(path))
        if not run.config_path.is_file():
            raise ConfigError(f"{str(path)!r} is not a run directory (no config.yaml)")
        return run, load_config(run.config_path)
