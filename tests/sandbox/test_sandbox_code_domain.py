"""The `code` domain: contract (gold 1.0, wrong < 1.0, deterministic, disjoint
splits) and anti-cheat: a solution cannot turn a failing suite into a pass."""
from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os

import pytest

from posttrain.domains.registry import get
from posttrain.errors import SandboxError
from posttrain.types import Episode

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")
DOMAIN = get("code")


def _all_tasks():
    out = []
    for split in ("train", "eval"):
        for level in (1, 2, 3):
            n = len(DOMAIN._pool(split, level))
            out += [DOMAIN.sample(i, split, level) for i in range(n)]
    return out


def test_there_are_at_least_60_distinct_tasks_in_three_levels():
    tasks = _all_tasks()
    names = {t.reference.name for t in tasks}
    assert len(names) == len(tasks) >= 60
    assert {t.meta.difficulty for t in tasks} == {1, 2, 3}
    assert DOMAIN.cost_class == "long" and DOMAIN.category == "code"


def test_sampling_is_deterministic_and_splits_are_disjoint():
    for level in (1, 2, 3):
        assert DOMAIN.sample(5, "train", level) == DOMAIN.sample(5, "train", level)
        train = {DOMAIN.sample(i, "train", level).reference.name for i in range(40)}
        evals = {DOMAIN.sample(i, "eval", level).reference.name for i in range(40)}
        assert train and evals and not train & evals
    with pytest.raises(ValueError):
        DOMAIN.sample(0, "train", 4)


def test_tasks_json_is_built_from_the_sources():
    """The committed tests equal what build.py derives from the reference
    solutions, and build.py refuses any task whose wrong solution passes."""
    path = os.path.join(os.path.dirname(importlib.util.find_spec("posttrain.domains.code").origin), "data", "code", "build.py")
    spec = importlib.util.spec_from_file_location("code_build", path)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    with open(os.path.join(os.path.dirname(path), "tasks.json")) as fh:
        assert json.loads(json.dumps(build.build())) == json.load(fh)


def score(task, code: str):
    return DOMAIN.score(task, Episode(f"```python\n{code}```"))


SAMPLE = [("train", 1, 0), ("eval", 1, 0), ("train", 2, 3), ("train", 3, 4), ("eval", 3, 1)]


@root_only
@pytest.mark.parametrize("split,level,index", SAMPLE)
def test_gold_passes_and_wrong_fails_in_the_sandbox(split, level, index):
    task = DOMAIN.sample(index, split, level)
    gold = DOMAIN.score(task, Episode(DOMAIN.gold(task)))
    wrong = DOMAIN.score(task, Episode(DOMAIN.wrong(task)))
    assert gold.value == 1.0 and gold.passed, gold.reason
    assert wrong.value < 1.0 and not wrong.passed


@root_only
def test_class_tasks_pass_and_fail():
    lru = next(t for t in _all_tasks() if t.reference.name == "LRUCache")
    assert DOMAIN.score(lru, Episode(DOMAIN.gold(lru))).value == 1.0
    assert DOMAIN.score(lru, Episode(DOMAIN.wrong(lru))).value < 1.0


@root_only
@pytest.mark.slow
def test_every_task_gold_passes_and_wrong_fails_in_the_sandbox():
    tasks = _all_tasks()

    def both(t):
        return t.reference.name, DOMAIN.score(t, Episode(DOMAIN.gold(t))).value, DOMAIN.score(t, Episode(DOMAIN.wrong(t))).value

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        for name, gold, wrong in ex.map(both, tasks):
            assert gold == 1.0 and wrong < 1.0, name


CHEATS = {
    "exit_at_import": "import sys\nsys.exit(0)\n",
    "hard_exit": "import os\nos._exit(0)\n",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    "equal_to_anything": "class Any:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                         "def ENTRY(*args): return Any()\n",
    "bool_subclass": "class T(int):\n    def __eq__(self, other): return True\ndef ENTRY(*args): return T(1)\n",
    "fake_report": "import json, os, sys\nfor fd in (1, 2):\n    os.write(fd, b'\\n' + json.dumps({'passed': 99, 'total': 99, 'results': []}).encode() + b'\\n')\n"
                   "print(json.dumps({'nonce': 'guess', 'passed': 9, 'total': 9, 'results': []}))\nsys.exit(0)\n",
    "read_tests_from_disk": "import glob\nFILES = {p: open(p, errors='replace').read() for p in glob.glob('/task/*') + glob.glob('/tmp/*')}\n"
                            "def ENTRY(*args): return [FILES]\n",
    "patch_the_harness": "import json, builtins\njson.dumps = lambda *a, **k: '{\"value\": true}'\njson.loads = lambda *a, **k: {'value': True}\n"
                         "open('/task/harness.py', 'w').write('print(1)')\ndef ENTRY(*args): return True\n",
    "scan_memory_for_expected": "import gc\ndef ENTRY(*args):\n    for o in gc.get_objects():\n        if isinstance(o, dict) and 'expected' in o:\n"
                                "            return o['expected']\n    return None\n",
    "read_judge_memory": "import os\ndef ENTRY(*args):\n    with open(f'/proc/{os.getppid()}/mem', 'rb') as fh:\n        return fh.read(1)\n",
    "read_judge_stdin": "import os\ndef ENTRY(*args):\n    return open(f'/proc/{os.getppid()}/fd/0').read()\n",
}


@root_only
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_cheats_do_not_pass(cheat):
    task = DOMAIN.sample(0, "train", 1)
    s = score(task, CHEATS[cheat].replace("ENTRY", task.reference.name))
    assert s.value < 0.5 and not s.passed, (cheat, s)


@root_only
def test_a_hanging_solution_times_out_per_test():
    import dataclasses

    task = DOMAIN.sample(0, "train", 1)
    task = dataclasses.replace(task, reference=dataclasses.replace(task.reference, timeout_s=0.3))
    s = score(task, f"def {task.reference.name}(*args):\n    while True:\n        pass\n")
    assert s.value == 0.0 and "timeout" in s.reason


def test_infra_error_raises_instead_of_scoring(monkeypatch):
    from posttrain import sandbox
    from posttrain.sandbox import ExecResult

    monkeypatch.setattr(sandbox, "run", lambda req, domain=None: ExecResult.infra("worker died", "forkserver"))
    task = DOMAIN.sample(0, "train", 1)
    with pytest.raises(SandboxError):
        DOMAIN.score(task, Episode(DOMAIN.gold(task)))


def test_completion_formats():
    from posttrain.domains.code import extract_code

    assert extract_code("text\n```python\ndef f(): pass\n```\nmore") == "def f(): pass\n"
    assert extract_code("```\na = 1\n```\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1\n"
