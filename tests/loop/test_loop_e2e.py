"""`posttrain train` end to end on a micro config: traces, eval table, resume, bad input."""

from __future__ import annotations

import json

import pytest
from loopcfg import tiny

from posttrain.cli import main
from posttrain.configs import load_config
from posttrain.errors import ModelLoadError
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore

TINY = tiny()


def _cfg(tmp_path, base, name, *extra):
    return load_config(None, [*TINY, f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}", *extra])


def _params(run_dir):
    from safetensors.torch import load_file

    from posttrain.trainer.checkpoint import latest_checkpoint

    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def test_train_end_to_end(tmp_path, micro_base):
    from posttrain.loop import train

    result = train(_cfg(tmp_path, micro_base, "e2e", "run.steps=3"), log=lambda *_: None)
    store = TraceStore(result.run_dir / "trace.db")
    # one row per rollout: 3 steps x 4 prompts x 4 samples
    assert store.count() == 3 * 4 * 4
    rows = store.recent(100)
    assert {r["domain"] for r in rows} <= {"add", "reverse"}
    assert all(r["reward"] is not None for r in rows)
    # garbage or truncated completions are zero-reward rollouts with a recorded reason, never a crash
    wrong = [r for r in rows if r["reward"] == 0.0]
    assert wrong and all(r["reason"] in ("wrong answer", "truncated") for r in wrong)
    assert all(r["reason"] == "truncated" for r in wrong if r["finish_reason"] == "length")
    table = json.loads((result.run_dir / "eval.json").read_text())
    assert set(table["before"]["domains"]) == {"add", "reverse"} and table["after"] is not None
    train_rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    assert all(r["groups"] == 4 for r in train_rows)


def test_resume_matches_uninterrupted(tmp_path, micro_base, parity_domain):
    # the parity domain pays the micro model mixed rewards, so every step really trains
    from safetensors.torch import load_file

    from posttrain.loop import train

    full = train(
        _cfg(tmp_path, micro_base, "full", "run.steps=4", "run.checkpoint_every=2", parity_domain), log=lambda *_: None
    )
    part = train(
        _cfg(tmp_path, micro_base, "part", "run.steps=2", "run.checkpoint_every=2", parity_domain), log=lambda *_: None
    )
    # extend the finished run to 4 steps (`train --resume RUN run.steps=4`): exactly the uninterrupted run
    longer = _cfg(tmp_path, micro_base, "part", "run.steps=4", "run.checkpoint_every=2", parity_domain)
    resumed = train(longer, resume=part.run_dir, log=lambda *_: None)
    a, b = _params(full.run_dir), _params(resumed.run_dir)
    start = load_file(f"{micro_base}/model.safetensors")
    assert any((a[k] != start[k]).any() for k in a), "the run never trained: the comparison would be vacuous"
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), k
    ta = TraceStore(full.run_dir / "trace.db").recent(1000)
    tb = TraceStore(resumed.run_dir / "trace.db").recent(1000)
    assert sorted((r["task_id"], r["completion"]) for r in ta) == sorted((r["task_id"], r["completion"]) for r in tb)


def test_raising_verifier_is_masked_not_zero(tmp_path, micro_base, raising_domain):
    from posttrain.loop import train

    raising_domain("test_raising")
    cfg = _cfg(
        tmp_path,
        micro_base,
        "boom",
        "run.steps=2",
        "tasks.domains={test_raising: {difficulty: 1}, add: {difficulty: 1}}",
    )
    result = train(cfg, log=lambda *_: None)
    rows = TraceStore(result.run_dir / "trace.db").recent(1000, "test_raising")
    assert rows and all(r["reward"] is None and r["error_kind"] == "verifier" for r in rows)
    assert all("verifier crashed" in r["error"] for r in rows)
    assert all(r["train_step"] is None for r in rows)  # masked from the loss
    metrics = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert sum(m["infra_errors"] for m in metrics) == len(rows)


def test_model_dir_without_weights(tmp_path, micro_base, capsys):
    empty = tmp_path / "noweights"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    code = main(["train", *TINY, f"model.path={empty}", f"run.out_dir={tmp_path}", "run.name=x"])
    assert code == 2
    assert "has no weights" in capsys.readouterr().err
    with pytest.raises(ModelLoadError, match="does not exist"):
        from posttrain.model.arch import load_model

        load_model(tmp_path / "missing")


def test_existing_run_dir_refused(tmp_path, micro_base, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    code = main(["train", *TINY, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=taken"])
    assert code == 2 and "exists and is not empty" in capsys.readouterr().err
