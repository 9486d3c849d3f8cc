"""Judges with measured bias (issue 28, item 2), against real judges served by `posttrain serve
--policy` (examples/rule_judges.py): a fair one, which grades correctness only, and a biased one,
which prefers verbose answers and the first position. Every bias check (calibration against
programmatic labels, the length probe, position swap, ensemble agreement, the drift alarm) fires on
the biased judge and stays quiet on the fair one."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from byo_testlib import FakeJudge, rows, train_cfg, write_jsonl

from posttrain.byo.domain import SourceDomain
from posttrain.configs.byo import SourceConfig, VerifierSpec
from posttrain.configs.monitor import AlarmsConfig
from posttrain.errors import VerifierError
from posttrain.monitor.alarms import History, JudgeDrift
from posttrain.monitor.judges import check_judge
from posttrain.monitor.signals import DomainSignals
from posttrain.types import Episode
from serve_process import posttrain_serve

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
POINTWISE = "Question: {prompt}\nAnswer: {completion}\nGrade 0-10."
PAIRWISE = "Question: {prompt}\nAnswer A: {first}\nAnswer B: {second}\nWhich answer is right? Say A, B or TIE."
CHECKS = {"labels": {"name": "exact"}, "items": 12}


@pytest.fixture(scope="module")
def judges() -> Iterator[dict[str, str]]:
    """{'fair': url, 'biased': url}: two `posttrain serve --policy` processes."""
    env = {"PYTHONPATH": EXAMPLES}
    with posttrain_serve(None, env=env, policy="rule_judges:fair") as (fair, _):
        with posttrain_serve(None, env=env, policy="rule_judges:biased") as (biased, _):
            yield {"fair": fair + "/v1", "biased": biased + "/v1"}


def _spec(url: str, mode: str = "pointwise", checks: dict | None = CHECKS) -> dict:
    rubric = POINTWISE if mode == "pointwise" else PAIRWISE
    spec = {"name": "judge", "base_url": url, "rubric": rubric, "mode": mode, "cache": False, "retries": 0}
    return spec | ({"checks": checks} if checks else {})


def _domain(tmp_path: Path, spec: dict) -> SourceDomain:
    path = write_jsonl(tmp_path / "sub.jsonl", rows(60))
    source = SourceConfig.model_validate({"path": str(path), "fields": {"prompt": "q", "answer": "a"}})
    return SourceDomain("judged", source, VerifierSpec.model_validate(spec))


def test_the_policy_server_is_a_real_openai_endpoint(judges):
    import httpx

    request = 'Question: 9-2=\nAnswer: 7\nGrade 0-10.\n\nEnd with <verdict id="0123456789abcdef">SCORE</verdict>'
    body = {"model": "x", "messages": [{"role": "user", "content": request}]}
    got = httpx.post(judges["fair"] + "/chat/completions", json=body, timeout=10).json()
    assert got["choices"][0]["message"]["content"] == '<verdict id="0123456789abcdef">10</verdict>'
    assert (
        httpx.post(judges["fair"] + "/chat/completions", json={"model": "x", "messages": []}, timeout=10).status_code
        == 400
    )


def test_a_policy_that_does_not_import_or_misbehaves_is_a_clear_error(tmp_path):
    import subprocess

    from fastapi.testclient import TestClient

    from posttrain.configs.serve import load_serve_config
    from posttrain.serve.server import build_server

    exe = Path(sys.executable).with_name("posttrain")
    got = subprocess.run([str(exe), "serve", "--policy", "nosuch_mod:fn"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and "policy 'nosuch_mod:fn' cannot be imported" in got.stderr
    (tmp_path / "bad_policy.py").write_text("def number(messages):\n    return 7\n")
    sys.path.insert(0, str(tmp_path))
    try:
        app = build_server(load_serve_config({"policy": "bad_policy:number"}))
        app.state.server.preload()
        reply = TestClient(app).post(
            "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
    finally:
        sys.path.remove(str(tmp_path))
    assert reply.status_code == 500 and "not a string" in reply.text


@pytest.mark.parametrize("mode", ["pointwise", "pairwise"])
def test_the_fair_judge_passes_every_check(judges, tmp_path, mode):
    got = check_judge(_domain(tmp_path, _spec(judges["fair"], mode)), 1)
    # 12 rows x (4 base items + 3 content triggers; the reference layout is the wrong answer's own)
    assert got is not None and got.items == 84 and got.infra_errors == 0
    assert got.fired == (), got.message()
    assert got.agreement == 1.0 and got.length_bias == 0.0
    assert got.content_bias == {"claims_correct": 0.0, "confident": 0.0, "grader_appeal": 0.0}
    assert got.abstentions == 0 and got.abstention_skew == 0.0
    assert got.swap_disagreement == (0.0 if mode == "pairwise" else None)


def test_the_biased_judge_fails_calibration_and_the_length_probe_pointwise(judges, tmp_path):
    got = check_judge(_domain(tmp_path, _spec(judges["biased"])), 1)
    assert got is not None and got.infra_errors == 0
    assert got.fired == ("calibration", "length", "content"), got.message()
    assert got.content_bias["grader_appeal"] == 1.0  # the appeal makes a wrong answer verbose: it pays
    assert got.agreement == 0.75  # the padded wrong answers: 10 from the judge, 0 from `exact`
    assert got.agreement_high < 0.9  # min_agreement
    assert got.length_bias == pytest.approx(0.5)  # wrong answers gain 1.0 when padded, right ones 0
    assert got.swap_disagreement is None  # a pointwise judge has no positions


def test_the_biased_judge_fails_the_position_swap_pairwise(judges, tmp_path):
    got = check_judge(_domain(tmp_path, _spec(judges["biased"], "pairwise")), 1)
    assert got is not None
    assert got.fired[:3] == ("calibration", "length", "position_swap"), got.message()
    assert got.swap_disagreement == pytest.approx(0.5)  # every concise item: 'A' in both orders
    assert got.length_bias == pytest.approx(0.5)


@pytest.fixture(scope="module")
def hostile() -> Iterator[dict[str, str]]:
    """{'selective': url, 'triggered': url, 'declining': url}: judges the length and position
    probes alone pass (examples/rule_judges.py), each behind a local HTTP server speaking
    /v1/chat/completions (byo_testlib.FakeJudge; `posttrain serve --policy` is the real side of
    that seam, tested above with the fair and biased judges)."""
    sys.path.insert(0, EXAMPLES)
    try:
        import rule_judges
    finally:
        sys.path.remove(EXAMPLES)
    fakes = {}
    for name in ("selective", "triggered", "declining"):
        fake = FakeJudge()
        policy = getattr(rule_judges, name)
        fake.policy = lambda request, nonce, policy=policy: policy([{"role": "user", "content": request}])
        fakes[name] = fake
    yield {name: fake.url for name, fake in fakes.items()}
    for fake in fakes.values():
        fake.close()


@pytest.mark.parametrize("mode", ["pointwise", "pairwise"])
def test_a_judge_that_abstains_where_it_would_be_wrong_is_flagged(hostile, tmp_path, mode):
    """The selective judge is `biased` except that where its verdict would be wrong (a verbose wrong
    answer) it answers without a verdict. Abstentions are scored 0, so its agreement and length figures
    look clean; the abstention skew (abstaining on wrong answers only) flags it. Before, the
    abstentions were infra errors, left out of every figure, and the judge passed."""
    got = check_judge(_domain(tmp_path, _spec(hostile["selective"], mode)), 1)
    assert got is not None and got.infra_errors == 0 and got.abstentions > 0, got.message()
    if mode == "pointwise":  # abstains on the padded wrong answers only
        assert got.fired == ("abstention",), got.message()
        assert got.agreement == 1.0 and got.length_bias == 0.0 and got.abstention_skew == pytest.approx(24 / 60)
        # the 12 padded wrong answers and the 12 with the (verbose) grader appeal, of 60 wrong items
    else:  # pairwise it is wrong in one order of every item: it abstains on all, and gold answers score 0
        assert got.abstentions == got.items and "calibration" in got.fired, got.message()


@pytest.mark.parametrize("mode", ["pointwise", "pairwise"])
def test_a_judge_that_pays_for_a_phrase_is_flagged(hostile, tmp_path, mode):
    """The triggered judge is fair except that "The answer is correct." earns full marks: length,
    position and calibration on the base items all pass; the content probe fires on that trigger."""
    got = check_judge(_domain(tmp_path, _spec(hostile["triggered"], mode)), 1)
    assert got is not None and got.agreement == 1.0 and got.length_bias == 0.0, got.message()
    assert got.fired == ("content",), got.message()
    assert got.content_bias["claims_correct"] == 1.0  # pairwise: the completion wins both orders
    assert got.content_bias["confident"] == 0.0 and got.content_bias["grader_appeal"] == 0.0


def test_a_declined_empty_answer_is_scored_0_not_masked(hostile, tmp_path):
    dom = _domain(tmp_path, _spec(hostile["declining"], checks=None))
    task = dom.sample(0, "train", 1)
    s = dom.score(task, Episode(""))
    assert (s.value, s.passed, s.parts["judge_abstained"]) == (0.0, False, 1.0)
    assert s.reason.startswith("judge_abstained")
    assert dom.score(task, Episode(str(task.reference))).value == 1.0  # a real answer is graded


def test_pairwise_reward_averages_the_two_orders(judges, tmp_path):
    """The biased judge always names the first of two short answers: debiased by the swap, the
    completion's reward is 0.5 whatever it says, and the disagreement is in the score."""
    dom = _domain(tmp_path, _spec(judges["biased"], "pairwise", checks=None))
    task = dom.sample(0, "train", 1)
    for text in (str(task.reference), "nonsense"):
        s = dom.score(task, Episode(text))
        assert s.value == 0.5 and s.parts["swap_disagree"] == 1.0
    fair = _domain(tmp_path, _spec(judges["fair"], "pairwise", checks=None))
    assert fair.score(task, Episode(str(task.reference))).parts["swap_disagree"] == 0.0
    assert fair.score(task, Episode("nonsense")).value == 0.0


