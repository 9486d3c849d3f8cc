"""A run's lineage (lineage.py): when a resumed run does nothing, how a branch's config is made,
and what is written down. The runs here are folders in the real layout (config.yaml, a
checkpoint's meta, loop state and manifest); test_extend_runs.py trains real ones."""

from __future__ import annotations

import hashlib
import json

import pytest

from posttrain import lineage
from posttrain.cli import main
from posttrain.configs import dump_config, load_config
from posttrain.errors import ConfigError
from posttrain.rundir import RunDir
from posttrain.trainer.checkpoint import verify_checkpoint


def _run(tmp_path, name="r", steps=4, at=4, finished=4, weights="full", extra=()):
    """A run folder of `steps` whose newest checkpoint is at step `at`, ended there under run.steps
    `finished` (None: not ended)."""
    cfg = load_config(None, [f"run.steps={steps}", f"run.out_dir={tmp_path}", f"run.name={name}", *extra])
    run = RunDir.create(cfg)
    ckpt = run.checkpoints / f"step_{at:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"format": 1, "step": at, "weights": weights}))
    (ckpt / "loop_state.json").write_text(json.dumps({"step": at}))
    (ckpt / "model.safetensors").write_bytes(b"weights")  # what the manifest checks: sizes and sha256
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in ckpt.iterdir()
    }
    (ckpt / "manifest.json").write_text(json.dumps({"format": 1, "files": files}))
    if finished is not None:
        lineage.mark_finished(run, at, finished)
    return run.path, cfg


def _with(cfg, *overrides):
    """`cfg` (a run's config, as `_run` made it) with `overrides`."""
    own = [f"run.steps={cfg.run.steps}", f"run.out_dir={cfg.run.out_dir}", f"run.name={cfg.run.name}"]
    return load_config(None, [*own, *overrides])


