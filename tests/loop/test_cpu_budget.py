"""`run.cpu_budget_s`: the run stops after the step at which training spent its CPU budget,
then ends as a normal run does (final evaluation, checkpoint); the count survives a resume."""

from __future__ import annotations

import json

import yaml
from test_loop_e2e import TINY as E2E_TINY

from posttrain.cli import main
from posttrain.metrics_log import read_metrics
from posttrain.trainer.checkpoint import checkpoint_path, latest_checkpoint

TINY = [*E2E_TINY, "eval.every_steps=0", "monitor.report=false"]  # the loop tests' tiny run, no extras


def _train(tmp_path, base, name, *extra):
    return main(["train", *TINY, f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}", *extra])


def test_a_tiny_budget_stops_after_the_first_step_and_ends_normally(tmp_path, micro_base, capsys):
    # any step spends more than a microsecond of CPU: the budget is reached at step 1 of 50
    assert _train(tmp_path, micro_base, "b", "run.steps=50", "run.cpu_budget_s=0.000001") == 0
    run = tmp_path / "b"
    out = capsys.readouterr().out
    assert "stopping the run after step 1: CPU budget reached" in out  # the log
    assert "peak RSS of the training process:" in out
    train_rows = read_metrics(run / "metrics.jsonl", "train")
    assert [r["step"] for r in train_rows] == [1]
    assert train_rows[0]["train_cpu_s"] > 0
    assert 0 < train_rows[0]["rss_mib"] <= train_rows[0]["peak_rss_mib"]  # the process's memory, every step
    (stop,) = read_metrics(run / "metrics.jsonl", "stop")
    assert stop["step"] == 1 and "run.cpu_budget_s=1e-06" in stop["reason"]
    table = json.loads((run / "eval.json").read_text())
    assert table["after"] is not None  # the final evaluation ran
    assert latest_checkpoint(run) == checkpoint_path(run, 1)  # the final checkpoint is the stopped step's


def test_the_count_continues_after_a_resume(tmp_path, micro_base):
    assert _train(tmp_path, micro_base, "r", "run.steps=2", "run.checkpoint_every=2") == 0
    run = tmp_path / "r"
    spent = read_metrics(run / "metrics.jsonl", "train")[-1]["train_cpu_s"]
    assert read_metrics(run / "metrics.jsonl", "stop") == []  # no budget: all steps ran
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["run"].update(steps=6, cpu_budget_s=spent)  # already spent before the resume
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--resume", str(run)]) == 0
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl", "train")]
    assert steps == [1, 2, 3]  # one more step, then the carried count stops it
    (stop,) = read_metrics(run / "metrics.jsonl", "stop")
    assert stop["step"] == 3
    assert read_metrics(run / "metrics.jsonl", "train")[-1]["train_cpu_s"] > spent


def test_a_non_positive_budget_is_a_config_error(tmp_path, micro_base, capsys):
    assert _train(tmp_path, micro_base, "z", "run.cpu_budget_s=0") == 2
    assert "cpu_budget_s" in capsys.readouterr().err