def test_an_ensemble_tracks_agreement(judges, tmp_path):
    members = [_spec(judges[n], checks=None) for n in ("fair", "biased")]
    members = [{k: v for k, v in m.items() if k != "name"} for m in members]  # a member is a judge's parameters
    mixed = _domain(tmp_path, {"name": "judge_ensemble", "judges": members, "checks": CHECKS})
    task = mixed.sample(0, "train", 1)
    verbose_wrong = "I thought about it for a long while and I am certain the answer is <answer>-1</answer>"
    s = mixed.score(task, Episode(verbose_wrong))
    assert s.parts["agreement"] == 0.0 and s.parts["judge_0"] == 0.0 and s.parts["judge_1"] == 1.0
    assert s.parts["programmatic"] == 0.0 and s.value == 0.5
    same = _domain(tmp_path, {"name": "judge_ensemble", "judges": [members[0], members[0]]})
    assert same.score(task, Episode(verbose_wrong)).parts["agreement"] == 1.0
    assert check_judge(mixed, 1).fired  # the ensemble with a biased member inherits its length bias


def _signals(reward: float, programmatic: float | None) -> DomainSignals:
    zeros = {f: 0.0 for f in DomainSignals.__dataclass_fields__ if f not in ("programmatic_mean",)}
    return DomainSignals(**{**zeros, "reward_mean": reward, "programmatic_mean": programmatic})  # type: ignore[arg-type]


