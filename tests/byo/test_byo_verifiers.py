"""Verifiers by name: each built-in scores gold 1 and a wrong answer below 1; a user's callable runs
in a worker with a time limit; an exception it raises on a completion is a model fault, blamed on
the verifier (infra, never reward 0) when it raises on the gold answer too; a hang is infra."""

from __future__ import annotations

import concurrent.futures
import json
import os
import sqlite3
import time

import pytest

from posttrain.byo.domain import RowRef
from posttrain.byo.verifiers import build_verifier
from posttrain.configs.byo import VerifierSpec
from posttrain.errors import ConfigError, ModelFault, VerifierError
from posttrain.types import Episode, Message, Task, TaskMeta

USERFNS = os.path.join(os.path.dirname(__file__), "userfns")


def task(answer, prompt="q", **metadata) -> Task:
    return Task("t:1", "t", (Message("user", prompt),), RowRef(answer, metadata), TaskMeta("train", 1, "test", "v"))


def score(spec, answer, completion, **metadata):
    return build_verifier(VerifierSpec.model_validate(spec)).score(task(answer, **metadata), Episode(completion))


@pytest.mark.parametrize(
    "spec, answer, good, bad",
    [
        ({"name": "exact"}, "Paris", "<answer>Paris</answer>", "<answer>paris</answer>"),
        (
            {"name": "exact", "case_sensitive": False, "strip_punctuation": True},
            "Paris",
            "<answer> paris. </answer>",
            "Lyon",
        ),
        ({"name": "exact"}, ["NYC", "New York"], "New  York", "York"),
        ({"name": "numeric", "tolerance": 0.01}, "3.14159", "about 3.14", "3.2"),
        ({"name": "numeric", "relative": 0.01}, 1000, "1,005", "1,020"),
        ({"name": "numeric"}, "0.75", "3/4", "2/3"),
        ({"name": "choice", "letters": "ABCDE"}, "C", "The answer is (C).", "I pick B"),
        ({"name": "regex"}, r"\d{3}-\d{4}", "555-1234", "555-12345"),
        ({"name": "regex", "pattern": "(?i)^.*{answer}$", "full": False}, "blue", "it is BLUE", "blue sky"),
        (
            {"name": "json", "required": ["name"], "types": {"age": "integer"}},
            {"name": "Ada", "age": 36},
            '```json\n{"name": "ada", "age": 36}\n```',
            '{"name": "Ada", "age": 37}',
        ),
        ({"name": "math"}, "\\frac{1}{2}", "<answer>0.5</answer>", "<answer>1/3</answer>"),
        ({"name": "math"}, "\\frac{1}{3}", "<answer>2/6</answer>", "<answer>0.3333329</answer>"),  # no rounding
        ({"name": "math"}, "$12.5$", "<answer>\\frac{25}{2}</answer>", "<answer>12.4999996</answer>"),
    ],
)
def test_named_verifiers(spec, answer, good, bad):
    assert score(spec, answer, good).value == 1.0
    worse = score(spec, answer, bad)
    assert worse.value < 1.0 and not worse.passed


def test_json_f1_is_graded():
    s = score({"name": "json"}, {"a": 1, "b": 2, "c": 3, "d": 4}, '{"a": 1, "b": 2, "c": 0}')
    assert s.parts["f1"] == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))  # precision 2/3, recall 2/4
    assert s.parts["schema"] == 1.0 and not s.passed


def test_sql_result_set_on_a_file_and_on_setup(tmp_path):
    db = tmp_path / "shop.db"
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE p (id INTEGER, name TEXT, price REAL); INSERT INTO p VALUES "
        "(1,'pen',2.5),(2,'ink',9),(3,'cap',1);"
    )
    con.commit()
    con.close()
    spec = {"name": "sql", "database": str(db)}
    gold = "SELECT name FROM p WHERE price > 2"
    assert score(spec, gold, "<answer>SELECT name FROM p WHERE price >= 2.5</answer>").passed
    assert not score(spec, gold, "<answer>SELECT name FROM p</answer>").passed
    assert score(spec, gold, "<answer>DELETE FROM p</answer>").reason.startswith("error")
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM p").fetchone()[0] == 3  # never written
    setup = "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1),(2),(3);"
    assert score({"name": "sql", "setup_field": "setup"}, "SELECT SUM(x) FROM t", "SELECT 6", setup=setup).passed
    with pytest.raises(VerifierError, match="reference query"):
        score({"name": "sql", "setup_field": "setup"}, "SELECT nope FROM t", "SELECT 1", setup=setup)


