"""Evaluation's catch sites blame by cause: a verifier that raises on the gold answer too (or a
stricter check that raises, or a typed infra error) makes the item an infra error with its typed
kind, never a wrong answer, and the table says so; one that raises only on the model's answer
scores it wrong (a model fault)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
from pipeline_testlib import ScriptedEngine  # noqa: E402

from posttrain.domains import registry  # noqa: E402
from posttrain.domains.base import ProceduralDomain  # noqa: E402
from posttrain.errors import ErrorRecord, GenerationError, SandboxError, VerifierError  # noqa: E402
from posttrain.evaluate import EvalTable, format_table  # noqa: E402
from posttrain.evaluate.core import ItemVerdict, evaluate_sets, judge  # noqa: E402
from posttrain.evaluate.heldout import domain_set  # noqa: E402
from posttrain.pipeline.workers import Verdict, fault_score, verify_one  # noqa: E402
from posttrain.types import Episode, Score  # noqa: E402


def _verdict(task, completion, fault=None, error=None):
    """The item's verdicts for `completion`: verified as the lifecycle verifies it (or given as
    the model fault or the infra kind a stage decided), then judged."""
    episode = Episode(completion)
    if fault is not None:
        return judge(task, Verdict(fault_score(fault), fault=fault), episode)
    if error is not None:
        return judge(task, Verdict(None, error, "masked"), episode)
    return judge(task, verify_one(task, episode), episode)


class Raises:
    """A verifier that raises `error`."""

    name, version = "raises", "1"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def score(self, task, episode):
        raise self.error


class Pays:
    name, version = "pays", "1"

    def score(self, task, episode):
        return Score(1.0, passed=True)


class Sums(ProceduralDomain):
    name, category = "test_sums", "test"

    def generate(self, rng, difficulty):
        return f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=", "0"


class Undecided(Sums):
    """A stricter check (the domain's audit) that cannot decide."""

    def audit(self, task, completion):
        raise VerifierError("the audit could not recompute the answer")


@pytest.fixture
def domain(monkeypatch):
    def register(verifier, cls=Sums):
        dom = cls()
        dom.verifier = verifier
        monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
        return domain_set(dom.name, 1, 4, "core")

    return register


class RaisesOnGarbage:
    """A verifier that raises on any completion but the gold answer ("0")."""

    name, version = "garbage", "1"

    def score(self, task, episode):
        if episode.completion != "0":
            raise ValueError(f"cannot parse {episode.completion[:10]!r}")
        return Score(1.0, passed=True)


def test_a_verifier_that_raises_on_the_gold_answer_too_is_an_infra_error_not_a_wrong_answer(domain):
    task = domain(Raises(RuntimeError("verifier crashed"))).tasks()[0]
    got = _verdict(task, "0")
    why = "RuntimeError: verifier crashed (the verifier raises on the task's gold answer too)"
    assert got == ItemVerdict(None, None, None, ErrorRecord("verifier", why))


def test_a_verifier_that_raises_only_on_the_models_answer_scores_it_wrong(domain):
    task = domain(RaisesOnGarbage()).tasks()[0]
    got = _verdict(task, "1e309")
    assert got == ItemVerdict(False, False, 0.0, ErrorRecord("model", "ValueError: cannot parse '1e309'"))
    assert _verdict(task, "0").ok is True
    fault = _verdict(task, "x", fault="KeyError: 'x'")  # the driver ended the episode
    assert fault == ItemVerdict(False, False, 0.0, ErrorRecord("model", "KeyError: 'x'"))


def test_a_typed_error_keeps_its_own_kind(domain):
    task = domain(Raises(SandboxError("the checker's sandbox died"))).tasks()[0]
    got = _verdict(task, "0")
    assert got == ItemVerdict(None, None, None, ErrorRecord("sandbox", "SandboxError: the checker's sandbox died"))


def test_a_stricter_check_that_cannot_decide_masks_only_the_eval_verdict(domain):
    task = domain(Pays(), Undecided).tasks()[0]
    got = _verdict(task, "0")
    want = ErrorRecord("verifier", "VerifierError: the audit could not recompute the answer")
    assert got == ItemVerdict(None, True, 1.0, want)
    assert _verdict(task, "0", error="sandbox").error.kind == "sandbox"  # masked by the driver


def test_an_all_infra_domain_shows_as_infra_in_the_table_not_accuracy_zero(domain):
    sets = {"test_sums": domain(Raises(RuntimeError("verifier crashed")))}
    res = evaluate_sets(ScriptedEngine(lambda context, j: "0"), sets)["test_sums"]
    assert res.n == 4 and res.infra_errors == 4 and res.accuracy is None and res.train_accuracy is None
    table = EvalTable(0, {"test_sums": res})
    assert table.accuracies == {} and "infra (4 errors)" in format_table(table)
    paid = evaluate_sets(ScriptedEngine(lambda context, j: "0"), {"test_sums": domain(Pays())})["test_sums"]
    assert paid.infra_errors == 0 and paid.train_accuracy == 1.0  # the same items, scored, are no infra errors


class Flaky:
    """A verifier whose judge fails with a transient error the first `fails` times it is asked
    about each task, then pays."""

    name, version = "flaky", "1"

    def __init__(self, fails: int) -> None:
        self.fails, self.calls = fails, {}

    def score(self, task, episode):
        self.calls[task.id] = self.calls.get(task.id, 0) + 1
        if self.calls[task.id] <= self.fails:
            raise VerifierError("the judge service is down")
        return Score(1.0, passed=True)


def test_a_transient_verifier_failure_is_retried_in_evaluation_as_in_training(domain):
    flaky = Flaky(fails=2)  # the default policy retries twice (pipeline.max_retries)
    res = evaluate_sets(ScriptedEngine(lambda context, j: "0"), {"test_sums": domain(flaky)})["test_sums"]
    assert res.infra_errors == 0 and res.accuracy == 1.0  # scored after the retries, never masked
    assert sorted(flaky.calls.values()) == [3] * 4
    down = Flaky(fails=3)  # one failure more than the retries: each item is an infra error, never a 0
    res = evaluate_sets(ScriptedEngine(lambda context, j: "0"), {"test_sums": domain(down)})["test_sums"]
    assert res.infra_errors == 4 and res.accuracy is None
    assert sorted(down.calls.values()) == [3] * 4


class FailingCalls(ScriptedEngine):
    """A scripted engine whose first `fails` generate calls raise a transient GenerationError."""

    def __init__(self, fails: int) -> None:
        super().__init__(lambda context, j: "0")
        self.fails, self.calls = fails, 0

    def generate(self, requests):
        self.calls += 1
        if self.calls <= self.fails:
            raise GenerationError("the engine server restarted")
        return super().generate(requests)


def test_a_failed_engine_call_is_retried_in_evaluation_then_masks_never_zero(domain):
    sets = {"test_sums": domain(Pays())}
    res = evaluate_sets(FailingCalls(fails=2), sets)["test_sums"]
    assert res.infra_errors == 0 and res.accuracy == 1.0  # the third call generated every item
    res = evaluate_sets(FailingCalls(fails=10**6), sets)["test_sums"]  # split down to each item, retried
    assert res.infra_errors == 4 and res.accuracy is None  # retries spent: infra, never a wrong answer


def test_a_single_models_table_is_headed_accuracy_not_before(domain):
    res = evaluate_sets(ScriptedEngine(lambda context, j: "0"), {"test_sums": domain(Pays())})["test_sums"]
    head = format_table(EvalTable(0, {"test_sums": res})).splitlines()[0]
    assert "accuracy [95% CI]" in head and "before" not in head and "after" not in head
    two = format_table(EvalTable(0, {"test_sums": res}), EvalTable(1, {"test_sums": res})).splitlines()[0]
    assert "before [95% CI]" in two and "after [95% CI]" in two
