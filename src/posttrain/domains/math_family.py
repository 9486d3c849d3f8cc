"""math_*: procedurally generated maths problems, verified with math-verify.

Invariant: a reference is a canonical LaTeX string computed exactly (with
`fractions.Fraction`, never floats where exactness matters); a model answer
must first have the domain's answer form (a number, a list of numbers, or an
expanded polynomial), so copying the question's unevaluated expression never
scores, and is then compared with math-verify in a worker process
(`_mathverify`), never with `sympy.parse_expr`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Literal

from posttrain.domains._common import ANSWER_INSTRUCTION, fmt_decimal, latex_fraction
from posttrain.domains.base import Budget, ProceduralDomain, extract_answer
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, Task

Form = Literal["number", "numbers", "polynomial"]
Gen = Callable[[random.Random, int], tuple[str, str]]

_NUM = r"-?(?:\d+(?:\.\d+)?|\\d?frac\{\d+\}\{\d+\}|\d+/\d+)"
_FORMS = {
    "number": re.compile(rf"{_NUM}"),
    "numbers": re.compile(rf"{_NUM}(?:\s*,\s*{_NUM})*"),
    "polynomial": re.compile(r"[-+0-9x^{}.*\s]+|[-+0-9x^{}.*\s]*(?:\\d?frac\{\d+\}\{\d+\}[-+0-9x^{}.*\s]*)+"),
}


def strip_wrappers(text: str) -> str:
    """The answer without $...$, \\(...\\), \\boxed{...}, `x =` prefixes and \\cdot / \\, spacing."""
    text = text.strip().strip("$").strip()
    if text.startswith("\\(") and text.endswith("\\)"):
        text = text[2:-2].strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, re.DOTALL)
    if boxed:
        text = boxed.group(1).strip()
    text = re.sub(r"^[a-z]\s*=\s*", "", text)
    return text.replace("\\cdot", "*").replace("\\,", "").replace("\\!", "").replace("−", "-").strip()


_SMALL_POWER = re.compile(r"\^(?:\{\s*\d{1,2}\s*\}|\d)")
_POWER_CHAIN = re.compile(r"\^\s*(?:\{[^{}]*\}|\d+)\s*\^")


def small_powers(text: str) -> bool:
    """Whether every power in `text` has an exponent of one or two digits and none is
    raised again (no `9^{9^{9}}`, `9^9^9` or `**`, which math-verify would compute)."""
    return "**" not in text and not _POWER_CHAIN.search(text) and "^" not in _SMALL_POWER.sub("", text)


def has_form(answer: str, form: Form) -> bool:
    """Whether the answer has the domain's form (for polynomials, with small powers only)."""
    text = strip_wrappers(answer)
    return bool(_FORMS[form].fullmatch(text)) and (form != "polynomial" or small_powers(text))


_EXACT = re.compile(r"(-?)(?:(\d+(?:\.\d+)?)|\\d?frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+))")


def exact_value(text: str) -> Fraction | None:
    """The exact rational a one-number answer (an integer, a decimal, `a/b` or `\\frac{a}{b}`,
    signed) writes, or None for anything else (a zero denominator included)."""
    m = _EXACT.fullmatch(text.strip())
    if m is None:
        return None
    sign, plain, fn, fd, sn, sd = m.groups()
    if plain is not None:
        value = Fraction(plain)
    else:
        num, den = (int(fn), int(fd)) if fn is not None else (int(sn), int(sd))
        if den == 0:
            return None
        value = Fraction(num, den)
    return -value if sign else value


class MathVerifier:
    """Form check, then exact comparison when the gold and the answer are both one rational
    number (math-verify rounds to 6 decimals, so 0.3333329 passed for 1/3 and 12.4999996 for
    12.5), else math-verify equivalence in a worker process."""

    name = "math_verify"
    version = "1"

    def __init__(self, form: Form) -> None:
        self.form = form

    def score(self, task: Task, episode: Episode) -> Score:
        from posttrain.domains import _mathverify

        answer = extract_answer(episode.completion)
        if not has_form(answer, self.form):
            reason = "truncated" if episode.finish_reason == "length" else f"answer is not in {self.form} form"
            return Score(0.0, {"outcome": 0.0, "form": 0.0}, False, reason)
        gold, got = exact_value(str(task.reference)), exact_value(strip_wrappers(answer))
        if self.form == "number" and gold is not None and got is not None:
            ok = gold == got
        else:
            ok = _mathverify.equivalent(str(task.reference), strip_wrappers(answer))
        return Score(1.0 if ok else 0.0, {"outcome": float(ok), "form": 1.0}, ok, "" if ok else "wrong answer")


