"""Gates for model answers that a third-party scorer evaluates as code.

Some shipped reasoning-gym scorers pass the model's answer to Python's `eval`
or to `sympy.parse_expr` (which calls `eval`) in this process. Each gate here
decides, from the answer's text or its Python syntax tree and without running
it, whether that evaluation can do anything but build a value: no calls
except to a fixed list of maths functions, no attribute access, subscripts,
lambdas, comprehensions or names starting with `_`, no power towers or huge
exponents (sympy would compute them), and at most MAX_EXPR_CHARS characters.
An answer a gate refuses is a wrong answer (0, with the reason), never run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

MAX_EXPR_CHARS = 4000
"""Longest answer a gate lets through to an evaluating scorer (its `limit` by default)."""
MAX_EXPONENT = 100
"""Largest constant allowed in an exponent (x**100 is fine; x**10**9 never reaches sympy)."""
MAX_CONSTANT = 10**12
"""Largest numeric constant allowed in an expression."""

MATH_FUNCS = frozenset(
    "sin cos tan cot sec csc asin acos atan acot sinh cosh tanh asinh acosh atanh exp log ln sqrt Abs".split()
)
_ARITHMETIC = re.compile(r"[\d\s+\-*/().]*")
_LITERAL_NODES = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.UnaryOp, ast.USub, ast.UAdd, ast.Load)
_EXPR_NODES = (
    *(ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.Call),
    *(ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub, ast.UAdd),
)


def _tree(text: str) -> ast.Expression | None:
    """The answer's expression tree, or None when it is not one Python expression."""
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def literal_gate(text: str, limit: int = MAX_EXPR_CHARS) -> str:
    """For a scorer that calls `eval(answer)` to read a Python literal: "" when the
    answer is not Python at all (eval raises, harmlessly) or is literals only (numbers,
    strings, lists, tuples, bare names); else the reason it is refused."""
    if len(text) > limit:
        return f"answer of {len(text)} characters, over the limit of {limit}"
    tree = _tree(text)
    if tree is None:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not node.id.startswith("_"):
            continue
        if not isinstance(node, _LITERAL_NODES):
            return f"answer is Python code ({type(node).__name__}), not a literal"
    return ""


def arithmetic_gate(text: str, limit: int = MAX_EXPR_CHARS) -> str:
    """For a scorer that evaluates the answer as arithmetic: "" when it is only
    digits, spaces, + - * / ( ) and points (no `**`); else the reason."""
    if len(text) > limit:
        return f"answer of {len(text)} characters, over the limit of {limit}"
    if not _ARITHMETIC.fullmatch(text) or "**" in text:
        return "answer is not arithmetic of numbers with + - * / and parentheses"
    return ""


def _magnitude(value: object) -> float | None:
    """|value| of an int or float constant (not a bool), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return abs(value)
    return None


def _bad_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    return not isinstance(node.func, ast.Name) or node.func.id not in MATH_FUNCS or bool(node.keywords)


def _bad_constant(node: ast.AST) -> bool:
    if not isinstance(node, ast.Constant):
        return False
    size = _magnitude(node.value)
    return size is None or size > MAX_CONSTANT


def _node_problem(node: ast.AST) -> str:
    if not isinstance(node, _EXPR_NODES):
        return f"{type(node).__name__} is not allowed"
    if isinstance(node, ast.Name) and node.id.startswith("_"):
        return f"name {node.id!r} is not allowed"
    if _bad_call(node):
        return "only calls of " + ", ".join(sorted(MATH_FUNCS)) + " are allowed"
    if _bad_constant(node):
        return f"constant {getattr(node, 'value', None)!r} is not allowed"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _exponent_problem(node.right)
    return ""


def _exponent_problem(exponent: ast.AST) -> str:
    for inner in ast.walk(exponent):
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Pow):
            return "a power tower is not allowed"
        if isinstance(inner, ast.Constant) and (_magnitude(inner.value) or 0) > MAX_EXPONENT:
            return f"an exponent over {MAX_EXPONENT} is not allowed"
    return ""


def sympy_gate(text: str, limit: int = MAX_EXPR_CHARS) -> str:
    """For a scorer that calls `sympy.parse_expr(answer)`: "" when the answer is an
    arithmetic expression of numbers, names and MATH_FUNCS calls with bounded
    exponents; else the reason it is refused."""
    if len(text) > limit:
        return f"answer of {len(text)} characters, over the limit of {limit}"
    tree = _tree(text)
    if tree is None:
        return "answer is not an expression"
    for node in ast.walk(tree):
        problem = _node_problem(node)
        if problem:
            return f"answer refused: {problem}"
    return ""


Gate = Callable[[str, int], str]
