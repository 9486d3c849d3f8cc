"""Verifiers by name, with parameters, for bring-your-own domains.

Invariant: a verifier reads only the task's RowRef (answer, metadata) and the
episode; a verdict it cannot reach (a reference that does not parse, a
database that does not build, a worker that dies) raises VerifierError, an
infra error that is masked and counted, never reward 0. `build_verifier`
knows the built-in names and the ones plugins register under the entry
point group `posttrain.verifiers`; an unknown name is a ConfigError that
lists the known ones.

A new named verifier: a class with `score(task, episode) -> Score` and its label (`name`,
`version`: contracts/verifier.py; bump the version when a score could change), entered in
`BUILTIN` below, or outside the package a factory under the `posttrain.verifiers` entry
point group (byo/plugins.py). Raise VerifierError when it cannot decide; declare `cheap` or
an execute step rather than doing sandbox work in `score`. It may touch the task, the
episode, types, errors and contracts; never the trainer, the pipeline or the trace
(docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sqlite3
import string
from collections.abc import Callable
from typing import Any

from posttrain.configs import byo as C
from posttrain.domains._modeljson import load_json, same_json
from posttrain.domains.base import extract_answer, stable_hash
from posttrain.errors import ConfigError, VerifierError
from posttrain.types import Episode, Score, Task

_PUNCT = str.maketrans("", "", string.punctuation)
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")


def answer_of(text: str, extract: str) -> str:
    if extract == "whole":
        return text.strip()
    if extract == "last_line":
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
    return extract_answer(text)


def _wrap(extract: str, answer: str) -> str:
    return f"<answer>{answer}</answer>" if extract == "answer_tag" else answer


def _score(ok: bool, reason: str = "wrong answer", **parts: float) -> Score:
    return Score(1.0 if ok else 0.0, {"outcome": 1.0 if ok else 0.0, **parts}, ok, "" if ok else reason)


class _Base:
    """Shared pieces: parameters, gold and wrong completions from the reference."""

    name = "base"
    version = "1"
    programmatic = True

    def __init__(self, params: Any) -> None:
        self.params = params

    def gold(self, task: Task) -> str | None:
        ref = task.reference.answer
        first = ref[0] if isinstance(ref, list) and ref else ref
        return _wrap(self.params.extract, first if isinstance(first, str) else json.dumps(first))

    def wrong(self, task: Task) -> str:
        return _wrap(self.params.extract, "\u2205 not the answer")

    def text(self, episode: Episode) -> str:
        return answer_of(episode.completion, self.params.extract)


class Exact(_Base):
    """Exact match after the configured normalisation; a list reference accepts any of its items."""

    name = "exact"

    def norm(self, text: str) -> str:
        p = self.params
        if p.strip_punctuation:
            text = text.translate(_PUNCT)
        if p.collapse_whitespace:
            text = " ".join(text.split())
        return text if p.case_sensitive else text.casefold()

    def score(self, task: Task, episode: Episode) -> Score:
        ref = task.reference.answer
        accepted = ref if isinstance(ref, list) else [ref]
        got = self.norm(self.text(episode))
        ok = any(got == self.norm(a if isinstance(a, str) else json.dumps(a)) for a in accepted)
        return _score(ok, "truncated" if not ok and episode.finish_reason == "length" else "wrong answer")


def parse_number(text: str) -> float | None:
    """The last number in `text` (thousands commas, a fraction a/b), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    token = found[-1].replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return float(num) / float(den) if float(den) else None
        return float(token)
    except ValueError:
        return None


