"""Optional loggers: TensorBoard event files, W&B offline runs, clear errors when a package is missing."""

from __future__ import annotations

import sys

import pytest

from posttrain.configs.monitor import LoggersConfig
from posttrain.errors import ConfigError
from posttrain.monitor.loggers import build_loggers, flatten


def test_flatten_keeps_finite_numbers_only():
    values = {
        "train": {"loss": 0.5, "outcome": "applied", "ok": True},
        "domains": {"add": {"entropy": 1.0, "nan": float("nan")}},
    }
    assert flatten("", values, {}) == {"train/loss": 0.5, "domains/add/entropy": 1.0}


def test_tensorboard_writes_event_files(tmp_path):
    pytest.importorskip("tensorboardX")
    (logger,) = build_loggers(LoggersConfig(tensorboard=True), tmp_path, {})
    logger.log(1, {"domains/add/entropy": 1.5})
    logger.log(2, {"domains/add/entropy": 1.2})
    logger.close()
    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert files and files[0].read_bytes().count(b"domains/add/entropy") == 2  # one scalar record per step


def test_wandb_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (logger,) = build_loggers(LoggersConfig(wandb=True, wandb_project="test"), tmp_path, {"run": {"steps": 2}})
    logger.log(1, {"domains/add/entropy": 1.5})
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb"))


@pytest.mark.parametrize("field,module", [("tensorboard", "tensorboardX"), ("wandb", "wandb")])
def test_missing_package_is_a_config_error(tmp_path, monkeypatch, field, module):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ConfigError, match=f"monitor.loggers.{field}: {module} is not installed"):
        build_loggers(LoggersConfig(**{field: True}), tmp_path, {})