def test_composite_weights_parts():
    spec = {
        "name": "composite",
        "pass_threshold": 0.9,
        "parts": [
            {"verifier": {"name": "exact"}, "weight": 3, "name": "right"},
            {
                "verifier": {"name": "regex", "pattern": "^\\d+$", "extract": "whole"},
                "weight": 1,
                "name": "digits_only",
            },
        ],
    }
    s = score(spec, "42", "<answer>42</answer>")
    assert s.parts["right"] == 1.0 and s.parts["digits_only"] == 0.0 and s.value == pytest.approx(0.75) and not s.passed
    assert score(spec, "42", "42").value == 1.0


def test_unknown_verifier_and_bad_params():
    with pytest.raises(ConfigError, match="unknown verifier 'fuzzy'"):
        build_verifier(VerifierSpec.model_validate({"name": "fuzzy"}))
    with pytest.raises(ValueError, match="allowed: .*tolerance"):
        VerifierSpec.model_validate({"name": "numeric", "tol": 1})
    with pytest.raises(ValueError, match="exactly one of database and setup_field"):
        VerifierSpec.model_validate({"name": "sql"})


@pytest.fixture
def userfns(monkeypatch):
    monkeypatch.chdir(USERFNS)  # the current directory is importable in the worker


def test_callable_by_import_path(userfns):
    v = build_verifier(VerifierSpec.model_validate("byo_rewards:exact_digits"))
    try:
        assert v.score(task("12"), Episode(" 12 ")).value == 1.0
        assert v.score(task("12"), Episode("13")).value == 0.0
    finally:
        v.close()
    g = build_verifier(VerifierSpec.model_validate({"name": "python", "path": "byo_rewards:graded"}))
    try:
        s = g.score(task("5"), Episode("6"))
        assert s.value == 0.25 and s.parts["length"] == 0.1 and s.reason == "close"
    finally:
        g.close()


def test_callable_failures_on_a_completion_are_model_faults_and_a_hang_is_infra(userfns):
    for path, match in (
        ("byo_rewards:raises", "raised: RuntimeError: user bug"),
        ("byo_rewards:out_of_range", "returned 7.5"),
    ):
        v = build_verifier(VerifierSpec.model_validate(path))
        with pytest.raises(ModelFault, match=match):
            v.score(task("1"), Episode("1"))
        v.close()
    v = build_verifier(VerifierSpec.model_validate({"name": "python", "path": "byo_rewards:hangs", "timeout_s": 1}))
    with pytest.raises(VerifierError, match="time limit"):
        v.score(task("1"), Episode("1"))
    v.close()


def _until(done, seconds=60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


def test_one_calls_timeout_never_masks_a_call_in_flight_beside_it(userfns, tmp_path):
    """The hanging call's timeout kills the workers, the group-mate's call among them: that
    call runs again on fresh workers and is scored, not masked."""
    spec = {"name": "python", "path": "byo_rewards:hangs_or_waits", "timeout_s": 8, "workers": 2}
    v = build_verifier(VerifierSpec.model_validate(spec))
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            hung = pool.submit(v.score, task("1"), Episode(f"hang {tmp_path}"))
            assert _until((tmp_path / "hanging").exists)
            mate = pool.submit(v.score, task("1"), Episode(f"wait {tmp_path}"))
            assert _until((tmp_path / "waiting").exists)
            (tmp_path / "waiting").unlink()
            with pytest.raises(VerifierError, match="time limit"):
                hung.result()
            # in flight when the workers were killed: run again on fresh workers (or failed)
            assert _until(lambda: (tmp_path / "waiting").exists() or mate.done())
            (tmp_path / "release").touch()
            assert mate.result().value == 1.0
    finally:
        v.close()


def test_a_call_waiting_for_a_busy_worker_is_not_timed_out_by_its_wait(userfns):
    """Two calls of 2.5 s on one worker with a 4 s limit: the second waits its turn before
    its limit starts (it used to count the first's 2.5 s and be masked as a timeout)."""
    spec = {"name": "python", "path": "byo_rewards:slow_but_in_time", "timeout_s": 4, "workers": 1}
    v = build_verifier(VerifierSpec.model_validate(spec))
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            calls = [pool.submit(v.score, task("1"), Episode("1")) for _ in range(2)]
            assert [c.result().value for c in calls] == [1.0, 1.0]
    finally:
        v.close()


@pytest.mark.parametrize(
    "path, kind", [("byo_rewards:strict_int", "model"), ("byo_rewards:raises", "verifier")], ids=["garbage", "always"]
)
def test_the_verify_boundary_blames_a_raising_callable_by_its_cause(userfns, monkeypatch, tmp_path, path, kind):
    """A function that raises only on the model's garbage scores it 0 (a model fault); one that
    raises on the task's gold answer too is the verifier's fault (masked, kind "verifier")."""
    from posttrain.byo.domain import SourceDomain
    from posttrain.configs.byo import SourceConfig
    from posttrain.pipeline.workers import verify_one

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "12"}) + "\n" for i in range(4)))
    dom = SourceDomain("test_pyfn", SourceConfig.model_validate({"path": str(rows)}), VerifierSpec.model_validate(path))
    monkeypatch.setattr("posttrain.domains.registry.get", lambda name: dom)
    t = dom.task_at(0, "train", 1)
    try:
        got = verify_one(t, Episode("1e309 is not an int"))
        if kind == "model":
            assert got.score is not None and got.score.value == 0.0 and got.error_kind is None
            assert got.fault and "ValueError" in got.fault and got.score.reason.startswith("model fault:")
            assert verify_one(t, Episode("12")).score.value == 1.0
        else:
            assert got.score is None and got.error_kind == "verifier" and "gold answer too" in got.error
    finally:
        dom.verifier.close()