class Numeric(_Base):
    """The last number of the answer within an absolute or relative tolerance of the reference."""

    name = "numeric"

    def _ref(self, task: Task) -> float:
        value = task.reference.answer
        number = (
            float(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            else parse_number(str(value))
        )
        if number is None or not math.isfinite(number):
            raise VerifierError(f"numeric verifier: reference {value!r} of {task.id} is not a number")
        return number

    def score(self, task: Task, episode: Episode) -> Score:
        gold, got = self._ref(task), parse_number(self.text(episode))
        if got is None:
            return _score(False, "no number")
        p = self.params
        ok = abs(got - gold) <= max(p.tolerance, p.relative * abs(gold))
        return _score(ok)

    def wrong(self, task: Task) -> str:
        return _wrap(self.params.extract, _fmt(self._ref(task) + 1 + max(1.0, abs(self._ref(task))) * 0.5))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


class Choice(_Base):
    """The option letter chosen (the last standalone letter of the answer, `(B)` or `B.` included)."""

    name = "choice"

    def _letter(self, text: str) -> str | None:
        letters = re.escape(self.params.letters)
        found = re.findall(rf"(?<![A-Za-z])([{letters}])(?![A-Za-z])", text)
        return found[-1] if found else None

    def score(self, task: Task, episode: Episode) -> Score:
        gold = str(task.reference.answer).strip().upper()[:1]
        if gold not in self.params.letters:
            raise VerifierError(
                f"choice verifier: reference {task.reference.answer!r} of {task.id} is not one of {self.params.letters}"
            )
        got = self._letter(self.text(episode))
        if got is None:
            return _score(False, "no option letter")
        return _score(got == gold)

    def wrong(self, task: Task) -> str:
        gold = str(task.reference.answer).strip().upper()[:1]
        return _wrap(self.params.extract, next(c for c in self.params.letters if c != gold))


class Regex(_Base):
    """The answer matches the pattern (the file's, or each row's reference as its own pattern)."""

    name = "regex"

    def _pattern(self, task: Task) -> re.Pattern:
        p, ref = self.params, str(task.reference.answer)
        text = ref if p.pattern is None else p.pattern.replace("{answer}", re.escape(ref))
        try:
            return _compile(text, re.IGNORECASE if p.ignore_case else 0)
        except re.error as exc:
            raise VerifierError(f"regex verifier: bad pattern {text!r} for {task.id}: {exc}") from None

    def score(self, task: Task, episode: Episode) -> Score:
        """Match the answer (at most MAX_REGEX_CHARS characters, bounding the pattern's
        backtracking; a longer one is a wrong answer) against the pattern."""
        pat, got = self._pattern(task), self.text(episode)
        if len(got) > MAX_REGEX_CHARS:
            return _score(False, f"answer of {len(got)} characters, over the limit of {MAX_REGEX_CHARS}")
        ok = bool(pat.fullmatch(got) if self.params.full else pat.search(got))
        return _score(ok, "no match")

    def gold(self, task: Task) -> str | None:
        return None if self.params.pattern is None else super().gold(task)


_compile = functools.lru_cache(maxsize=1024)(re.compile)
MAX_REGEX_CHARS = 10_000
"""Longest answer a user's regex is matched against."""


class MathEquiv(_Base):
    """math-verify equivalence with the LaTeX reference, in the project's math-verify worker process."""

    name = "math"

    def score(self, task: Task, episode: Episode) -> Score:
        """Exact when the reference and the answer are each one rational number (math-verify
        rounds to 6 decimals), else math-verify equivalence."""
        from posttrain.domains import _mathverify
        from posttrain.domains.math_family import exact_value, strip_wrappers

        got = self.text(episode)
        if not got:
            return _score(False, "no answer")
        gold, value = exact_value(strip_wrappers(str(task.reference.answer))), exact_value(strip_wrappers(got))
        if gold is not None and value is not None:
            return _score(gold == value)
        return _score(_mathverify.equivalent(str(task.reference.answer), got))


# ---- JSON fields ------------------------------------------------------------------

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def parse_json_object(text: str) -> dict | None:
    """The answer as a JSON object: the whole text, a fenced block, or the last {...} span."""
    candidates = [text.strip()]
    candidates += re.findall(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for c in candidates:
        try:
            value = load_json(c)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


class JsonFields(_Base):
    """F1 over the reference object's (field, value) pairs, plus schema validity as a part."""

    name = "json"

    def _ref(self, task: Task) -> dict:
        ref = task.reference.answer
        ref = json.loads(ref) if isinstance(ref, str) else ref
        if not isinstance(ref, dict):
            raise VerifierError(f"json verifier: reference of {task.id} is not a JSON object")
        return ref

    def _same(self, a: Any, b: Any) -> bool:
        """Type-strict (`_modeljson.same_json`): numbers within `numeric_tolerance` (1 equals
        1.0), strings compared case- and whitespace-insensitively, a bool never a number."""
        if isinstance(a, str) and isinstance(b, str):
            return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()
        return same_json(a, b, self.params.numeric_tolerance)

    def schema_ok(self, got: dict) -> bool:
        p = self.params
        if any(k not in got for k in p.required):
            return False
        return all(k not in got or _JSON_TYPES[t](got[k]) for k, t in p.types.items())

    def score(self, task: Task, episode: Episode) -> Score:
        ref, got = self._ref(task), parse_json_object(self.text(episode))
        if got is None:
            return Score(0.0, {"outcome": 0.0, "f1": 0.0, "schema": 0.0}, False, "no JSON object")
        keys = list(self.params.fields or ref)
        hits = sum(k in got and self._same(ref.get(k), got[k]) for k in keys)
        answered = sum(k in got for k in (self.params.fields or got))
        precision, recall = hits / answered if answered else 0.0, hits / len(keys) if keys else 1.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        schema = float(self.schema_ok(got))
        w = self.params.schema_weight
        value = (1 - w) * f1 + w * schema
        ok = f1 == 1.0 and schema == 1.0
        return Score(value, {"outcome": value, "f1": f1, "schema": schema}, ok, "" if ok else "fields differ")

    def gold(self, task: Task) -> str | None:
        return _wrap(self.params.extract, json.dumps(self._ref(task)))


# ---- SQL result set ---------------------------------------------------------------


class SqlResult(_Base):
    """The model's query runs read-only (the sql_* family's runner) and must return the reference query's rows."""

    name = "sql"

    def _connect(self, task: Task) -> sqlite3.Connection:
        p = self.params
        conn = sqlite3.connect(":memory:")
        try:
            if p.database is not None:
                src = sqlite3.connect(f"file:{p.database}?mode=ro", uri=True)
                try:
                    src.backup(conn)
                finally:
                    src.close()
            else:
                conn.executescript(str(task.reference.metadata.get(p.setup_field) or ""))
        except sqlite3.Error as exc:
            conn.close()
            raise VerifierError(f"sql verifier: cannot build the database of {task.id}: {exc}") from None
        return conn

    def score(self, task: Task, episode: Episode) -> Score:
        from posttrain.domains.sqlfam import QueryRejected, extract_sql, run_readonly, same_result

        conn = self._connect(task)
        try:
            try:
                gold = conn.execute(str(task.reference.answer)).fetchall()
            except sqlite3.Error as exc:
                raise VerifierError(f"sql verifier: the reference query of {task.id} fails: {exc}") from None
            sql = extract_sql(episode.completion)
            if not sql:
                return _score(False, "no query", runs=0.0)
            try:
                got = run_readonly(conn, sql)
            except QueryRejected as exc:
                return _score(False, str(exc), runs=0.0)
        finally:
            conn.close()
        return _score(same_result(gold, got, self.params.ordered), "different result set", runs=1.0)

    def wrong(self, task: Task) -> str:
        return "<answer>SELECT 1 WHERE 0</answer>"


# ---- code unit tests in the sandbox -------------------------------------------------


class CodeTests(_Base):
    """The row's unit tests (the answer column: [{"args": [...], "expected": ...}] or class `calls`),
    judged in the sandbox by the `code` domain's verifier on a CodeReference built from the row."""

    name = "code"

    def reference(self, task: Task) -> Any:
        from posttrain.domains.code import CodeReference

        p, ref = self.params, task.reference
        tests = ref.answer if isinstance(ref.answer, list) else json.loads(str(ref.answer))
        entry = p.entry or str(ref.metadata.get(p.entry_field) or "")
        if not entry or not isinstance(tests, list) or not tests:
            raise VerifierError(f"code verifier: {task.id} needs an entry point and a non-empty list of tests")
        return CodeReference(entry, p.kind, p.mode, json.dumps(tests), p.timeout_s)

    def execute(self, task: Task, completion: str, run: Any = None) -> Any:
        """The execute step (the pipeline's execute stage): the `code` domain's one sandbox run."""
        from posttrain.domains.code import CodeVerifier

        return CodeVerifier().execute(dataclasses.replace(task, reference=self.reference(task)), completion, run)

    def score(self, task: Task, episode: Episode) -> Score:
        """Judged on the host from the CodeRun in Episode.exec_result (no sandbox call then)."""
        from posttrain.domains.code import CodeVerifier

        return CodeVerifier().score(dataclasses.replace(task, reference=self.reference(task)), episode)

    def gold(self, task: Task) -> str | None:
        solution = task.reference.metadata.get("solution")
        return f"```python\n{solution}\n```" if isinstance(solution, str) and solution.strip() else None

    def wrong(self, task: Task) -> str:
        return "```python\npass\n```"


# ---- composite ----------------------------------------------------------------------


class Composite:
    """A weighted mean of named parts; passes at or above `pass_threshold`."""

    name = "composite"

    def __init__(self, params: C.CompositeParams) -> None:
        self.params = params
        self.parts = [(p.name or p.verifier.name, p.weight, build_verifier(p.verifier)) for p in params.parts]
        names = [n for n, _, _ in self.parts]
        if len(set(names)) != len(names):
            raise ConfigError(f"composite verifier: part names repeat ({names}); give each part a name")
        self.version = f"{stable_hash(*(f'{n}:{w}:{v.version}' for n, w, v in self.parts)):x}"[:8]
        self.programmatic = all(getattr(v, "programmatic", False) for _, _, v in self.parts)

    def score(self, task: Task, episode: Episode) -> Score:
        total = sum(w for _, w, _ in self.parts)
        parts, value, reasons = {}, 0.0, []
        for name, w, v in self.parts:
            s = v.score(task, episode)
            parts[name] = s.value
            value += w * s.value / total
            if s.reason:
                reasons.append(f"{name}: {s.reason}")
        value = min(max(value, 0.0), 1.0)
        ok = value >= self.params.pass_threshold
        return Score(value, {"outcome": value, **parts}, ok, "; ".join(reasons)[:300])

    def gold(self, task: Task) -> str | None:
        return self.parts[0][2].gold(task) if hasattr(self.parts[0][2], "gold") else None

    def wrong(self, task: Task) -> str:
        return self.parts[0][2].wrong(task) if hasattr(self.parts[0][2], "wrong") else ""


# ---- by name ------------------------------------------------------------------------


def _python(params: C.PythonParams) -> Any:
    from posttrain.byo.pycall import CallableVerifier

    return CallableVerifier(params)


def _reward_model(params: C.RewardModelParams) -> Any:
    from posttrain.byo.models import RewardModelVerifier

    return RewardModelVerifier(params)


def _judge(params: C.JudgeParams) -> Any:
    from posttrain.byo.models import JudgeVerifier

    return JudgeVerifier(params)


def _judge_ensemble(params: C.JudgeEnsembleParams) -> Any:
    from posttrain.byo.models import JudgeEnsemble

    return JudgeEnsemble(params)


BUILTIN: dict[str, Callable[[Any], Any]] = {
    "exact": Exact,
    "numeric": Numeric,
    "choice": Choice,
    "regex": Regex,
    "math": MathEquiv,
    "json": JsonFields,
    "sql": SqlResult,
    "code": CodeTests,
    "composite": Composite,
    "python": _python,
    "reward_model": _reward_model,
    "judge": _judge,
    "judge_ensemble": _judge_ensemble,
}


def build_verifier(spec: C.VerifierSpec) -> Any:
    """The verifier a spec names, with its parameters (a plugin's are validated by its own `Params`
    model when it has one). An unknown name is a ConfigError listing the known ones."""
    from posttrain.byo.plugins import plugin_verifiers

    if spec.name in BUILTIN:
        return BUILTIN[spec.name](spec.typed())
    plugins = plugin_verifiers()
    if spec.name not in plugins:
        known = sorted(set(BUILTIN) | set(plugins))
        raise ConfigError(
            f"unknown verifier {spec.name!r}; known: {', '.join(known)} "
            "(plugins add names through the entry point group posttrain.verifiers)"
        )
    factory, origin = plugins[spec.name]
    model = getattr(factory, "Params", None)
    try:
        params = model.model_validate(spec.params) if model is not None else spec.params
        return factory(params)
    except Exception as exc:  # noqa: BLE001 - a plugin's constructor is user code
        raise ConfigError(f"verifier {spec.name!r} ({origin}) rejected its parameters {spec.params}: {exc}") from None