class MathDomain(ProceduralDomain):
    category = "math"
    version = "2"
    levels = 4
    budget = Budget(tokens=64)

    def __init__(self, name: str, description: str, form: Form, gen: Gen) -> None:
        self.name = name
        self.description = description
        self.verifier = MathVerifier(form)
        self._gen = gen

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        question, answer = self._gen(rng, difficulty)
        return f"{question}\n{ANSWER_INSTRUCTION}", answer

    def corrupt(self, answer: str) -> str:
        if self.verifier.form == "polynomial":
            return f"{answer}+1"
        if self.verifier.form == "numbers":
            return ", ".join(f"{p.strip()}1" if "frac" not in p else "0" for p in answer.split(","))
        return "1" if answer == "0" else ("2" if answer == "1" else "0")

    def cheats(self, task: Task) -> list[str]:
        """The question (or its expression) echoed, code, an empty answer, a power tower, and a
        decimal within a rounding of the gold (its 6-decimal rounding when the gold does not
        terminate, the gold plus or minus 4e-7): never accepted."""
        question = task.prompt[-1].content.split("\n")[0]
        return [
            *(_near_misses(task) if self.verifier.form == "number" else []),
            "<answer></answer>",
            f"<answer>{question}</answer>",
            "<answer>__import__('os').getcwd()</answer>",
            f"<answer>{self.wrong(task)} {task.reference}</answer>",
            "<answer>9^{9^{9}}</answer>",  # a power tower math-verify would compute (refused by form)
        ]


def _near_misses(task: Task) -> list[str]:
    """Decimals that differ from a one-number gold by less than math-verify's rounding."""
    gold = exact_value(str(task.reference))
    if gold is None:
        return []
    out = [f"<answer>{_decimal(gold + d, 7)}</answer>" for d in (Fraction(4, 10**7), Fraction(-4, 10**7))]
    six = _decimal(gold, 6)
    if Fraction(six) != gold:
        out.append(f"<answer>{six}</answer>")
    return out


def _decimal(value: Fraction, places: int) -> str:
    """`value` rounded to `places` decimals, written exactly (no float in between)."""
    n = round(value * 10**places)
    digits = str(abs(n)).rjust(places + 1, "0")
    return f"{'-' if n < 0 else ''}{digits[:-places]}.{digits[-places:]}"


# ---- generators: each (rng, difficulty) -> (question, LaTeX answer) -------------


def _nonzero(rng: random.Random, lo: int, hi: int) -> int:
    value = 0
    while value == 0:
        value = rng.randint(lo, hi)
    return value


def _frac(rng: random.Random, d: int) -> Fraction:
    hi = 3 + 4 * d
    return Fraction(_nonzero(rng, -hi if d > 2 else 1, hi), rng.randint(2, hi))


def _show(f: Fraction) -> str:
    return f"{f.numerator}/{f.denominator}" if f.denominator != 1 else str(f.numerator)


def _fraction_op(symbol: str, op: Callable[[Fraction, Fraction], Fraction]) -> Gen:
    def gen(rng: random.Random, d: int) -> tuple[str, str]:
        a, b = _frac(rng, d), _frac(rng, d)
        return f"Compute ({_show(a)}) {symbol} ({_show(b)}) as a reduced fraction.", latex_fraction(op(a, b))

    return gen


def linear_eq(rng: random.Random, d: int) -> tuple[str, str]:
    hi = 5 * d
    a, b, c = _nonzero(rng, -hi, hi), rng.randint(-hi * 3, hi * 3), rng.randint(-hi * 3, hi * 3)
    return f"Solve for x: {a}x + {b} = {c}. Give x as a reduced fraction or integer.", latex_fraction(
        Fraction(c - b, a)
    )


