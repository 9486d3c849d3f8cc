"""Build tasks.json (the hidden tests with expected values) from tasks_l*.py.

Invariant: every expected value is what the task's reference solution returns
on a fresh copy of the arguments, converted to plain JSON data; a task whose
wrong solution passes every test is refused. `visible` lists the tests the
coding loop shows (`visible_tests`); the others stay hidden. Run after editing a task:

    .venv/bin/python src/posttrain/domains/data/code/build.py
"""

import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from driver import _plain  # noqa: E402  (the driver's own encoder)

from posttrain.domains.code import same as _same  # noqa: E402  (the host's comparison)


def load_sources() -> list:
    import tasks_l1
    import tasks_l2
    import tasks_l3

    out = []
    for level, mod in ((1, tasks_l1), (2, tasks_l2), (3, tasks_l3)):
        for t in mod.TASKS:
            out.append(dict(t, level=level, kind=t.get("kind", "function"), mode=t.get("mode", "exact")))
    return out


def run_all(source: str, task: dict) -> list:
    ns: dict = {"__name__": "solution"}
    exec(compile(source, "solution.py", "exec"), ns)
    target = ns[task["name"]]
    outs = []
    for args in task["inputs"]:
        try:
            if task["kind"] == "class":
                obj, res = None, []
                for method, margs in copy.deepcopy(args):
                    if method == "__init__":
                        obj = target(*margs)
                        res.append(None)
                    else:
                        res.append(getattr(obj, method)(*margs))
                outs.append(_plain(res))
            else:
                outs.append(_plain(target(*copy.deepcopy(args))))
        except Exception as exc:  # a wrong solution may raise
            outs.append(("raised", repr(exc)))
    return outs


def visible_tests(wrong_fails: list) -> list:
    """The tests the coding loop (`code_revise`) shows and runs each turn: about a
    third, in order, never the last test the wrong solution fails, so the
    hidden rest still tells the wrong solution from the reference."""
    want, out = max(1, len(wrong_fails) // 3), []
    for i, fails in enumerate(wrong_fails):
        if len(out) == want:
            break
        if fails and sum(wrong_fails[j] for j in range(len(wrong_fails)) if j != i and j not in out) == 0:
            continue
        out.append(i)
    return out


def build() -> list:
    tasks = []
    for t in load_sources():
        expected = run_all(t["solution"], t)
        if any(isinstance(e, tuple) for e in expected):
            raise SystemExit(f"{t['name']}: reference solution raised: {expected}")
        wrong = run_all(t["wrong"], t)
        if all(not isinstance(w, tuple) and _same(w, e, t["mode"]) for w, e in zip(wrong, expected)):
            raise SystemExit(f"{t['name']}: the wrong solution passes every test")
        key = "calls" if t["kind"] == "class" else "args"
        tests = [{key: args, "expected": e} for args, e in zip(t["inputs"], expected)]
        fails = [isinstance(w, tuple) or not _same(w, e, t["mode"]) for w, e in zip(wrong, expected)]
        tasks.append(
            {k: t[k] for k in ("name", "level", "kind", "mode", "prompt", "solution", "wrong")}
            | {"tests": tests, "visible": visible_tests(fails)}
        )
    names = [t["name"] for t in tasks]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate task names")
    return tasks


if __name__ == "__main__":
    data = build()
    with open(os.path.join(HERE, "tasks.json"), "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"wrote {len(data)} tasks")
