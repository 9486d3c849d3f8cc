"""Family-specific guarantees: exact and ungameable rg scoring, math answer
forms (no code evaluation), read-only SQL, field-level F1 for documents
(the tool world: test_domains_toolworld.py)."""

from __future__ import annotations

import json

import pytest

from posttrain.domains import rgym
from posttrain.domains.registry import all_domains, get
from posttrain.types import Episode

JUNK = ["", " ", "0", "1", "-1", "yes", "no", "True", "False", "None", "[]", "{}", "a", "x", "0 1", "unknown"]


def _norm(s: str) -> str:
    text = " ".join(s.split()).casefold()
    try:
        return repr(float(text))  # "0" and "0.0" are the same answer
    except ValueError:
        return text


# ---- reasoning-gym ------------------------------------------------------------


def test_rg_catalog_covers_installed_reasoning_gym():
    from reasoning_gym.factory import DATASETS

    catalog = rgym._load_catalog()
    assert set(catalog) <= set(DATASETS)
    registered = {n[len(rgym.PREFIX) :] for n in all_domains() if n.startswith(rgym.PREFIX)}
    assert registered == set(catalog) - set(rgym.EXCLUDED)
    assert len(registered) >= 85
    for reason in rgym.EXCLUDED.values():
        assert len(reason) > 20


@pytest.mark.parametrize("name", sorted(n for n in all_domains() if n.startswith("rg_")))
def test_rg_junk_answers_never_score(name):
    d = get(name)
    task = d.sample(2, "train", 1)
    gold = _norm(task.reference["answer"])
    for junk in JUNK:
        if _norm(junk) != gold:
            assert d.score(task, Episode(f"<answer>{junk}</answer>")).value < 1.0, junk


def test_rg_scoring_is_exact_not_substring():
    d = get("rg_basic_arithmetic")
    task = d.sample(0, "train", 1)
    gold = task.reference["answer"]
    assert d.score(task, Episode(f"<answer>{gold}</answer>")).value == 1.0
    padded = d.score(task, Episode(f"<answer>{gold}0.0 {gold}</answer>"))
    assert padded.value == 0.0


def test_rg_domains_do_not_import_reasoning_gym_at_registration():
    import subprocess
    import sys

    code = (
        "import sys; from posttrain.domains.registry import all_domains; all_domains(); print('reasoning_gym' in "
        "sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-1000:]


# ---- math -------------------------------------------------------------------------


def test_math_equivalent_forms_score_and_question_copies_do_not():
    d = get("math_fraction_add")
    task = d.sample(0, "train", 1)
    q = task.prompt[0].content
    expr = q[q.index("(") : q.index(" as a")]
    assert d.score(task, Episode(f"<answer>{expr}</answer>")).value == 0.0
    import re
    from fractions import Fraction

    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", task.reference) or re.fullmatch(r"(-?)(\d+)()", task.reference)
    sign, num, den = m.group(1), int(m.group(2)), int(m.group(3) or 1)
    assert d.score(task, Episode(f"<answer>{sign}{num * 3}/{den * 3}</answer>")).value == 1.0
    assert d.score(task, Episode(f"<answer>${sign}\\frac{{{num}}}{{{den}}}$</answer>")).value == 1.0
    assert d.score(task, Episode(f"<answer>{sign}{num + 1}/{den}</answer>")).value == 0.0
    if den in (2, 4, 5, 8, 10):
        assert d.score(task, Episode(f"<answer>{sign}{float(Fraction(num, den))}</answer>")).value == 1.0


def test_math_polynomial_form_rejects_the_unexpanded_product():
    d = get("math_poly_expand")
    task = d.sample(0, "train", 2)
    q = task.prompt[0].content
    product = q[len("Expand ") : q.index(" into")]
    assert d.score(task, Episode(f"<answer>{product}</answer>")).value == 0.0
    assert d.score(task, Episode(f"<answer>{task.reference}</answer>")).value == 1.0


def test_math_answer_is_never_evaluated_as_code(tmp_path):
    marker = tmp_path / "pwned"
    d = get("math_poly_expand")
    task = d.sample(0, "train", 1)
    evil = f"__import__('os').system('touch {marker}')"
    for text in (evil, f"${evil}$", f"x^2 + {evil}"):
        assert d.score(task, Episode(f"<answer>{text}</answer>")).value == 0.0
    assert not marker.exists()


def test_math_roots_accept_any_order():
    d = get("math_quadratic_roots")
    for i in range(10):
        task = d.sample(i, "train", 2)
        roots = [r.strip() for r in task.reference.split(",")]
        if len(roots) == 2:
            assert d.score(task, Episode(f"<answer>{roots[1]}, {roots[0]}</answer>")).value == 1.0
            assert d.score(task, Episode(f"<answer>{roots[0]}</answer>")).value == 0.0
            return
    pytest.fail("no two-root task found")


# ---- SQL ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query,reason",
    [
        ("DELETE FROM employees", "not authorized"),
        ("INSERT INTO employees VALUES (999, 'a', 1, 1, 1)", "not authorized"),
        ("SELECT 1; DROP TABLE employees", "one statement"),
        ("ATTACH DATABASE '/tmp/x.db' AS x", "not authorized"),
        ("PRAGMA query_only = OFF", "not authorized"),
        ("SELECT load_extension('x')", "not authorized"),
        ("SELECT zeroblob(1000000000)", "too big"),
        ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", "timeout"),
    ],
)
def test_sql_model_query_is_read_only_and_bounded(query, reason):
    d = get("sql_filter_company")
    task = d.sample(0, "train", 1)
    score = d.score(task, Episode(f"<answer>{query}</answer>"))
    assert score.value == 0.0 and reason in score.reason
    assert d.score(task, Episode(d.gold(task))).value == 1.0  # the data is unchanged


