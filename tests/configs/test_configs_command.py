"""`posttrain config show` and `posttrain config fields`: the resolved config and a section's schema."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from posttrain.cli import main
from posttrain.configs import Config


def test_show_prints_the_resolved_config_of_a_command_line(capsys):
    assert main(["config", "show", "configs/default.yaml", "trainer.lr=1e-4"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["trainer"]["lr"] == 1e-4 and shown["run"]["steps"] == 300  # the override and the file
    assert Config.model_validate(shown).trainer.lr == 1e-4  # the whole config, loadable as it is
    assert main(["config", "show", "run.steps=7", "--section", "run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["steps"] == 7


def test_fields_lists_type_default_bounds_and_docstring(capsys):
    assert main(["config", "fields", "trainer"]) == 0
    out = capsys.readouterr().out
    assert "  lr: float = 0.0003  (> 0.0, <= 1.0)\n      AdamW learning rate" in out
    assert main(["config", "fields", "trainer.loss"]) == 0
    assert "trainer.loss.GSPOLossConfig" in capsys.readouterr().out  # a union: each member


def test_an_unknown_section_or_field_gets_a_did_you_mean(capsys):
    assert main(["config", "fields", "trainr"]) == 2
    assert "did you mean trainer?" in capsys.readouterr().err
    assert main(["config", "show", "trainer.lrr=1"]) == 2
    assert "did you mean lr?" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["config", "--help"]])
def test_help_imports_no_torch(argv):
    code = f"import sys; from posttrain.cli import main\ntry: main({argv!r})\nexcept SystemExit: pass\n"
    code += "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


def test_every_posttrain_name_in_the_trl_and_verl_table_exists():
    import re
    from pathlib import Path

    from posttrain.configs.schema import section_models

    text = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| TRL")]
    names = [m for row in rows for m in re.findall(r"`([a-z_.]+)(?:=[a-z0-9_]+)?`", row.split("|")[3])]
    assert len(rows) > 20 and "trainer.lr" in names and "rollout.group_size" in names
    for name in names:
        section, _, field = name.rpartition(".")
        if section == "tasks.domains.NAME" or not section:
            continue
        models = [m for _, m in section_models(Config, section)]
        assert any(field in m.model_fields for m in models), name


def test_python_dash_m_posttrain_runs_the_same_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "posttrain", "config", "show", "run.steps=7", "--section", "run"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert yaml.safe_load(out)["steps"] == 7
