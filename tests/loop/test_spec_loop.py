"""`posttrain train` with `engine.speculation: suffix`: the acceptance figures in every step's
metrics row (that speculative rollouts are the plain ones is tests/engine/test_engine_spec.py's)."""

from __future__ import annotations

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics


@pytest.mark.heavy  # a whole run: about 15 s on a busy 2-core machine
def test_a_speculative_run_logs_its_acceptance_every_step(tmp_path, micro_base):
    from posttrain.loop import train

    overrides = [*tiny(), f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=spec", "run.steps=2"]
    overrides += ["eval.tasks_per_domain=2", "rollout.max_tokens=12", "engine.speculation.kind=suffix"]
    run_dir = train(load_config(None, overrides), log=lambda *_: None).run_dir
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["engine_spec_proposed"] > 0 and "engine_spec_accepted_d1" in r for r in rows)
    assert all(1.0 <= r["engine_spec_accepted_len"] <= 9.0 and 0 <= r["engine_spec_acceptance"] <= 1 for r in rows)


@pytest.mark.heavy  # a whole run: about 15 s on a busy 2-core machine
def test_a_run_with_the_draft_head_drafts_with_it_and_checkpoints_it(tmp_path, micro_base):
    from posttrain.loop import train
    from posttrain.model.draft_head import META, WEIGHTS
    from posttrain.trainer.checkpoint import latest_checkpoint
    from posttrain.trainer.trainer import DRAFT_OPTIMIZER

    overrides = [*tiny(), f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=head", "run.steps=2"]
    overrides += ["eval.tasks_per_domain=2", "rollout.max_tokens=12", "engine.speculation.kind=head"]
    overrides += ["trainer.draft_head.enabled=true"]
    run_dir = train(load_config(None, overrides), log=lambda *_: None).run_dir
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["engine_spec_proposed"] > 0 and "engine_spec_accepted_d1" in r for r in rows)
    ckpt = latest_checkpoint(run_dir)
    assert all((ckpt / name).is_file() for name in (WEIGHTS, META, DRAFT_OPTIMIZER))
