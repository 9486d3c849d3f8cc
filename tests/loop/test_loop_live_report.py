"""The loop rewrites the report while it trains (report/live.py): after each evaluation and every
monitor.report_every_steps steps, with that step's rows already written; evaluation samples and
the sampled-token count go to the run's records for it."""

from __future__ import annotations

import json

from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics
from posttrain.report.live import LiveReport


def test_the_loop_refreshes_the_report_during_training(tmp_path, micro_base, monkeypatch):
    """After each evaluation and every monitor.report_every_steps steps, with that step's rows
    (train, eval, eval samples) already written."""
    from posttrain.loop import train

    seen = []

    def spy(self, step, evaluated):
        if self.due(step, evaluated):
            rows = read_metrics(self.run_dir / "metrics.jsonl")
            samples = [json.loads(x) for x in (self.run_dir / "eval_samples.jsonl").read_text().splitlines()]
            seen.append((step, evaluated, max(r["step"] for r in rows if r["kind"] == "train"), samples[-1]["step"]))
        return False

    monkeypatch.setattr(LiveReport, "refresh", spy)
    cfg = load_config(
        None,
        [
            *tiny(),
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=live",
            "run.steps=4",
            "eval.every_steps=2",
            "monitor.report_every_steps=3",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    assert seen == [(2, True, 2, 2), (3, False, 3, 2)]  # step 4's evaluation is the final one, then the report
    assert (result.run_dir / "report.html").is_file()
    train_rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert all(r["tokens_sampled"] > 0 for r in train_rows)
    evals = [json.loads(x) for x in (result.run_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert [(e["step"], e["eval"]) for e in evals] == [(0, "full"), (2, "subset"), (4, "full")]
    items = evals[0]["domains"]["add"]
    assert len(items) == 8 and all(isinstance(i["completion"], str) and i["prompt"] for i in items)
    assert {i["ok"] for i in items} <= {True, False, None}