def test_a_finished_run_resumed_as_it_is_does_nothing_and_says_so(tmp_path, capsys):
    path, _ = _run(tmp_path)
    before = sorted(p.name for p in path.rglob("*"))
    assert main(["train", "--resume", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path} finished at step 4: nothing to do (give run.steps=N with N above 4" in out
    assert sorted(p.name for p in path.rglob("*")) == before  # nothing written, no evaluation run


def test_a_finished_run_asked_for_other_changes_alone_is_told_they_train_nothing(tmp_path, capsys):
    path, _ = _run(tmp_path)
    assert main(["train", "--resume", str(path), "trainer.lr=1e-4"]) == 2
    err = capsys.readouterr().err
    assert "run.steps: " in err and "finished at step 4; changing trainer.lr alone trains nothing" in err


def test_more_steps_go_on_and_fewer_than_the_checkpoint_are_refused(tmp_path):
    path, cfg = _run(tmp_path)
    assert lineage.finished_resume(path, _with(cfg, "run.steps=6"), verify_checkpoint) == ""
    with pytest.raises(ConfigError, match=r"run.steps: 3 is below step 4, which .* newest checkpoint holds"):
        lineage.finished_resume(path, _with(cfg, "run.steps=3"), verify_checkpoint)


def test_a_run_a_stop_ended_early_goes_on_with_a_change_and_rests_without(tmp_path):
    path, cfg = _run(tmp_path, steps=10, at=4, finished=10)
    assert "finished at step 4: nothing to do" in lineage.finished_resume(path, None, verify_checkpoint)
    assert lineage.finished_resume(path, _with(cfg, "trainer.lr=1e-4"), verify_checkpoint) == ""


def test_an_unfinished_run_goes_on_and_so_does_one_killed_before_its_end_was_recorded(tmp_path):
    path, _ = _run(tmp_path, steps=8, at=4, finished=None)
    assert lineage.finished_resume(path, None, verify_checkpoint) == ""
    # ended once at step 2, extended, killed after its new final checkpoint (step 4) and before its
    # end was recorded: the resume runs the final evaluation again (eval.json may be missing)
    lineage.mark_finished(RunDir(path), 2, 2)
    assert lineage.finished_resume(path, None, verify_checkpoint) == ""


def test_a_finished_run_whose_final_checkpoint_is_damaged_is_not_finished(tmp_path):
    """Its resume falls back to the previous intact checkpoint (tests/loop/test_damaged_runs.py)."""
    path, cfg = _run(tmp_path)
    weights = path / "checkpoints" / "step_00000004" / "model.safetensors"
    weights.write_bytes(b"wEights")  # same size, other bytes
    assert lineage.finished_resume(path, None, verify_checkpoint) == ""
    (path / "checkpoints" / "step_00000004" / "loop_state.json").write_text("[" * 100_000)
    assert lineage.finished_resume(path, None, verify_checkpoint) == ""
    assert lineage.finished_resume(path, _with(cfg, "run.steps=2"), verify_checkpoint) == ""  # the loop checks it


def test_refused_fields_are_refused_on_the_command_line_before_anything_loads(tmp_path, capsys):
    path, _ = _run(tmp_path)
    assert main(["train", "--resume", str(path), "run.steps=8", "rollout.group_size=4", "run.seed=2"]) == 2
    err = capsys.readouterr().err
    assert "rollout.group_size (8 -> 4): the group" in err and "run.seed (0 -> 2): it seeds" in err
    assert "run.steps (" not in err
    assert not (path / lineage.HISTORY).exists()


def test_a_resume_given_the_config_file_compares_the_whole_config(tmp_path, capsys):
    path, cfg = _run(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(dump_config(cfg).replace("steps: 4", "steps: 9", 1))
    assert lineage.resume_overrides(path, str(config), ["trainer.lr=1e-4"]).run.steps == 9
    assert main(["train", str(config), "rollout.top_p=0.5", "--resume", str(path)]) == 2
    assert "rollout.top_p (1.0 -> 0.5)" in capsys.readouterr().err


class _Sink:
    def __init__(self):
        self.rows: list[tuple] = []

    def write(self, kind, step, **values):
        self.rows.append((kind, step, values))

    def add_event(self, kind, message, step=None, data=None):
        self.rows.append((kind, step, message))


def test_changes_are_written_down_and_written_again_after_a_rollback(tmp_path):
    path, cfg = _run(tmp_path, steps=4, at=4)
    new = _with(cfg, "run.steps=8", "trainer.lr=1e-4")
    rundir, goes_on, changed = lineage.resume_config(path, new)
    sink, said = _Sink(), []
    lineage.record_resume(rundir, goes_on, changed, 4, sink, sink, said.append)
    assert load_config(path / "config.yaml").trainer.lr == 1e-4  # a later plain resume keeps it
    (entry,) = lineage.read_history(path)
    assert entry["kind"] == "resume" and entry["step"] == 4
    assert {c["field"]: (c["from"], c["to"]) for c in entry["changes"]} == {
        "trainer.lr": (3e-4, 1e-4),
        "run.steps": (4, 8),
    }
    assert [r[0] for r in sink.rows] == ["config_change", "config_change"]
    assert sink.rows[0][2]["change"] == "resume"
    assert said == [f"{path}: resumed at step 4 with trainer.lr 0.0003 -> 0.0001, run.steps 4 -> 8"]
    # a crash before the next checkpoint, resumed from step 4 again: the rollback cut the row and the
    # event, so they are written again; a resume from a later checkpoint keeps them (not repeated)
    again = _Sink()
    lineage.record_resume(rundir, goes_on, [], 4, again, again, said.append)
    assert [r[0] for r in again.rows] == ["config_change", "config_change"] and len(said) == 1
    later = _Sink()
    lineage.record_resume(rundir, goes_on, [], 6, later, later, said.append)
    assert later.rows == []


def test_posttrain_trace_lists_the_config_changes(tmp_path, capsys):
    from posttrain.trace import TraceStore

    path, cfg = _run(tmp_path)
    store = TraceStore(path / "trace.db")
    rundir, goes_on, changed = lineage.resume_config(path, _with(cfg, "run.steps=8"))
    lineage.record_resume(rundir, goes_on, changed, 4, store, _Sink(), lambda m: None)
    store.close()
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 config change(s) (config_history.jsonl):\n  step 4: resumed at step 4 with run.steps 4 -> 8" in out


def test_a_branch_takes_the_source_runs_config_and_names_the_checkpoint(tmp_path):
    extra = ["trainer.lr=1e-3", "model.path=/orig", "eval.before_from=/orig-run"]
    path, _ = _run(tmp_path, name="src", extra=extra)
    ckpt = path / "checkpoints" / "step_00000004"
    for source in (ckpt, path):  # a checkpoint folder, or a run folder (its newest)
        cfg = lineage.branch_config(source, None, ["run.steps=2"])
        assert cfg.model.path == str(ckpt.resolve()) and cfg.trainer.lr == 1e-3 and cfg.run.steps == 2
        assert cfg.run.name is None  # a new run folder
        assert cfg.eval.before_from is None  # it named the source run's start, not this checkpoint
    with pytest.raises(ConfigError, match="model.path and --from both name a starting model"):
        lineage.branch_config(ckpt, None, ["model.path=/other"])
    with pytest.raises(ConfigError, match="neither a checkpoint folder") as missing:
        lineage.branch_config(tmp_path / "nothing", None, [])
    assert " holds " not in str(missing.value)  # no checkpoints folder there to list


def test_a_branch_from_a_checkpoint_the_run_does_not_hold_lists_those_it_does(tmp_path):
    # the README's tour named step_00000040 of a run that kept only its newest checkpoints
    path, _ = _run(tmp_path, name="src", at=300)
    with pytest.raises(ConfigError, match="neither a checkpoint folder") as missing:
        lineage.branch_config(path / "checkpoints" / "step_00000040", None, [])
    assert f"{path / 'checkpoints'} holds step_00000300 (every run.checkpoint_every steps" in str(missing.value)


def test_a_branch_from_a_config_file_and_its_record(tmp_path):
    path, _ = _run(tmp_path, name="src")
    ckpt = path / "checkpoints" / "step_00000004"
    config = tmp_path / "c.yaml"
    config.write_text("trainer: {lr: 5.0e-5}\n")
    cfg = lineage.branch_config(ckpt, str(config), [f"run.out_dir={tmp_path}", "run.name=b"])
    assert cfg.trainer.lr == 5e-5 and cfg.model.path == str(ckpt.resolve())
    sink, said = _Sink(), []
    lineage.record_branch(RunDir.create(cfg), cfg, sink, sink, said.append)
    (entry,) = lineage.read_history(tmp_path / "b")
    assert entry["kind"] == "branch" and entry["step"] == 0 and entry["source_step"] == 4
    assert entry["from"] == str(ckpt.resolve()) and sink.rows[0][2]["change"] == "branch"
    assert said == [f"{tmp_path / 'b'}: branched from {ckpt.resolve()} (step 4 of {path.resolve()})"]


def test_a_lora_checkpoint_cannot_be_branched_from(tmp_path, capsys):
    path, _ = _run(tmp_path, weights="lora")
    assert main(["train", "--from", str(path)]) == 2
    assert "holds only a LoRA adapter; export merged weights first" in capsys.readouterr().err
