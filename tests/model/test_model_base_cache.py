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
    assert len(cache) == 1 and len(said) == 1  # the build was announced; the reuse says nothing
    assert said[0].startswith(f"posttrain: building the base model {out} (not cached") and "not built" in said[0]


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


def test_a_build_holds_the_lock_that_other_processes_wait_on(cache, monkeypatch):
    """Test workers and runs on one machine share the cache: while one builds a base, the lock
    beside it is held, so another asking for the same base waits instead of building it too."""
    import fcntl

    held: list[bool] = []
    counting = pretrain.build_base

    def probing(cfg, out=None, progress=True):
        with open(out.with_name(out.name + ".lock"), "w") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return counting(cfg, out, progress)

    monkeypatch.setattr(pretrain, "build_base", probing)
    pretrain.ensure_base(MICRO)
    assert held == [True] and len(cache) == 1


def test_a_base_built_while_waiting_on_the_lock_is_not_built_again(cache, monkeypatch):
    """The check is made again under the lock: a process that saw no base, then waited while
    another built it, takes the built one."""
    out = pretrain.ensure_base(MICRO)
    real, calls = pretrain._stored_digest, []

    def missing_at_first(path):
        calls.append(path)
        return None if len(calls) == 1 else real(path)  # the first look is before the other's build ended

    monkeypatch.setattr(pretrain, "_stored_digest", missing_at_first)
    assert pretrain.ensure_base(MICRO) == out
    assert len(cache) == 1 and len(calls) == 2
