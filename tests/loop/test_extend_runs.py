"""Real runs extended and branched: a finished run resumed with more steps and a lower learning
rate trains the extra steps from its final checkpoint (the optimizer restored, its learning rate
the new one) and says so in its config, history, metrics and trace; resumed as it is it does
nothing; a run started `--from` a checkpoint is a new run at step 0 on those weights."""

from __future__ import annotations

import json

import pytest
import torch
from loopcfg import tiny

from posttrain import lineage
from posttrain.cli import main
from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore
from posttrain.trainer.checkpoint import latest_checkpoint

pytestmark = pytest.mark.heavy  # three short runs


def _lr(ckpt) -> float:
    return torch.load(ckpt / "optimizer.pt", weights_only=True)["param_groups"][0]["lr"]


def test_extend_a_finished_run_then_branch_from_its_checkpoint(tmp_path, micro_base, parity_domain, capsys):
    from posttrain.loop import train

    own = [*tiny(), parity_domain, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=a"]
    quiet = lambda *_: None  # noqa: E731
    first = train(load_config(None, [*own, "run.steps=2", "run.checkpoint_every=2"]), log=quiet)
    run = first.run_dir
    step2 = latest_checkpoint(run)
    assert step2.name == "step_00000002" and _lr(step2) == 3e-4

    # resumed as it is: finished, nothing written
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", str(run)]) == 0
    assert "finished at step 2: nothing to do" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_bytes() == metrics

    # a branch from step 2: a new run at step 0 on those weights, fresh optimizer
    assert main(["train", "--from", str(step2), "run.name=b", "run.steps=1"]) == 0
    capsys.readouterr()
    branch = tmp_path / "b"
    assert load_config(branch / "config.yaml").model.path == str(step2.resolve())
    b_ckpt = latest_checkpoint(branch)
    assert b_ckpt.name == "step_00000001"
    assert json.loads((b_ckpt / "loop_state.json").read_text())["trainer"]["steps"] == 1  # not 3: fresh
    (entry,) = lineage.read_history(branch)
    assert entry["kind"] == "branch" and entry["source_step"] == 2
    # it started from the step-2 weights: its table before training is the source run's after
    a_eval, b_eval = (json.loads((d / "eval.json").read_text()) for d in (run, branch))
    items = lambda table: {d: (v["accuracy"], v["items"]) for d, v in table["domains"].items()}  # noqa: E731
    assert items(b_eval["before"]) == items(a_eval["after"])

    # extended: 2 more steps at a lower learning rate, from the final checkpoint
    said: list[str] = []
    more = train(
        load_config(None, [*own, "run.steps=4", "run.checkpoint_every=2", "trainer.lr=1e-4"]), run, said.append
    )
    assert more.steps == 4 and latest_checkpoint(run).name == "step_00000004"
    assert _lr(latest_checkpoint(run)) == 1e-4  # the restored optimizer takes the new learning rate
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "train")] == [1, 2, 3, 4]
    (change,) = read_metrics(run / "metrics.jsonl", "config_change")
    assert change["step"] == 2 and {c["field"] for c in change["changes"]} == {"run.steps", "trainer.lr"}
    events = [e for e in TraceStore(run / "trace.db").events() if e["kind"] == "config_change"]
    assert len(events) == 1 and "run.steps 2 -> 4" in events[0]["message"]
    assert f"{run}: resumed at step 2 with trainer.lr 0.0003 -> 0.0001, run.steps 2 -> 4" in said
    assert load_config(run / "config.yaml").run.steps == 4  # a later plain resume keeps it
    assert main(["train", "--resume", str(run)]) == 0
    assert "finished at step 4: nothing to do" in capsys.readouterr().out
