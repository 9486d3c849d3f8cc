"""Config: sparse YAML, dotted overrides, one clear error naming the field."""

from __future__ import annotations

import pytest

from posttrain.cli import main
from posttrain.configs import apply_override, load_config
from posttrain.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("# a sparse file\nrollout:\n  group_size: 4\n")
    cfg = load_config(f, ["trainer.lr=1e-3", "run.steps=7", "tasks.domains.add.difficulty=2"])
    assert cfg.rollout.group_size == 4
    assert cfg.rollout.prompts_per_step == 32  # default kept
    assert cfg.trainer.lr == 1e-3 and cfg.run.steps == 7
    assert cfg.tasks.domains["add"].difficulty == 2


def test_override_parses_yaml_scalars():
    tree: dict = {}
    apply_override(tree, "a.b=true")
    apply_override(tree, "a.c=[1, 2]")
    apply_override(tree, "a.d=hello")
    assert tree == {"a": {"b": True, "c": [1, 2], "d": "hello"}}


@pytest.mark.parametrize(
    "override, needle",
    [
        ("trainer.lrr=1", "trainer.lrr: unknown field; did you mean lr?; allowed: "),
        ("rollout.group_size=1", "rollout.group_size"),
        ("trainer.loss.type=ppo_magic", "trainer.loss"),
        ("run.steps=-3", "run.steps"),
        ("nonsense", "section.field=value"),
    ],
)
def test_bad_fields_name_the_field(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert needle in str(err.value)


def test_malformed_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("rollout: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(f)


def test_non_mapping_yaml(tmp_path):
    f = tmp_path / "list.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(f)


def test_cli_exit_code_2_on_bad_config(tmp_path, capsys):
    code = main(["train", "trainer.nope=1", f"run.out_dir={tmp_path}"])
    assert code == 2
    assert "trainer.nope: unknown field" in capsys.readouterr().err


def test_cli_unknown_domain_exit_2(tmp_path, capsys):
    code = main(["train", "tasks.domains.nosuchdomain.weight=1", f"run.out_dir={tmp_path}"])
    assert code == 2
    assert "unknown domain 'nosuchdomain'" in capsys.readouterr().err


def test_shipped_configs_validate():
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[2].glob("configs/*.yaml"))
    assert files, "configs/ holds at least the default config"
    for f in files:
        load_config(f)


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from posttrain.cli import build_parser; build_parser(); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"
