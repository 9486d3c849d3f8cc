"""Malformed config files: one ConfigError line naming the file and the place, never a traceback,
never a silent choice (bad UTF-8, nesting deeper than the bound, alias bombs and alias cycles,
duplicate keys, a top level that is not a mapping); through `posttrain train` exit code 2."""

from __future__ import annotations

import re

import pytest

from posttrain.cli import main
from posttrain.configs import MAX_DEPTH, MAX_NODES, load_config, read_yaml
from posttrain.errors import ConfigError

_LAUGHS = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}' if prev else '1'] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "f"], strict=True)
)  # 9**6 = 531,441 values once every alias is expanded, in 6 short lines

CASES = [
    ("bad-utf8", b"run:\n  steps: 3\n  name: \xff\xfe\n", r"not valid UTF-8 at byte 24 \(line 3\)"),
    ("deep-flow", b"run: " + b"[" * 10_000 + b"]" * 10_000 + b"\n", f"line 1: nested deeper than {MAX_DEPTH} levels"),
    (
        "deep-block",
        "".join("  " * i + f"k{i}:\n" for i in range(200)).encode(),
        f"line {MAX_DEPTH}: nested deeper than {MAX_DEPTH} levels",
    ),
    ("alias-bomb", _LAUGHS.encode(), f"line 6: expands to more than {MAX_NODES} values"),
    ("alias-cycle", b"run: &a [*a]\n", "line 1: an alias refers to the node that contains it"),
    (
        "duplicate-key",
        b"run:\n  steps: 3\n  seed: 1\n  steps: 4\n",
        r"line 4: duplicate key 'steps' \(first at line 2\)",
    ),
    ("duplicate-in-flow", b"run: {steps: 3, steps: 4}\n", r"line 1: duplicate key 'steps' \(first at line 1\)"),
    ("duplicate-section", b"run: {steps: 3}\ntrainer: {}\nrun: {seed: 1}\n", "line 3: duplicate key 'run'"),
    ("not-a-mapping", b"- run\n- trainer\n", "top level must be a mapping of sections, got list"),
    ("malformed", b"run: [\n", r"line 2, column 1: malformed YAML: expected the node content"),
]


@pytest.mark.parametrize(("name", "data", "said"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_config_is_one_error_naming_the_place(tmp_path, name, data, said):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=said) as got:
        read_yaml(path)
    assert str(got.value).startswith(f"{path}: ") and "\n" not in str(got.value)


def test_merge_keys_a_bom_and_keys_of_other_types_are_not_errors(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_bytes(b"\xef\xbb\xbfshared: &s {steps: 3, seed: 7}\nrun:\n  <<: *s\n  steps: 4\nx: {1: a, '1': b}\n")
    assert read_yaml(path)["run"] == {"steps": 4, "seed": 7}
    assert read_yaml(path)["x"] == {1: "a", "1": "b"}


def test_an_override_value_is_bounded_too():
    with pytest.raises(ConfigError, match="override tasks.domains: line 1: nested deeper than"):
        load_config(None, ["tasks.domains=" + "[" * 5000 + "]" * 5000])
    assert load_config(None, ["run.name=[unclosed"]).run.name == "[unclosed"  # not YAML: stays text


@pytest.mark.parametrize("case", ["bad-utf8", "deep-flow", "duplicate-key"])
def test_posttrain_train_exits_2_with_one_line(tmp_path, capsys, case):
    _, data, said = next(c for c in CASES if c[0] == case)
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"posttrain train: error: {path}: ")
    assert re.search(said, err), err


@pytest.mark.parametrize(("name", "data", "said"), CASES, ids=[c[0] for c in CASES])
def test_posttrain_serve_reads_its_config_under_the_same_bounds(tmp_path, capsys, name, data, said):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    assert main(["serve", "--model", str(tmp_path), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(said, err), err


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("limits.max_n=" + "[" * 5000 + "]" * 5000, "override limits.max_n: line 1: nested deeper than"),
        ("port.x=1", "'port' is not a section"),
    ],
)
def test_a_serve_set_value_is_bounded_and_one_line(tmp_path, capsys, override, said):
    assert main(["serve", "--model", str(tmp_path), "--set", "port=8000", "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and said in err, err


JSON_CASES = [
    ("deep", b"[" * 100_000 + b"]" * 100_000, f"nested deeper than {MAX_DEPTH} levels"),
    ("bad-utf8", b'{"seed": "\xff"}', r"not valid UTF-8 at byte 10 \(line 1\)"),
    ("duplicate-key", b'{"seed": 1, "seed": 2}', "duplicate key 'seed'"),
    ("nan", b'{"seed": NaN}', "NaN is not a JSON number"),
    ("malformed", b'{"seed": [1,', r"line 1, column 13: malformed JSON"),
]


@pytest.mark.parametrize(("name", "data", "said"), JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_a_malformed_json_file_a_user_names_is_one_error(tmp_path, name, data, said):
    from posttrain.evaluate.heldout import HeldoutSet
    from posttrain.serve.registry import ModelRegistry

    path = tmp_path / "heldout.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=said) as got:
        HeldoutSet.load(path)
    assert str(got.value).startswith(f"{path}: ") and "\n" not in str(got.value)
    (tmp_path / "registry.json").write_bytes(data)
    with pytest.raises(ConfigError, match=said):
        ModelRegistry(tmp_path).state()


@pytest.mark.parametrize("data", [b"[]", b'{"format": 1, "sets": []}', b'{"format": 1, "sets": {}}'])
def test_a_heldout_set_of_the_wrong_shape_is_one_error(tmp_path, data):
    from posttrain.evaluate.heldout import FORMAT_VERSION, HeldoutSet

    path = tmp_path / "heldout.json"
    path.write_bytes(data.replace(b'"format": 1', f'"format": {FORMAT_VERSION}'.encode()))
    with pytest.raises(ConfigError, match="held-out set"):
        HeldoutSet.load(path)


@pytest.mark.parametrize("data", [b"[]", b'{"stable": "v1", "events": 5}', b'{"canary_share": "x"}'])
def test_a_registry_state_of_the_wrong_shape_is_one_error(tmp_path, data):
    from posttrain.serve.registry import ModelRegistry

    (tmp_path / "registry.json").write_bytes(data)
    with pytest.raises(ConfigError, match="not a registry state"):
        ModelRegistry(tmp_path).state()
