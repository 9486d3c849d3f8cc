"""The contract, for every registered domain: the gold answer scores 1.0, a
wrong answer scores less, tasks land in the split asked for, and two
processes (with different PYTHONHASHSEED) produce the same tasks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from posttrain.domains.base import Domain
from posttrain.domains.registry import all_domains
from posttrain.types import Episode, to_dict

DOMAINS = all_domains()
NAMES = sorted(DOMAINS)


def test_at_least_200_domains():
    assert len(DOMAINS) >= 200


def _levels(d) -> list[int]:
    return [1] if d.cost_class == "long" else sorted({1, d.levels})


@pytest.mark.parametrize("name", NAMES)
def test_gold_scores_one_and_wrong_scores_less(name):
    d = DOMAINS[name]
    assert d.name == name and d.levels >= 1 and d.cost_class in ("short", "long")
    for level in _levels(d):
        for split in ("train", "eval"):
            task = d.sample(1, split, level)
            assert (task.domain, task.meta.split, task.meta.difficulty) == (name, split, level)
            gold = d.score(task, Episode(d.gold(task)))
            wrong = d.score(task, Episode(d.wrong(task)))
            assert gold.value == d.gold_value(task) and gold.passed, (task.id, gold)
            assert wrong.value < gold.value and not wrong.passed, (task.id, wrong)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_contract_at_every_level(name):
    d = DOMAINS[name]
    for level in range(1, d.levels + 1):
        for index in range(3):
            task = d.sample(index, "train", level)
            assert d.score(task, Episode(d.gold(task))).value == d.gold_value(task)
            assert d.score(task, Episode(d.wrong(task))).value < d.gold_value(task)


_DIGEST = """
import hashlib, json, sys
from posttrain.domains.registry import all_domains
from posttrain.types import to_dict
out = {}
for name, d in all_domains().items():
    tasks = [d.sample(i, s, 1) for s in ("train", "eval") for i in (0, 7)]
    blob = json.dumps([to_dict(t) for t in tasks], sort_keys=True, default=str)
    out[name] = hashlib.sha256(blob.encode()).hexdigest()[:16]
print("\\n@@" + json.dumps(out))
"""


@pytest.mark.heavy
def test_two_processes_produce_the_same_tasks():
    procs = []
    for hash_seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, OMP_NUM_THREADS="1")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _DIGEST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
            )
        )
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.rsplit("@@", 1)[1]))  # some generators print progress dots
    assert set(outs[0]) == set(NAMES)
    differ = sorted(n for n in outs[0] if outs[0][n] != outs[1][n])
    assert differ == [], f"tasks differ across processes: {differ}"
    # and this process agrees with them
    d = DOMAINS["math_gcd"]
    blob = json.dumps(
        [to_dict(d.sample(i, s, 1)) for s in ("train", "eval") for i in (0, 7)], sort_keys=True, default=str
    )
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == outs[0]["math_gcd"]


def test_every_task_reference_is_json():
    for name in NAMES:
        task = DOMAINS[name].sample(0, "train", 1)
        json.dumps(to_dict(task))


def test_declared_cheats_are_rejected_by_every_domain_of_ours():
    from posttrain.monitor.probes import probe_domain

    ours = [n for n in NAMES if n.startswith(("rg_", "math_", "doc_", "fin_", "sql_", "tool_", "geo_"))]
    for name in ours:
        d = DOMAINS[name]
        assert type(d).cheats is not Domain.cheats, name  # each family declares its own (the default is none)
        result = probe_domain(d, 1, 1 if name.startswith(("geo_", "rg_")) else 2)
        assert result is not None and result.cheats > 0 and not result.accepted, result
