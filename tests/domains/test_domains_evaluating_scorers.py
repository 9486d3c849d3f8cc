"""reasoning-gym scorers that evaluate the model's answer as code (`eval`,
`sympy.parse_expr`) never see an answer that could do more than build a value:
every such scorer of a registered domain is gated, the gate refuses calls,
attributes, dunder names and power towers, and the gold still scores 1.0."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from posttrain.domains import _safeexpr, rgym
from posttrain.domains.registry import all_domains
from posttrain.types import Episode

EVALUATORS = {"eval", "parse_expr", "sympify"}


def _evaluates_answer(fn: ast.FunctionDef) -> bool:
    """Whether a score_answer body calls eval/parse_expr/sympify on an expression naming `answer`."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        names = {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)}
        if name in EVALUATORS and "answer" in names:
            return True
    return False


def _evaluating_generators() -> set[str]:
    import reasoning_gym

    found = set()
    for path in Path(reasoning_gym.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "score_answer"]
        if any(_evaluates_answer(f) for f in fns):
            found.add(path.stem)
    return found


def test_every_registered_generator_whose_scorer_evaluates_answers_is_gated():
    registered = {n.removeprefix("rg_") for n in all_domains() if n.startswith("rg_")}
    evaluating = _evaluating_generators() & registered
    assert {"countdown", "puzzle24", "simple_integration", "n_queens"} <= evaluating  # the scan can fail
    assert evaluating <= set(rgym.EVALUATING), sorted(evaluating - set(rgym.EVALUATING))


PAYLOAD = "__import__('pathlib').Path({path!r}).write_text('x')"


@pytest.mark.parametrize("generator", sorted(rgym.EVALUATING))
def test_code_in_the_answer_never_runs_and_the_gold_still_scores(generator, tmp_path):
    d = all_domains()[f"rg_{generator}"]
    task = d.sample(0, "train", 1)
    probe = tmp_path / "ran"
    for answer in (PAYLOAD.format(path=str(probe)), f"[{PAYLOAD.format(path=str(probe))}]"):
        s = d.score(task, Episode(f"<answer>{answer}</answer>"))
        assert s.value == 0.0 and not s.passed and s.reason, s
    assert not probe.exists()
    assert d.score(task, Episode(d.gold(task))).value == 1.0


@pytest.mark.parametrize("generator", ["countdown", "simple_integration"])
def test_a_power_tower_is_refused_before_sympy(generator):
    d = all_domains()[f"rg_{generator}"]
    task = d.sample(0, "train", 1)
    s = d.score(task, Episode("<answer>9**9**9**9**9</answer>"))
    assert s.value == 0.0 and s.parts["shipped"] == 0.0 and ("tower" in s.reason or "arithmetic" in s.reason)


def test_an_answer_over_the_size_bound_is_refused_before_any_scorer():
    d = all_domains()["rg_chain_sum"]
    task = d.sample(0, "train", 1)
    s = d.score(task, Episode("<answer>" + "1" * (rgym.MAX_ANSWER_CHARS + 1) + "</answer>"))
    assert s.value == 0.0 and "over the limit" in s.reason


@pytest.mark.parametrize("text", ["['A', 'B']", "[[1, 0], [0, 1]]", "-3", "_ _ Q _\nQ _ _ _", "ABC", "(((("])
def test_the_literal_gate_passes_literals_and_non_python(text):
    assert _safeexpr.literal_gate(text) == ""


@pytest.mark.parametrize("text", ["().__class__", "[x for x in y]", "open('f')", "a.b", "_", "{'a': 1}", "1 + 1"])
def test_the_literal_gate_refuses_code(text):
    assert _safeexpr.literal_gate(text)


@pytest.mark.parametrize("text", ["-sin(8*x + 3)**3/3 + C", "9*X**10 + 8*X**7 + C", "sqrt(x)*exp(-x)", "x**(1/2)"])
def test_the_sympy_gate_passes_expressions(text):
    assert _safeexpr.sympy_gate(text) == ""


@pytest.mark.parametrize(
    "text",
    ["x**9**9", "x**(2**3)", "x**1000", "__import__('os')", "(lambda: 1)()", "x.real", "plot(x)", "'a'", "x[0]", "x^2"],
)
def test_the_sympy_gate_refuses_code_and_towers(text):
    assert _safeexpr.sympy_gate(text)


def test_the_gates_bound_size_and_depth():
    long = "1+" * _safeexpr.MAX_EXPR_CHARS + "1"
    assert all(
        "over the limit" in g(long) for g in (_safeexpr.literal_gate, _safeexpr.sympy_gate, _safeexpr.arithmetic_gate)
    )
    assert _safeexpr.sympy_gate("(" * 3000 + "x" + ")" * 3000)  # too deep for the parser: refused, no traceback