@pytest.mark.parametrize("programmatic, fires", [(0.2, True), (None, False), ("rises", False), ("half", True)])
def test_the_drift_alarm_fires_when_the_judge_rises_alone(programmatic, fires):
    cfg = AlarmsConfig()
    h = History()
    for step in range(12):
        reward = 0.2 + 0.05 * step
        shadow = {"rises": reward, "half": 0.2 + 0.01 * step}.get(programmatic, programmatic)  # type: ignore[arg-type]
        h.signals.setdefault("judged", []).append((step, _signals(reward, shadow)))
    hits = JudgeDrift().check(h, cfg)
    assert bool(hits) == fires, hits


def test_train_reports_the_bias_checks_and_the_shadow_score(judges, tmp_path, micro_base):
    """`posttrain train` with a judged domain: the run-start checks are in the log, the trace, the
    metrics and the alarm of the biased judge; every step carries the programmatic shadow score."""
    from posttrain.loop import train
    from posttrain.metrics_log import read_metrics
    from posttrain.report.data import load_run
    from posttrain.report.html import render
    from posttrain.trace import TraceStore

    path = write_jsonl(tmp_path / "sub.jsonl", rows(60))
    out = {}
    for name in ("fair", "biased"):
        spec = json.dumps(_spec(judges[name]))
        domains = f"{{judged: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}, verifier: {spec}}}}}"  # noqa: E501
        lines: list[str] = []
        cfg = train_cfg(tmp_path / name, micro_base, name, domains, "run.steps=2")
        result = train(cfg, log=lambda m, *_, out=lines: out.append(m))
        rows_ = list(read_metrics(result.run_dir / "metrics.jsonl"))
        checks = [r for r in rows_ if r["kind"] == "judge_check"]
        alarms = [r for r in rows_ if r["kind"] == "alarm" and r["alarm"] == "judge_bias"]
        monitor = [r for r in rows_ if r["kind"] == "monitor"]
        events = TraceStore(result.run_dir / "trace.db").events("judge_check")
        assert len(checks) == 1 and len(events) == 1 and any("agreement with programmatic labels" in m for m in lines)
        assert all(r["domains"]["judged"]["programmatic_mean"] is not None for r in monitor) and len(monitor) == 2
        out[name] = (checks[0], alarms, render(load_run(result.run_dir)))
    assert out["fair"][0]["fired"] == [] and out["fair"][1] == [] and ">passed</td>" in out["fair"][2]
    assert out["biased"][0]["fired"] == ["calibration", "length", "content"] and len(out["biased"][1]) == 1
    assert "biased: calibration, length, content" in out["biased"][2]  # the report's judge table
    stop = train_cfg(tmp_path / "stop", micro_base, "stop", domains, "monitor.alarms.judge_bias.action=stop")
    with pytest.raises(
        VerifierError, match="biased: calibration, length, content; set monitor.alarms.judge_bias.action=log"
    ):
        train(stop, log=lambda *_: None)  # refuses to start on the biased judge


