"""The base model cache: a cached base is used only while this code would build it from the same data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from posttrain.configs.base import BaseConfig
from posttrain.model import pretrain

MICRO = BaseConfig(preset="micro", steps=3, batch_size=4, threads=1, domains={"add": 1, "lookup": 1})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain, "DEFAULT_CACHE", tmp_path)
    builds: list[str] = []
    real = pretrain.build_base

    def counting(cfg, out=None, progress=True):
        builds.append(str(out))
        return real(cfg, out, progress=False)

    monkeypatch.setattr(pretrain, "build_base", counting)
    return builds


def test_a_cached_base_is_reused_while_its_data_is_the_same(cache):
    said: list[str] = []
    assert not pretrain.is_cached(MICRO)
    out = pretrain.ensure_base(MICRO, log=said.append)
    assert pretrain.is_cached(MICRO)
    info = json.loads((out / "posttrain_base.json").read_text())
    assert info["data_digest"] == pretrain.data_digest(MICRO)
    assert pretrain.ensure_base(MICRO, log=said.append) == out
    assert len(cache) == 1 and said == []


def test_a_changed_generator_or_unrecorded_digest_rebuilds(cache, monkeypatch):
    said: list[str] = []
    out = pretrain.ensure_base(MICRO, log=said.append)
    before = pretrain.data_digest(MICRO)
    # the add domain's buggy solver changes (as a code change would): same config, other data
    monkeypatch.setitem(pretrain.BUGS, "add", lambda question: "7")
    assert pretrain.data_digest(MICRO) != before and not pretrain.is_cached(MICRO)
    assert pretrain.ensure_base(MICRO, log=said.append) == out
    assert len(cache) == 2 and "rebuilding" in said[-1] and before in said[-1]
    assert json.loads((out / "posttrain_base.json").read_text())["data_digest"] == pretrain.data_digest(MICRO)
    # a cache written before the digest was recorded: rebuilt too, never trusted
    info = json.loads((out / "posttrain_base.json").read_text())
    del info["data_digest"]
    (out / "posttrain_base.json").write_text(json.dumps(info))
    pretrain.ensure_base(MICRO, log=said.append)
    assert len(cache) == 3 and "not recorded" in said[-1]
    (out / "posttrain_base.json").write_text("{not json")
    pretrain.ensure_base(MICRO, log=said.append)
    assert len(cache) == 4


def test_the_digest_is_the_same_in_every_process():
    """No hash seed, set order or clock in it, else every run would rebuild the base."""
    code = (
        "from posttrain.configs.base import BaseConfig; from posttrain.model.pretrain import data_digest;"
        "print(data_digest(BaseConfig()), data_digest(BaseConfig(domains={'lookup': 1, 'sort': 1})))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1 and len(outs.pop().split()) == 2


def test_the_digest_follows_what_the_config_builds():
    base = BaseConfig()
    assert pretrain.data_digest(base) != pretrain.data_digest(BaseConfig(seed=1))
    assert pretrain.data_digest(base) != pretrain.data_digest(BaseConfig(buggy_fraction=0.9))
    assert pretrain.data_digest(base) != pretrain.data_digest(BaseConfig(preset="micro"))
    # threads and steps change how it trains, not what it reads
    assert pretrain.data_digest(base) == pretrain.data_digest(BaseConfig(threads=1, steps=5))
