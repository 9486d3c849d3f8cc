"""Bases built in the open: the build time stored with each base, `train`'s notice before it
builds one, and `posttrain base list` / `posttrain base build` over configs."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.configs.base import BaseConfig
from posttrain.model import pretrain

MICRO = {"preset": "micro", "steps": 3, "batch_size": 4, "threads": 1, "domains": {"add": 1}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain, "DEFAULT_CACHE", tmp_path / "cache")
    return tmp_path / "cache"


def _yaml(path, base=None, model=None):
    lines = []
    if base:
        lines.append("base: " + json.dumps(base))
    if model:
        lines.append(f"model: {{path: {model}}}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_build_records_its_time_and_the_next_notice_quotes_it(cache):
    cfg = BaseConfig(**MICRO)
    assert pretrain.last_build(cfg) is None
    assert "not built on this machine before (3 pretraining steps of preset micro)" in pretrain.build_note(cfg)
    said: list[str] = []
    out = pretrain.ensure_base(cfg, progress=False, log=said.append)
    info = json.loads((out / "posttrain_base.json").read_text())
    assert info["build_seconds"] >= info["pretrain_seconds"] > 0
    rows = [json.loads(line) for line in (cache / pretrain.BUILDS).read_text().splitlines()]
    assert [(r["base"], r["preset"], r["steps"]) for r in rows] == [(out.name, "micro", 3)]
    seconds, why = pretrain.last_build(cfg)
    assert seconds == rows[0]["seconds"] and why == ""
    assert pretrain.build_note(cfg) == f"the last build took {pretrain.duration(seconds)}"
    # another base of the preset, never built: an estimate scaled by steps, said to be one
    longer = BaseConfig(**{**MICRO, "steps": 30})
    seconds, why = pretrain.last_build(longer)
    assert seconds == pytest.approx(rows[0]["seconds"] * 10) and "estimated from a 3-step build of preset micro" in why
    assert pretrain.build_note(longer).startswith("about ")
    # a base of other domains or batch size: its steps cost what its examples cost (long.yaml's
    # 1,000-character examples against the demo's 15): no estimate from this build
    for other in ({"domains": {"keychain": 1}}, {"batch_size": 8}):
        cfg_other = BaseConfig(**{**MICRO, "steps": 30, **other})
        assert pretrain.last_build(cfg_other) is None
        assert pretrain.build_note(cfg_other).startswith("not built on this machine before")


def test_durations_read_as_a_person_writes_them():
    assert [pretrain.duration(s) for s in (4.4, 59.6, 292, 3725)] == ["4s", "1m00s", "4m52s", "1h02m"]


def test_base_list_says_which_base_each_config_uses_and_whether_it_is_cached(cache, tmp_path, capsys):
    a = _yaml(tmp_path / "a.yaml", MICRO)
    b = _yaml(tmp_path / "b.yaml", {**MICRO, "seed": 1})
    c = _yaml(tmp_path / "c.yaml", model="/some/model")
    pretrain.ensure_base(BaseConfig(**MICRO), progress=False, log=lambda m: None)
    assert main(["base", "list", a, b, c]) == 0
    lines = capsys.readouterr().out.splitlines()
    name_a, name_b = (pretrain.default_dir(BaseConfig(**m)).name for m in (MICRO, {**MICRO, "seed": 1}))
    assert lines[0].startswith(f"{a}: {name_a} (preset micro, 3 steps): cached; the last build took ")
    assert lines[1].startswith(f"{b}: {name_b} (preset micro, 3 steps): not built; about ")
    assert lines[2] == f"{c}: model.path /some/model: no embedded base"
    assert lines[3].startswith("1 without their base: `posttrain base build CONFIG`")
    assert lines[4] == f"cache folder: {cache}"


def test_base_build_builds_each_base_once_saying_so_first(cache, tmp_path, capsys):
    a = _yaml(tmp_path / "a.yaml", MICRO)
    a2 = _yaml(tmp_path / "a2.yaml", MICRO)  # the same base, another config
    c = _yaml(tmp_path / "c.yaml", model="/some/model")
    assert main(["base", "build", a, a2, c]) == 0
    out = capsys.readouterr().out
    built = pretrain.default_dir(BaseConfig(**MICRO))
    assert f"{c}: model.path /some/model: no embedded base to build" in out
    assert f"building the base model {built} (not cached" in out and f"(for {a}, {a2})" in out
    assert out.count("base model built:") == 1 and pretrain.is_cached(BaseConfig(**MICRO))
    assert main(["base", "build", a]) == 0
    assert f"base model already built: {built} ({a})" in capsys.readouterr().out
    assert main(["base", "build", a, "--force"]) == 0
    again = capsys.readouterr().out
    assert f"building base {built} for {a}: the last build took " in again
    assert len((cache / pretrain.BUILDS).read_text().splitlines()) == 2


def test_base_build_without_a_config_says_it_builds_the_defaults_base(cache, capsys, monkeypatch):
    built: list[str] = []
    monkeypatch.setattr(pretrain, "ensure_base", lambda cfg, log=None: built.append(cfg) or "DIR")
    assert main(["base", "build", "base.steps=3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no config given: the base of the built-in defaults")
    assert [c.steps for c in built] == [3] and "base model built: DIR" in out


def test_base_build_all_reads_the_configs_folder(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["base", "build", "--all"]) == 2
    assert "--all: no configs/*.yaml in the current folder" in capsys.readouterr().err
    (tmp_path / "configs").mkdir()
    _yaml(tmp_path / "configs" / "x.yaml", model="/m")
    assert main(["base", "build", "--all"]) == 0
    assert "configs/x.yaml: model.path /m: no embedded base to build" in capsys.readouterr().out
    assert main(["base", "list"]) == 0  # no config named: every configs/*.yaml
    assert capsys.readouterr().out.startswith("configs/x.yaml: model.path /m: no embedded base")