def linear_system(rng: random.Random, d: int) -> tuple[str, str]:
    hi = 3 + 2 * d
    while True:
        a, b, c, e = (_nonzero(rng, -hi, hi) for _ in range(4))
        if a * e - b * c:
            break
    x, y = rng.randint(-hi, hi), rng.randint(-hi, hi)
    return (
        f"Solve the system {a}x + {b}y = {a * x + b * y} and {c}x + {e}y = {c * x + e * y}. What is x + 2y?",
        str(x + 2 * y),
    )


def quadratic_roots(rng: random.Random, d: int) -> tuple[str, str]:
    hi = 5 + 3 * d
    r, s = rng.randint(-hi, hi), rng.randint(-hi, hi)
    k = rng.randint(1, d + 1)
    poly = _poly_text([k, -k * (r + s), k * r * s])
    roots = sorted({r, s})
    return f"Find all real roots of {poly} = 0, separated by commas.", ", ".join(map(str, roots))


def _poly_text(coeffs: list[int]) -> str:
    """Polynomial with coefficients from the highest degree down, e.g. [2, -3, 1] -> 2x^2 - 3x + 1."""
    deg = len(coeffs) - 1
    parts = []
    for i, c in enumerate(coeffs):
        p = deg - i
        if c == 0:
            continue
        mag = abs(c)
        body = ("" if mag == 1 and p else str(mag)) + ("x" if p >= 1 else "") + (f"^{p}" if p > 1 else "")
        parts.append(("-" if c < 0 else "+", body))
    if not parts:
        return "0"
    head = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    return head + "".join(f" {s} {b}" for s, b in parts[1:])


def _poly(rng: random.Random, deg: int, hi: int) -> list[int]:
    return [_nonzero(rng, -hi, hi)] + [rng.randint(-hi, hi) for _ in range(deg)]


def poly_expand(rng: random.Random, d: int) -> tuple[str, str]:
    hi = 2 + d
    f, g = _poly(rng, 1, hi), _poly(rng, 1 if d < 3 else 2, hi)
    prod = [0] * (len(f) + len(g) - 1)
    for i, a in enumerate(f):
        for j, b in enumerate(g):
            prod[i + j] += a * b
    return f"Expand ({_poly_text(f)})({_poly_text(g)}) into a polynomial in x.", _poly_text(prod)


def derivative(rng: random.Random, d: int) -> tuple[str, str]:
    coeffs = _poly(rng, 1 + d, 3 + d)
    deg = len(coeffs) - 1
    deriv = [c * (deg - i) for i, c in enumerate(coeffs[:-1])]
    return f"Differentiate p(x) = {_poly_text(coeffs)} with respect to x.", _poly_text(deriv)


def _eval_poly(coeffs: list[int], x: Fraction | int) -> Fraction:
    value = Fraction(0)
    for c in coeffs:
        value = value * x + c
    return value


def poly_eval(rng: random.Random, d: int) -> tuple[str, str]:
    coeffs = _poly(rng, d + 1, 5 + d)
    x = rng.randint(-3 - d, 3 + d)
    return f"Let p(x) = {_poly_text(coeffs)}. Compute p({x}).", latex_fraction(_eval_poly(coeffs, x))


def derivative_at(rng: random.Random, d: int) -> tuple[str, str]:
    coeffs = _poly(rng, d + 1, 4 + d)
    deg = len(coeffs) - 1
    deriv = [c * (deg - i) for i, c in enumerate(coeffs[:-1])]
    x = rng.randint(-3, 3)
    return f"Let p(x) = {_poly_text(coeffs)}. Compute p'({x}).", latex_fraction(_eval_poly(deriv, x))


def definite_integral(rng: random.Random, d: int) -> tuple[str, str]:
    coeffs = _poly(rng, min(d, 3), 3 + d)
    lo = rng.randint(-2, 1)
    hi = lo + rng.randint(1, 2 + d)
    deg = len(coeffs) - 1
    anti = [Fraction(c, deg - i + 1) for i, c in enumerate(coeffs)] + [Fraction(0)]
    value = _eval_poly(anti, hi) - _eval_poly(anti, lo)  # type: ignore[arg-type]
    return (
        f"Compute the integral of {_poly_text(coeffs)} dx from x = {lo} to x = {hi}, as a reduced fraction.",
        latex_fraction(value),
    )


def gcd_gen(rng: random.Random, d: int) -> tuple[str, str]:
    g = rng.randint(2, 6 * d)
    a, b = g * rng.randint(2, 10**d), g * rng.randint(2, 10**d)
    return f"What is the greatest common divisor of {a} and {b}?", str(math.gcd(a, b))


