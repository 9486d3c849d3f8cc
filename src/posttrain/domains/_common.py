"""Helpers shared by the generated domain families (not a domain itself).

Invariant: every helper here is deterministic and pure; numbers are
formatted one canonical way, so a reference string is a function of the
value alone.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from posttrain.domains._modeljson import load_json
from posttrain.domains.base import extract_answer

ANSWER_INSTRUCTION = "Put your final answer inside <answer></answer>."
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def latex_fraction(value: Fraction) -> str:
    """An integer, or a reduced \\frac{p}{q} with a leading minus sign."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def fmt_decimal(value: float, places: int = 2) -> str:
    text = f"{value:.{places}f}"
    return "0.00"[: len(text)] if text.strip("-0.") == "" and places else text


def parse_number(text: str) -> float | None:
    """A plain decimal number (commas as thousands separators and a leading $ or
    trailing % allowed); None when `text` is not one number."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip("%").strip()
    if not _NUMBER.fullmatch(cleaned):
        return None
    value = float(cleaned)
    return value if math.isfinite(value) else None


def close(a: float, b: float, rel: float = 1e-4, abs_tol: float = 0.011) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def answer_json(text: str) -> Any:
    """The JSON value inside the final answer (or a fenced ```json block); None if none
    parses within the bounds of `_modeljson.load_json`."""
    body = extract_answer(text)
    fenced = re.findall(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    if fenced:
        body = fenced[-1]
    try:
        return load_json(body)
    except ValueError:
        return None


def f1(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f


def run_summary(run: Any, **extra: Any) -> dict[str, Any]:
    """The trace's view of one sandboxed program run (code, geo3d, terminal): status, exit code,
    CPU and wall seconds, the program, what the domain adds (`extra`), then stderr."""
    return {
        "status": run.status,
        "exit_code": run.exit_code,
        "cpu_s": round(run.cpu_s, 4),
        "wall_s": round(run.wall_s, 4),
        "program": run.program,
        **extra,
        "stderr": run.stderr,
    }
