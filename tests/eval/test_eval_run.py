"""Evaluation inside `posttrain train`: on by default during training, stored held-out set,
checks in every run, probes apart, curves with intervals in the report."""

from __future__ import annotations

import json

import pytest

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics

RUN = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_tokens=6",
    "eval.max_tokens=6",
    "eval.tasks_per_domain=10",
    "eval.subset_tasks=6",
    "eval.rotation_tasks=3",
    "eval.samples=2",
    "eval.k=[1,2]",
    "eval.above_tasks=4",
    "eval.exposure_tasks=8",
    "eval.contamination_train_tasks=40",
    "run.threads=1",
    "run.progress=false",
    "tasks.domains={add: {difficulty: 1}}",
    "eval.transfer_domains={reverse: 1}",
]


def test_default_eval_is_periodic():
    cfg = load_config(None, [])
    assert cfg.eval.every_steps > 0 and cfg.eval.subset_tasks < cfg.eval.tasks_per_domain
    assert cfg.eval.contamination and cfg.eval.exposure


def test_run_evaluates_during_training_and_reports(tmp_path, micro_base):
    from posttrain.loop import train

    cfg = load_config(
        None,
        [
            *RUN,
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=r",
            "run.steps=4",
            "eval.every_steps=2",
        ],
    )
    lines: list[str] = []
    result = train(cfg, log=lines.append)
    run = result.run_dir
    evals = read_metrics(run / "metrics.jsonl", "eval")
    assert [r["step"] for r in evals] == [0, 2, 4]  # before, one periodic evaluation, after
    assert all(r["n"]["add"] == 6 and len(r["ci"]["add"]) == 2 for r in evals)  # every point on the fixed subset
    assert evals[1]["rotation_n"]["add"] <= 3 and "full" in evals[0] and "full" not in evals[1]
    heldout = read_metrics(run / "metrics.jsonl", "heldout")
    # the monitor saw every evaluation, as the evaluator scored it (no generation of its own)
    assert [h["trusted"] for h in heldout] == [e["domains"] for e in evals]
    assert [h["domains"] for h in heldout] == [e["train_verifier"] for e in evals]
    table = json.loads((run / "eval.json").read_text())
    assert table["heldout"]["version"] and (run / "heldout.json").is_file()
    assert table["before"]["domains"]["add"]["n"] == 10 and table["deltas"]["domains"]["add"]["ci"]
    assert set(table["before"]["probes"]) == {"above:add", "transfer:reverse"}
    assert table["contamination"]["add"]["exact_overlap"] == 0 and table["exposure"]["add"]["n"] == 8
    assert [h["step"] for h in table["history"]] == [2]
    assert any("exposure check" in line for line in lines) and any("contamination" in line for line in lines)
    page = (run / "report.html").read_text()
    assert "fixed subset at each evaluation" in page and 'class="alarm">looks memorised' not in page
    assert "transfer (never trained)" in page and "Training verifier vs eval verifier" in page


@pytest.mark.heavy
def test_resume_with_periodic_evals_matches_uninterrupted(tmp_path, micro_base):
    """Periodic evaluations feed the drift guard; a resumed run still draws and trains exactly as
    an uninterrupted one, and evaluates the same stored items."""
    from posttrain.cli import main
    from posttrain.loop import train

    def cfg(name, steps):
        return load_config(
            None,
            [
                *RUN,
                f"model.path={micro_base}",
                f"run.out_dir={tmp_path}",
                f"run.name={name}",
                f"run.steps={steps}",
                "eval.every_steps=1",
                "run.checkpoint_every=2",
                "tasks.domains={add: {}, reverse: {}}",
                "eval.transfer_domains={}",
            ],
        )

    full = train(cfg("full", 4), log=lambda *_: None)
    part = train(cfg("part", 2), log=lambda *_: None)
    path = part.run_dir / "config.yaml"
    path.write_text(path.read_text().replace("steps: 2", "steps: 4"))
    resumed = train(None, resume=part.run_dir, log=lambda *_: None)
    a = json.loads((full.run_dir / "eval.json").read_text())
    b = json.loads((resumed.run_dir / "eval.json").read_text())
    assert a["heldout"]["version"] == b["heldout"]["version"]
    assert a["after"]["domains"] == b["after"]["domains"]
    # the shorter run ended at step 2 with the full evaluation, so its history has no periodic point there
    assert [h["step"] for h in a["history"]] == [1, 2, 3] and [h["step"] for h in b["history"]] == [1, 3]
    assert a["history"][-1]["domains"] == b["history"][-1]["domains"]
    # and `posttrain eval --run` rescoring the final checkpoint on the stored set agrees with the run's own after-table
    out = tmp_path / "rerun.json"
    assert main(["eval", "--run", str(full.run_dir), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["domains"] == a["after"]["domains"]
