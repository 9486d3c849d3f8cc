"""The `code` domain: contract (gold 1.0, wrong < 1.0, deterministic, disjoint
splits) and anti-cheat: a solution cannot turn a failing suite into a pass,
not even by reading every frame and object of its process; the script judge
of the coding loop the same. (Memory and file leak scans: test_sandbox_leaks.py.)"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os

import pytest

from posttrain.domains.code import CHEATS
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
    path = os.path.join(
        os.path.dirname(importlib.util.find_spec("posttrain.domains.code").origin), "data", "code", "build.py"
    )
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
        return (
            t.reference.name,
            DOMAIN.score(t, Episode(DOMAIN.gold(t))).value,
            DOMAIN.score(t, Episode(DOMAIN.wrong(t))).value,
        )

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        for name, gold, wrong in ex.map(both, tasks):
            assert gold == 1.0 and wrong < 1.0, name


@root_only
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_declared_cheats_score_zero(cheat):
    task = DOMAIN.sample(0, "train", 1)
    s = score(task, CHEATS[cheat].replace("ENTRY", task.reference.name))
    assert s.value == 0.0 and not s.passed, (cheat, s)


def _level3_functions():
    return [t for t in _all_tasks() if t.meta.difficulty == 3 and t.reference.kind == "function"]


@root_only
@pytest.mark.parametrize("attack", ["frame_walk", "gc_scan"])
def test_answer_finding_attacks_score_zero_on_every_level3_task(attack):
    """Before the host-side judge these scored 1.00 on every level-3 function
    task (the worker's fork held the request with the expected values)."""
    tasks = _level3_functions()
    assert len(tasks) >= 15
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        scores = list(ex.map(lambda t: score(t, CHEATS[attack].replace("ENTRY", t.reference.name)), tasks))
    assert all(s.value == 0.0 for s in scores), [(t.reference.name, s) for t, s in zip(tasks, scores) if s.value]


@root_only
@pytest.mark.parametrize("attack", ["frame_walk", "gc_scan"])
def test_the_attacks_win_where_the_answers_are_in_the_request(attack):
    """Control: the same attacks score 1.0 against a leaky request that carries
    the tests with their expected values, so the test above can fail."""
    import dataclasses

    from posttrain import sandbox
    from posttrain.domains.code import build_request, execute, judge

    task = _level3_functions()[0]
    ref = task.reference

    def leaky(req):
        spec = json.loads(req.stdin) | {"tests": json.loads(ref.tests_json)}
        return sandbox.run(dataclasses.replace(req, stdin=json.dumps(spec).encode()))

    assert json.loads(build_request(ref, "").stdin).keys() == {"entry", "kind", "timeout_s", "inputs"}
    run = execute(ref, CHEATS[attack].replace("ENTRY", ref.name), runner=leaky)
    assert judge(ref, run).value == 1.0


def test_the_request_does_not_depend_on_the_expected_values():
    """Everything the sandbox receives is a function of the solution and the
    inputs: changing every expected value leaves the request byte-identical."""
    import dataclasses

    from posttrain.domains.code import build_request

    for task in _all_tasks():
        ref = task.reference
        tests = [dict(t, expected=["changed", i]) for i, t in enumerate(json.loads(ref.tests_json))]
        other = dataclasses.replace(ref, tests_json=json.dumps(tests))
        a, b = build_request(ref, "x = 1\n"), build_request(other, "x = 1\n")
        assert a == b and ref.tests_json != other.tests_json
        assert b'"expected"' not in a.stdin and all(
            b'"expected"' not in (v if isinstance(v, bytes) else v.encode()) for v in a.files.values()
        )


def test_host_side_comparison_is_strict_about_types():
    from posttrain.domains.code import CodeReference, CodeRun, TestOutput, judge

    ref = CodeReference.build(
        "f",
        "function",
        "exact",
        [{"args": [1], "expected": 1}, {"args": [2], "expected": [1, 2]}, {"args": [3], "expected": {"a": 1.5}}],
        2.0,
    )
    assert (
        judge(
            ref, CodeRun((TestOutput("value", 1), TestOutput("value", [1, 2]), TestOutput("value", {"a": 1.5})), "ok")
        ).value
        == 1.0
    )
    for got in (True, 1.0, "1", None, [1]):
        assert not judge(ref, CodeRun((TestOutput("value", got),) + (TestOutput("none"),) * 2, "ok")).value
    approx = CodeReference.build("f", "function", "approx", [{"args": [], "expected": [0.1, 2]}], 2.0)
    assert judge(approx, CodeRun((TestOutput("value", [0.1 + 1e-12, 2.0]),), "ok")).passed
    unordered = CodeReference.build("f", "function", "unordered", [{"args": [], "expected": [[1], [2], [2]]}], 2.0)
    assert judge(unordered, CodeRun((TestOutput("value", [[2], [1], [2]]),), "ok")).passed
    assert not judge(unordered, CodeRun((TestOutput("value", [[2], [1], [1]]),), "ok")).passed
    deep = [[]]
    for _ in range(5000):
        deep = [deep]
    assert not judge(approx, CodeRun((TestOutput("value", deep),), "ok")).passed
    with pytest.raises(ValueError, match="kind"):
        CodeReference.build("f", "method", "exact", [{"args": [], "expected": 1}], 2.0)
    with pytest.raises(ValueError, match="tests"):
        CodeReference.build("f", "function", "exact", [{"expected": 1}], 2.0)


def test_driver_lines_out_of_order_or_missing_are_no_result():
    from posttrain.domains.code import parse_outputs

    lines = b'{"i": 0, "value": 1}\n{"i": 2, "value": 3}\n'
    outs = parse_outputs(lines, 3)
    assert [o.kind for o in outs] == ["value", "none", "none"]
    assert [o.kind for o in parse_outputs(b'junk\n{"i": 0, "value": 1}\n', 1)] == ["none"]


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


# ---------------------------------------------------------------- the coding loop's script judge

SCRIPT_TESTS = """from solution import f
for x in (2, 3, 5):
    got = f(x)
    assert got == x * 3, f"f({x}) returned {got!r}, expected {x * 3}"
"""
GOOD = "def f(x):\n    print('debug output')\n    return x * 3\n"
SCRIPT_CHEATS = {
    "exit_at_import": "import sys\nsys.exit(0)\n",
    "hard_exit": "import os\nos._exit(0)\n",
    "system_exit_in_call": "def f(x):\n    raise SystemExit(0)\n",
    "kill_runner": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "fake_success": "import os, sys\nprint('All tests passed.')\nsys.stdout.flush()\nos._exit(0)\n",
    "equal_to_anything": "class A:\n    def __eq__(self, other): return True\ndef f(x): return A()\n",
    "int_subclass": "class T(int):\n    def __eq__(self, other): return True\ndef f(x): return T(0)\n",
    "read_tests": "import gc, glob, os\nSEEN = [open(p, errors='replace').read() for p in glob.glob('/task/*') + "
    "glob.glob('/tmp/*')]\n"
    "def f(x):\n    return [s for s in SEEN if 'expected' in s] or [o for o in gc.get_objects() if isinstance(o, str) "
    "and 'expected' in o]\n",
}


def _script_task(tests=SCRIPT_TESTS):
    from posttrain.types import Message, Task, TaskMeta

    return Task("script:0", "test", (Message("user", "write f"),), {"tests": tests}, TaskMeta("train", 1, "test", "1"))


@root_only
def test_script_judge_passes_a_solution_and_fails_a_wrong_one():
    from posttrain.envs import script_judge

    judge = script_judge()
    good = judge(_script_task(), GOOD)
    assert good.passed and good.status == "ok"
    wrong = judge(_script_task(), GOOD.replace("x * 3", "x * 2"))
    assert not wrong.passed and "f(2) returned 4, expected 6" in wrong.feedback
    name_error = judge(_script_task(), "def f(x):\n    return x * factor\n")
    assert not name_error.passed and "NameError" in name_error.feedback


@root_only
@pytest.mark.parametrize("cheat", sorted(SCRIPT_CHEATS))
def test_script_judge_cheats_fail(cheat):
    from posttrain.envs import script_judge

    attempt = script_judge()(_script_task(), SCRIPT_CHEATS[cheat])
    assert not attempt.passed, (cheat, attempt)


@root_only
def test_script_judge_tests_are_not_in_the_solvers_memory_or_files():
    """A marker in the test script is nowhere the solution can read: its own
    memory, every readable /proc/PID/mem, fd/0, cmdline, environ, or a file
    under /task or /tmp; the test script asserts that nothing was found."""
    import secrets

    from posttrain.envs import script_judge

    marker = "MARK" + "ER-" + secrets.token_hex(16)
    tests = f"# {marker}\nfrom solution import found\nhits = found()\nassert hits == [], hits\n"
    scan = r"""import glob, os, re
PAT = re.compile(rb"MARKER-[0-9a-f]{32}")
def found():
    hits = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self"]:
        for name in ("fd/0", "cmdline", "environ"):
            try:
                if PAT.search(open(f"/proc/{pid}/{name}", "rb").read(1 << 22)):
                    hits.append(f"{pid}/{name}")
            except OSError:
                pass
        try:
            maps, mem = open(f"/proc/{pid}/maps"), open(f"/proc/{pid}/mem", "rb", buffering=0)
        except OSError:
            continue
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                mem.seek(lo)
                if line.split()[1][0] == "r" and PAT.search(mem.read(hi - lo)):
                    hits.append(f"{pid}/mem")
            except (OSError, ValueError, OverflowError):
                pass
    for p in glob.glob("/task/**", recursive=True) + glob.glob("/tmp/**", recursive=True):
        try:
            if PAT.search(open(p, "rb").read()):
                hits.append(p)
        except OSError:
            pass
    return hits
"""
    attempt = script_judge()(_script_task(tests), scan)
    assert attempt.passed, attempt.feedback
    # control: the scan does find the marker where it is readable (a file of the run)
    leaky = script_judge(runner=lambda req: _with_file(req, "leak.txt", marker))
    assert not leaky(_script_task(tests), scan).passed
    # control: and in its own memory (a marker built at run time, in no file)
    in_memory = scan + "HELD = ''.join(['MARK', 'ER-', '0f' * 16]).encode()\n"
    assert not script_judge()(_script_task(tests), in_memory).passed


def _with_file(req, name, text):
    import dataclasses

    from posttrain import sandbox

    return sandbox.run(dataclasses.replace(req, files=dict(req.files) | {name: text}))


# ---------------------------------------------------------------- the probe at the start of `posttrain train`


@root_only
@pytest.mark.heavy
def test_posttrain_train_probes_the_code_and_terminal_cheats(tmp_path, micro_base):
    """A real `posttrain train` on code and terminal scores every declared cheat
    of both at start and finds every one rejected, so it trains on both."""
    from posttrain.cli import main
    from posttrain.metrics_log import read_metrics

    code = main(
        [
            "train",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens=6",
            "eval.tasks_per_domain=2",
            "eval.max_tokens=6",
            "run.threads=1",
            "run.progress=false",
            "run.steps=1",
            "monitor.probes.tasks=2",
            "tasks.domains={code: {difficulty: 1}, terminal: {difficulty: 1}}",
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=probe",
        ]
    )
    assert code == 0
    probes = {r["domain"]: r for r in read_metrics(tmp_path / "probe" / "metrics.jsonl", "probe")}
    from posttrain.domains import terminal as T

    assert probes["code"]["declared"] and probes["code"]["ok"] and probes["code"]["cheats"] == 2 * len(CHEATS)
    assert (
        probes["terminal"]["declared"]
        and probes["terminal"]["ok"]
        and probes["terminal"]["cheats"] == 2 * len(T.CHEATS)
    )
    assert probes["code"]["infra_errors"] == probes["terminal"]["infra_errors"] == 0


@root_only
def test_inputs_are_isolated_and_one_bad_input_does_not_sink_the_others():
    """Module state is fresh for every input; an input that hangs, kills its
    process or leaves a thread behind costs that input only."""
    from posttrain.domains.code import CodeReference, execute

    ref = CodeReference.build("f", "function", "exact", [{"args": [i], "expected": i} for i in range(6)], 1.0)
    counter = "CALLS = []\ndef f(x):\n    CALLS.append(x)\n    return len(CALLS) - 1 + x\n"
    assert [o.value for o in execute(ref, counter).outputs] == [0, 1, 2, 3, 4, 5]
    bad = (
        "import os, threading, time\ndef f(x):\n    if x == 1:\n        while True: pass\n    if x == 2:\n        "
        "os._exit(3)\n"
        "    if x == 3:\n        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n    return x\n"
    )
    outs = execute(ref, bad).outputs
    assert [(o.kind, o.value, o.detail) for o in outs] == [
        ("value", 0, ""),
        ("none", None, "timeout"),
        ("none", None, "no result"),
        ("value", 3, ""),
        ("value", 4, ""),
        ("value", 5, ""),
    ]