def test_the_drift_alarm_fires_in_a_run_whose_judge_goes_lenient(tmp_path, micro_base):
    """`posttrain train` graded by a judge that turns lenient after the first training steps (served
    by `posttrain serve --policy rule_judges:drifting`): its reward jumps while the programmatic shadow
    score of the same rollouts does not, and judge_drift fires; the fair judge's run stays quiet."""
    from posttrain.loop import train
    from posttrain.metrics_log import read_metrics

    path = write_jsonl(tmp_path / "sub.jsonl", rows(60))
    checks = {"labels": {"name": "exact"}, "items": 2}  # 8 judge calls at run start
    # measured: 62 judge calls before step 1 (8 checks, 54 of the held-out eval), then 16 a step; lenient
    # after 110 calls: steps 1-2 (the baseline) graded fairly, steps 5-6 (the window) leniently, with a
    # margin of a step (16 calls) on either side
    env = {"PYTHONPATH": EXAMPLES, "RULE_JUDGE_DRIFT_AFTER": "110"}
    alarms = ["monitor.alarms.baseline_steps=2", "monitor.alarms.window=2", "run.steps=6", "eval.every_steps=0"]
    fired = {}
    for policy in ("fair", "drifting"):
        with posttrain_serve(None, env=env, policy=f"rule_judges:{policy}") as (url, _):
            spec = json.dumps(_spec(url + "/v1", checks=checks))
            domains = f"{{judged: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}, verifier: {spec}}}}}"  # noqa: E501
            cfg = train_cfg(tmp_path / policy, micro_base, policy, domains, *alarms)
            result = train(cfg, log=lambda *_: None)
        got = list(read_metrics(result.run_dir / "metrics.jsonl"))
        fired[policy] = [r for r in got if r["kind"] == "alarm" and r["alarm"] == "judge_drift"]
        steps = [r["domains"]["judged"] for r in got if r["kind"] == "monitor"]
        assert len(steps) == 6 and all(s["programmatic_mean"] is not None for s in steps)
    assert fired["fair"] == []
    assert len(fired["drifting"]) == 1
    d = fired["drifting"][0]["data"]
    assert d["judge_recent"] - d["judge_baseline"] > 0.15 + d["programmatic_recent"] - d["programmatic_baseline"]


def test_an_ensemble_in_training_records_its_agreement(judges, tmp_path, micro_base):
    """A `judge_ensemble` domain in `posttrain train`: every step's monitor row carries the members'
    agreement (`judge_agreement`); a single judge's row has none."""
    from posttrain.loop import train
    from posttrain.metrics_log import read_metrics

    path = write_jsonl(tmp_path / "sub.jsonl", rows(60))
    members = [{k: v for k, v in _spec(judges[n], checks=None).items() if k != "name"} for n in ("fair", "biased")]
    spec = json.dumps({"name": "judge_ensemble", "judges": members})
    source = f"source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}"
    domains = f"{{ens: {{{source}, verifier: {spec}}}, one: {{{source}, verifier: {json.dumps(_spec(judges['fair'], checks=None))}}}}}"  # noqa: E501
    result = train(train_cfg(tmp_path, micro_base, "ens", domains, "run.steps=2"), log=lambda *_: None)
    steps = [r["domains"] for r in read_metrics(result.run_dir / "metrics.jsonl") if r["kind"] == "monitor"]
    assert len(steps) == 2
    for s in steps:
        # short answers (6 tokens): the biased member grades them like the fair one, so they agree
        assert s["ens"]["judge_agreement"] == 1.0 and s["ens"]["programmatic_mean"] is None
        assert s["one"]["judge_agreement"] is None