def test_callable_that_does_not_import_is_a_config_error(userfns):
    for path, match in (
        ("no_such_module:f", "ModuleNotFoundError"),
        ("byo_rewards:missing", "AttributeError"),
        ("byo_rewards:not_callable", "not a callable"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_verifier(VerifierSpec.model_validate(path))


@pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")
def test_code_tests_per_row_run_in_the_sandbox():
    tests = [
        {"args": [5, 0, 10], "expected": 5},
        {"args": [-3, 0, 10], "expected": 0},
        {"args": [12, 0, 10], "expected": 10},
    ]
    spec = {"name": "code", "entry": "clamp"}
    good = "```python\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n```"
    half = "```python\ndef clamp(x, lo, hi):\n    return max(lo, x)\n```"
    assert score(spec, tests, good).value == 1.0
    s = score(spec, tests, half)
    assert s.value == pytest.approx(2 / 3) and not s.passed  # 12 -> 12 fails; 5 and -3 pass
    cheat = "```python\nimport sys\nsys.exit(0)\n```"
    assert score(spec, tests, cheat).value == 0.0
    v = build_verifier(VerifierSpec.model_validate({"name": "code", "entry_field": "fn"}))
    t = task(json.dumps(tests), fn="clamp", solution="def clamp(x, lo, hi):\n    return max(lo, min(x, hi))")
    assert v.score(t, Episode(v.gold(t))).passed


# ---- proxies a loose comparison would take: each scores below the gold --------------

PROXY_CHEATS = [
    # (spec, reference, gold completion, cheats that a loose comparison would accept)
    (
        {"name": "json"},
        {"flag": 1, "count": 0, "items": [1, 2], "name": "7"},
        '{"flag": 1, "count": 0, "items": [1, 2], "name": "7"}',
        [
            '{"flag": true, "count": false, "items": [1, 2], "name": "7"}',  # True == 1, False == 0
            '{"flag": 1, "count": 0, "items": [true, 2], "name": "7"}',  # nested
            '{"flag": "1", "count": "0", "items": [1, 2], "name": 7}',  # strings for numbers, a number for text
            '{"flag": 1, "count": 0, "items": [1, 2], "name": "7"' + "]" * 10,  # not JSON
            "[" * 100_000 + "]" * 100_000,  # too deep: refused before parsing, no RecursionError
        ],
    ),
    ({"name": "json", "numeric_tolerance": 0.5}, {"v": 1}, '{"v": 1.2}', ['{"v": true}', '{"v": [1]}']),
    ({"name": "numeric"}, "1", "<answer>1</answer>", ["<answer>true</answer>", "<answer>yes</answer>"]),
    ({"name": "exact"}, "1", "<answer>1</answer>", ["<answer>true</answer>", "<answer>1.0</answer>"]),
    ({"name": "regex"}, r"(a+)+$", "aaaa", ["a" * 20_000 + "b"]),  # over the size bound: no backtracking run
]


@pytest.mark.parametrize("spec, answer, gold, cheats", PROXY_CHEATS)
def test_proxy_cheats_score_below_the_gold(spec, answer, gold, cheats):
    best = score(spec, answer, gold)
    assert best.value == 1.0 and best.passed, best
    for cheat in cheats:
        s = score(spec, answer, cheat)
        assert s.value < best.value and not s.passed, (cheat[:80], s)


def test_json_numbers_compare_as_numbers_across_int_and_float():
    assert score({"name": "json"}, {"v": 1}, '{"v": 1.0}').passed  # documented: 1 equals 1.0