def lcm_gen(rng: random.Random, d: int) -> tuple[str, str]:
    a, b = rng.randint(2, 6 * 4**d), rng.randint(2, 6 * 4**d)
    return f"What is the least common multiple of {a} and {b}?", str(math.lcm(a, b))


def mod_gen(rng: random.Random, d: int) -> tuple[str, str]:
    a, m = rng.randint(10, 10 ** (d + 2)), rng.randint(3, 10 * d + 7)
    return f"What is {a} mod {m}?", str(a % m)


def mod_pow(rng: random.Random, d: int) -> tuple[str, str]:
    a, b, m = rng.randint(2, 9 * d), rng.randint(2, 5 * d * d), rng.randint(5, 20 * d)
    return f"What is {a}^{b} mod {m}?", str(pow(a, b, m))


def binomial(rng: random.Random, d: int) -> tuple[str, str]:
    n = rng.randint(4, 12 + 6 * d)
    k = rng.randint(1, n - 1)
    return f"How many ways are there to choose {k} items from {n} distinct items?", str(math.comb(n, k))


def permutations(rng: random.Random, d: int) -> tuple[str, str]:
    n = rng.randint(3, 10 + 3 * d)
    k = rng.randint(1, min(n, 2 + d))
    return f"How many ordered arrangements of {k} items can be made from {n} distinct items?", str(math.perm(n, k))


