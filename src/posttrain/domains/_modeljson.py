"""Reading model output as JSON: bounded before any parsing, compared type-strictly.

Invariant: `load_json` never spends more than linear time on its input and never
recurses deeper than MAX_JSON_DEPTH: text over MAX_JSON_CHARS characters or nested
deeper than MAX_JSON_DEPTH is refused before `json.loads` sees it, as are NaN,
Infinity, floats that overflow to them and integers too large for a float (so
every number read converts to a float); every refusal is a `ValueError` whose
message is the reason (the model's failure, scored 0 by the caller, never an
infra error). `same_json` and `json_key` never let a boolean equal a number
(Python's `True == 1` and `hash(True) == hash(1)`), nor a string a number.
"""

from __future__ import annotations

import json
import math
from typing import Any

from posttrain.configs import nests_deeper

MAX_JSON_CHARS = 1_000_000
"""Longest model-written JSON text parsed, in characters."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects parsed."""
_FLOAT_MAX = 1.7976931348623157e308


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _float_sized_int(text: str) -> int:
    value = int(text)
    if abs(value) > _FLOAT_MAX:
        raise ValueError(f"the number {text[:20]}... does not fit a float")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} does not fit a float")
    return value


def load_json(text: str) -> Any:
    """`json.loads(text)` within the bounds; ValueError with the reason otherwise
    (too long, too deep, not JSON, a non-finite number or one that does not fit a float)."""
    if len(text) > MAX_JSON_CHARS:
        raise ValueError(f"not JSON: {len(text)} characters, over the limit of {MAX_JSON_CHARS}")
    if nests_deeper(text, MAX_JSON_DEPTH):
        raise ValueError(f"not JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_float_sized_int)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    except ValueError as exc:  # NaN, Infinity, a float overflow, an int of over 4300 digits
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:  # unreachable under the depth bound; kept so no traceback can escape
        raise ValueError(f"not JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None


def is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same_json(a: Any, b: Any, tol: float = 0.0) -> bool:
    """Deep equality of two JSON values by type: numbers (int or float, never bool)
    equal within `tol`, so 1 equals 1.0; a bool equals only the same bool; a string
    only the same string; lists item by item; objects with the same keys and values."""
    if is_number(a) or is_number(b):
        return is_number(a) and is_number(b) and _close(a, b, tol)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and _same_items(a, b, tol)
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and _same_fields(a, b, tol)
    return type(a) is type(b) and a == b


def _close(a: float, b: float, tol: float) -> bool:
    if tol == 0.0:
        return a == b  # exact across int and float, with no conversion
    try:
        return abs(a - b) <= tol
    except OverflowError:  # an int too large for a float is not close to any float
        return False


def _same_items(a: list[Any], b: list[Any], tol: float) -> bool:
    return len(a) == len(b) and all(same_json(x, y, tol) for x, y in zip(a, b))


def _same_fields(a: dict[Any, Any], b: dict[Any, Any], tol: float) -> bool:
    return a.keys() == b.keys() and all(same_json(a[k], b[k], tol) for k in a)


def json_key(value: Any) -> Any:
    """A hashable key of a scalar that keeps its kind: equal keys mean equal kind and
    value, so True and 1 (equal, with equal hashes in Python) get different keys;
    an int and the float of the same value share one (1 and 1.0, as numbers)."""
    if isinstance(value, bool):
        return ("bool", value)
    if is_number(value):
        return ("number", value)  # 1 == 1.0 with equal hashes: one key
    return (type(value).__name__, value)