def test_sql_equivalent_query_and_ordering():
    d = get("sql_top_k_company")
    task = d.sample(0, "train", 2)
    ref = task.reference["sql"]
    assert d.score(task, Episode(f"```sql\n{ref.lower()}\n```")).value == 1.0
    flipped = ref.replace("DESC,", "ASC,") if "DESC," in ref else ref.replace("ASC, name", "DESC, name")
    assert d.score(task, Episode(f"<answer>{flipped}</answer>")).value == 0.0
    f = get("sql_filter_company")
    t2 = f.sample(0, "train", 1)
    reordered = t2.reference["sql"] + " ORDER BY name DESC"
    assert f.score(t2, Episode(f"<answer>{reordered}</answer>")).value == 1.0  # unordered question


# ---- documents ----------------------------------------------------------------------


def test_doc_fields_give_partial_credit_by_f1():
    d = get("doc_invoice_fields_md")
    task = d.sample(0, "train", 2)
    fields = dict(task.reference["fields"])
    assert d.score(task, Episode(f"<answer>{json.dumps(fields)}</answer>")).value == 1.0
    half = dict(list(fields.items())[: len(fields) // 2])
    s = d.score(task, Episode(f"<answer>{json.dumps(half)}</answer>"))
    assert 0.0 < s.value < 1.0 and not s.passed and s.parts["precision"] == 1.0
    loose = {k: (f"${v:,.2f}" if isinstance(v, float) else str(v).upper()) for k, v in fields.items()}
    assert d.score(task, Episode(f"```json\n{json.dumps(loose)}\n```")).value == 1.0
    assert d.score(task, Episode("<answer>not json</answer>")).value == 0.0


def test_doc_numbers_tolerate_formatting_but_not_errors():
    d = get("fin_working_capital")
    task = d.sample(0, "train", 1)
    v = task.reference["value"]
    assert d.score(task, Episode(f"<answer>${v:,.2f}</answer>")).value == 1.0
    assert d.score(task, Episode(f"<answer>{v + 0.05:.2f}</answer>")).value == 0.0


def test_documents_use_fixed_dates_only():
    d = get("doc_invoice_fields_text")
    for i in range(20):
        task = d.sample(i, "train", 3)
        year = int(task.reference["fields"]["date"][:4])
        assert 2019 <= year <= 2024


def test_rg_item_generation_is_time_limited():
    # in a subprocess: pytest-timeout holds the interval timer here, and the
    # limit steps aside when another timer runs
    import subprocess
    import sys

    code = (
        "import time\nfrom posttrain.domains import rgym\n"
        "try:\n    with rgym._time_limit(0.05):\n        time.sleep(2)\n    print('no')\n"
        "except rgym._ItemTimeout:\n    print('limited')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "limited", out.stderr[-1000:]
    assert get("rg_arc_1d").levels == 3


@pytest.mark.parametrize("answer", ["9^{9^{9}}", "9^9^9", "x^{99999} + 1", "x**2", "2^{2^{2^{2^{2}}}}"])
def test_math_power_towers_are_refused_by_form_before_math_verify(answer, monkeypatch):
    from posttrain.domains import _mathverify

    monkeypatch.setattr(_mathverify, "equivalent", lambda *a: pytest.fail("reached math-verify"))
    d = get("math_poly_expand")
    task = d.sample(0, "train", 1)
    s = d.score(task, Episode(f"<answer>{answer}</answer>"))
    assert s.value == 0.0 and s.parts["form"] == 0.0 and "form" in s.reason


def test_one_answers_overrun_never_fails_another_samples_check(monkeypatch, tmp_path):
    """A check queued behind an answer that overruns the outer deadline is run on the fresh
    worker and decided: never cancelled (which escaped as a CancelledError, scored as a model
    fault of an answer that did nothing wrong) and never timed out by its wait in the queue."""
    import concurrent.futures
    import time

    import mathverify_slow

    from posttrain.domains import _mathverify
    from posttrain.errors import VerifierError

    monkeypatch.setattr(_mathverify, "check", mathverify_slow.check)
    monkeypatch.setattr(_mathverify, "OUTER_TIMEOUT_S", 6.0)
    _mathverify.shutdown()  # a fresh worker, with the stand-in
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            slow = pool.submit(_mathverify.equivalent, "1", f"slow {tmp_path}")
            deadline = time.monotonic() + 60
            while not (tmp_path / "started").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (tmp_path / "started").exists()
            queued = [pool.submit(_mathverify.equivalent, "7", a) for a in ("(7)", "8")]
            with pytest.raises(VerifierError, match="exceeded"):
                slow.result()
            assert [q.result() for q in queued] == [True, False]
    finally:
        _mathverify.shutdown()


def test_a_one_number_answer_is_compared_exactly_not_within_math_verifys_rounding():
    """math-verify rounds to 6 decimals: 0.3333329 passed for 1/3 and 12.4999996 for 25/2."""
    import dataclasses
    from fractions import Fraction

    domain = get("math_linear_equation")
    task = dataclasses.replace(domain.sample(0, "train", 2), reference="\\frac{1}{3}")
    for answer, want in (("0.3333329", 0.0), ("0.333333", 0.0), ("1/3", 1.0), ("\\frac{1}{3}", 1.0), ("2/6", 1.0)):
        assert domain.score(task, Episode(f"<answer>{answer}</answer>")).value == want, answer
    task = dataclasses.replace(task, reference="12.5")
    assert domain.score(task, Episode("<answer>12.4999996</answer>")).value == 0.0
    assert domain.score(task, Episode("<answer>25/2</answer>")).value == 1.0
    from posttrain.domains.math_family import exact_value

    assert exact_value("-\\frac{7}{3}") == exact_value("-7/3") == Fraction(-7, 3)
    assert exact_value("1/0") is None and exact_value("1e5") is None


def test_the_bf_generator_prints_nothing(capfd):
    """reasoning-gym's bf compiler printed "." per optimizer pass to stdout: the stray `..`
    before `posttrain domains`' header, and in every run's output."""
    from posttrain.domains.registry import get

    task = get("rg_bf").sample(0, "train", 1)
    assert task.prompt
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.heavy  # compiles all of reasoning-gym afresh in a subprocess (10-30 s)
def test_reasoning_gyms_first_import_prints_nothing(tmp_path):
    """cellpylib (a reasoning-gym dependency) printed a SyntaxWarning per `is "recursive"` line
    whenever its bytecode was compiled: a fresh clone's first run, or every run without a cache."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")}
    code = "from posttrain.domains.rgym import _factory; _factory()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == ""