def dice_probability(rng: random.Random, d: int) -> tuple[str, str]:
    k = rng.randint(1, 1 + (d + 1) // 2)
    sides = rng.choice([4, 6, 8, 10, 12, 20][: 2 + d])
    target = rng.randint(k, k * sides)
    ways = _dice_ways(k, sides, target)
    return (
        f"{k} fair {sides}-sided dice are rolled. What is the probability that the sum is {target}? Give a reduced "
        "fraction.",
        latex_fraction(Fraction(ways, sides**k)),
    )


def _dice_ways(k: int, sides: int, target: int) -> int:
    counts = {0: 1}
    for _ in range(k):
        nxt: dict[int, int] = {}
        for s, c in counts.items():
            for f in range(1, sides + 1):
                nxt[s + f] = nxt.get(s + f, 0) + c
        counts = nxt
    return counts.get(target, 0)


def draw_probability(rng: random.Random, d: int) -> tuple[str, str]:
    red, blue = rng.randint(1, 10 + 4 * d), rng.randint(1, 10 + 4 * d)
    k = min(rng.randint(1, 1 + d // 2), red)
    p = Fraction(math.comb(red, k), math.comb(red + blue, k))
    return (
        f"A bag holds {red} red and {blue} blue balls. {k} balls are drawn without replacement. "
        f"What is the probability that all are red? Give a reduced fraction.",
        latex_fraction(p),
    )


def arith_series(rng: random.Random, d: int) -> tuple[str, str]:
    a, step, n = rng.randint(-10 * d, 10 * d), _nonzero(rng, -3 * d, 5 * d), rng.randint(5, 5 + 10 * d)
    return (
        f"What is the sum of the first {n} terms of the arithmetic sequence {a}, {a + step}, {a + 2 * step}, ...?",
        str(n * (2 * a + (n - 1) * step) // 2),
    )


def arith_nth(rng: random.Random, d: int) -> tuple[str, str]:
    a, step, n = rng.randint(-10 * d, 10 * d), _nonzero(rng, -4 * d, 6 * d), rng.randint(10, 10 + 30 * d)
    return f"What is term number {n} of the arithmetic sequence {a}, {a + step}, {a + 2 * step}, ...?", str(
        a + (n - 1) * step
    )


def geom_series(rng: random.Random, d: int) -> tuple[str, str]:
    a, r, n = _nonzero(rng, -9, 9), rng.choice([2, 3, -2, Fraction(1, 2)][: 2 + (d > 2) * 2]), rng.randint(3, 4 + d)
    r = Fraction(r)
    total = sum(a * r**i for i in range(n))
    terms = ", ".join(_show(a * r**i) for i in range(3))
    return f"What is the sum of the first {n} terms of the geometric sequence {terms}, ...?", latex_fraction(
        Fraction(total)
    )


def exponents(rng: random.Random, d: int) -> tuple[str, str]:
    base, e1, e2 = rng.randint(2, 5 + 2 * d), rng.randint(1, 3 + d), rng.randint(-2, 2 + d)
    return f"Compute {base}^{e1} * {base}^{e2} as a number.", latex_fraction(Fraction(base) ** (e1 + e2))


def logarithm(rng: random.Random, d: int) -> tuple[str, str]:
    base, k = rng.randint(2, 15 + 5 * d), rng.randint(-1 if d > 2 else 1, 3 + d)
    return f"Compute log base {base} of {_show(Fraction(base) ** k)}.", str(k)


def mean_gen(rng: random.Random, d: int) -> tuple[str, str]:
    xs = [rng.randint(0, 10 * d * d) for _ in range(3 + 2 * d)]
    return f"What is the mean of {', '.join(map(str, xs))}? Give a reduced fraction or integer.", latex_fraction(
        Fraction(sum(xs), len(xs))
    )


def median_gen(rng: random.Random, d: int) -> tuple[str, str]:
    xs = [rng.randint(0, 20 * d) for _ in range(3 + 2 * d + rng.randint(0, 1))]
    s, n = sorted(xs), len(xs)
    med = Fraction(s[n // 2]) if n % 2 else Fraction(s[n // 2 - 1] + s[n // 2], 2)
    return f"What is the median of {', '.join(map(str, xs))}?", latex_fraction(med)


def variance_gen(rng: random.Random, d: int) -> tuple[str, str]:
    xs = [rng.randint(0, 5 * d) for _ in range(3 + d)]
    m = Fraction(sum(xs), len(xs))
    var = sum((x - m) ** 2 for x in xs) / len(xs)
    return (
        f"What is the population variance of {', '.join(map(str, xs))}? Give a reduced fraction or integer.",
        latex_fraction(var),
    )


def triangle_area(rng: random.Random, d: int) -> tuple[str, str]:
    while True:
        pts = [(rng.randint(-3 * d, 3 * d), rng.randint(-3 * d, 3 * d)) for _ in range(3)]
        (x1, y1), (x2, y2), (x3, y3) = pts
        twice = abs(x1 * (y2 - y3) + x2 * (y3 - y1) + x3 * (y1 - y2))
        if twice:
            break
    return f"What is the area of the triangle with vertices {pts[0]}, {pts[1]}, {pts[2]}?", latex_fraction(
        Fraction(twice, 2)
    )


_TRIPLES = [(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (9, 40, 41)]


def distance_points(rng: random.Random, d: int) -> tuple[str, str]:
    a, b, c = rng.choice(_TRIPLES[: 2 + d])
    k = rng.randint(1, d)
    x, y = rng.randint(-10, 10), rng.randint(-10, 10)
    sx, sy = rng.choice([1, -1]), rng.choice([1, -1])
    return f"What is the distance between ({x}, {y}) and ({x + sx * k * a}, {y + sy * k * b})?", str(k * c)


def circle_area(rng: random.Random, d: int) -> tuple[str, str]:
    r = rng.randint(1, 200 * d) + (rng.randint(1, 9) / 10 if d > 1 else 0)
    return f"What is the area of a circle of radius {r}? Round to 2 decimal places.", fmt_decimal(math.pi * r * r)


def det2(rng: random.Random, d: int) -> tuple[str, str]:
    hi = 3 * d
    a, b, c, e = (rng.randint(-hi, hi) for _ in range(4))
    return f"Compute the determinant of the matrix [[{a}, {b}], [{c}, {e}]].", str(a * e - b * c)


def det3(rng: random.Random, d: int) -> tuple[str, str]:
    hi = 1 + d
    m = [[rng.randint(-hi, hi) for _ in range(3)] for _ in range(3)]
    det = (
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    )
    return f"Compute the determinant of the matrix {m}.", str(det)


def dot_product(rng: random.Random, d: int) -> tuple[str, str]:
    n = 2 + d
    u, v = [rng.randint(-5 * d, 5 * d) for _ in range(n)], [rng.randint(-5 * d, 5 * d) for _ in range(n)]
    return f"Compute the dot product of {u} and {v}.", str(sum(a * b for a, b in zip(u, v)))


def percent_of(rng: random.Random, d: int) -> tuple[str, str]:
    p, n = rng.choice([5, 10, 12.5, 15, 20, 25, 30, 40, 75][: 3 + 2 * d]), rng.randint(2, 100 * d) * 8
    return f"What is {p}% of {n}?", latex_fraction(Fraction(str(p)) * n / 100)


def percent_change(rng: random.Random, d: int) -> tuple[str, str]:
    a, b = rng.randint(10, 100 * d), rng.randint(10, 100 * d)
    return (
        f"A value changes from {a} to {b}. What is the percentage change? Round to 2 decimal places (no % sign).",
        fmt_decimal((b - a) / a * 100),
    )


def simple_interest(rng: random.Random, d: int) -> tuple[str, str]:
    p, r, t = rng.randint(1, 50) * 100, rng.randint(1, 4 * d + 2), rng.randint(1, 2 + d)
    return f"What is the simple interest on {p} dollars at {r}% per year for {t} years?", latex_fraction(
        Fraction(p * r * t, 100)
    )


def compound_interest(rng: random.Random, d: int) -> tuple[str, str]:
    p, r, t = rng.randint(1, 50) * 100, rng.randint(1, 3 + d), rng.randint(2, 2 + 2 * d)
    amount = p * (1 + r / 100) ** t
    return (
        f"{p} dollars is invested at {r}% per year compounded annually. What is the balance after {t} years? "
        f"Round to 2 decimal places.",
        fmt_decimal(amount),
    )


def order_of_ops(rng: random.Random, d: int) -> tuple[str, str]:
    def expr(depth: int) -> str:
        if depth == 0:
            return str(rng.randint(1, 9 + d))
        op = rng.choice("+-*")
        return f"({expr(depth - 1)} {op} {expr(rng.randint(0, depth - 1))})"

    text = expr(1 + d)[1:-1]
    return f"Evaluate {text}.", str(_safe_eval(text))


def _safe_eval(text: str) -> int:
    """Evaluates our own generated +-* expression (never model output)."""
    tokens = re.findall(r"\d+|[-+*()]", text)
    pos = 0

    def atom() -> int:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            value = add()
            pos += 1
            return value
        return int(tok)

    def mul() -> int:
        nonlocal pos
        value = atom()
        while pos < len(tokens) and tokens[pos] == "*":
            pos += 1
            value *= atom()
        return value

    def add() -> int:
        nonlocal pos
        value = mul()
        while pos < len(tokens) and tokens[pos] in "+-":
            op = tokens[pos]
            pos += 1
            value = value + mul() if op == "+" else value - mul()
        return value

    return add()


def base_convert(rng: random.Random, d: int) -> tuple[str, str]:
    n = rng.randint(2, 4 * 16 ** (d + 1))
    base = rng.choice([2, 3, 8][: 1 + (d > 1) + (d > 2)])
    digits, m = [], n
    while m:
        digits.append(str(m % base))
        m //= base
    return f"Write the decimal number {n} in base {base} (digits only).", "".join(reversed(digits))


def unit_convert(rng: random.Random, d: int) -> tuple[str, str]:
    units = [
        ("km", "m", 1000),
        ("m", "cm", 100),
        ("kg", "g", 1000),
        ("h", "min", 60),
        ("min", "s", 60),
        ("day", "h", 24),
    ]
    big, small, f = rng.choice(units[: 2 + d])
    x = Fraction(rng.randint(1, 40 * d), rng.choice([1, 2, 4, 5][: 1 + d]))
    if rng.random() < 0.5:
        return f"Convert {_dec(x)} {big} to {small}.", latex_fraction(x * f)
    return f"Convert {_dec(x * f)} {small} to {big}.", latex_fraction(x)


def _dec(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def digit_sum(rng: random.Random, d: int) -> tuple[str, str]:
    n = rng.randint(10 ** (2 * d), 10 ** (2 * d + 1))
    return f"What is the sum of the digits of {n}?", str(sum(map(int, str(n))))


def count_divisors(rng: random.Random, d: int) -> tuple[str, str]:
    n = rng.randint(10, 400 * 4 ** (d - 1))
    return f"How many positive divisors does {n} have?", str(sum(1 for k in range(1, n + 1) if n % k == 0))


def sum_of_squares(rng: random.Random, d: int) -> tuple[str, str]:
    a = rng.randint(1, 5 * d)
    n = a + rng.randint(2, 10 * d)
    total = sum(k * k for k in range(a, n + 1))
    return f"What is {a}^2 + {a + 1}^2 + ... + {n}^2?", str(total)


def inequality_count(rng: random.Random, d: int) -> tuple[str, str]:
    a, b = _nonzero(rng, 1, 3 + d), rng.randint(-10 * d, 10 * d)
    lo, hi = sorted((rng.randint(-20 * d, 20 * d), rng.randint(-20 * d, 20 * d)))
    count = sum(1 for x in range(-1000, 1001) if lo <= a * x + b <= hi)
    return f"How many integers x satisfy {lo} <= {a}x + {b} <= {hi}?", str(count)


FAMILY: list[tuple[str, str, Form, Gen]] = [
    ("math_fraction_add", "sum of two fractions", "number", _fraction_op("+", lambda a, b: a + b)),
    ("math_fraction_sub", "difference of two fractions", "number", _fraction_op("-", lambda a, b: a - b)),
    ("math_fraction_mul", "product of two fractions", "number", _fraction_op("*", lambda a, b: a * b)),
    ("math_fraction_div", "quotient of two fractions", "number", _fraction_op("/", lambda a, b: a / b)),
    ("math_linear_equation", "solve ax + b = c", "number", linear_eq),
    ("math_linear_system", "2x2 linear system, report x + 2y", "number", linear_system),
    ("math_quadratic_roots", "integer roots of a quadratic", "numbers", quadratic_roots),
    ("math_poly_expand", "expand a product of polynomials", "polynomial", poly_expand),
    ("math_derivative", "derivative of a polynomial", "polynomial", derivative),
    ("math_poly_eval", "evaluate a polynomial", "number", poly_eval),
    ("math_derivative_at", "derivative of a polynomial at a point", "number", derivative_at),
    ("math_definite_integral", "definite integral of a polynomial", "number", definite_integral),
    ("math_gcd", "greatest common divisor", "number", gcd_gen),
    ("math_lcm", "least common multiple", "number", lcm_gen),
    ("math_mod", "remainder", "number", mod_gen),
    ("math_mod_pow", "modular exponentiation", "number", mod_pow),
    ("math_binomial", "binomial coefficient", "number", binomial),
    ("math_permutations", "k-permutations", "number", permutations),
    ("math_dice_probability", "probability of a dice sum", "number", dice_probability),
    ("math_draw_probability", "drawing balls without replacement", "number", draw_probability),
    ("math_arith_series", "sum of an arithmetic series", "number", arith_series),
    ("math_arith_nth", "n-th term of an arithmetic sequence", "number", arith_nth),
    ("math_geom_series", "sum of a geometric series", "number", geom_series),
    ("math_exponents", "product of powers", "number", exponents),
    ("math_logarithm", "logarithm of an exact power", "number", logarithm),
    ("math_mean", "arithmetic mean", "number", mean_gen),
    ("math_median", "median", "number", median_gen),
    ("math_variance", "population variance", "number", variance_gen),
    ("math_triangle_area", "area of a triangle from coordinates", "number", triangle_area),
    ("math_distance", "distance between two points", "number", distance_points),
    ("math_circle_area", "area of a circle, 2 decimals", "number", circle_area),
    ("math_det2", "2x2 determinant", "number", det2),
    ("math_det3", "3x3 determinant", "number", det3),
    ("math_dot_product", "dot product", "number", dot_product),
    ("math_percent_of", "percentage of a number", "number", percent_of),
    ("math_percent_change", "percentage change, 2 decimals", "number", percent_change),
    ("math_simple_interest", "simple interest", "number", simple_interest),
    ("math_compound_interest", "compound interest, 2 decimals", "number", compound_interest),
    ("math_order_of_ops", "evaluate an integer expression", "number", order_of_ops),
    ("math_base_convert", "write a number in another base", "number", base_convert),
    ("math_unit_convert", "unit conversion", "number", unit_convert),
    ("math_digit_sum", "sum of digits", "number", digit_sum),
    ("math_count_divisors", "number of divisors", "number", count_divisors),
    ("math_sum_of_squares", "sum of the first n squares", "number", sum_of_squares),
    ("math_inequality_count", "integers satisfying a double inequality", "number", inequality_count),
]

for _name, _desc, _form, _gen in FAMILY:
    register(MathDomain(_name, _desc, _form, _gen))
