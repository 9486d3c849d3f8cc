"""Damaged run state: a damaged checkpoint falls back to the previous intact one (said in one
line), leftovers of interrupted writes are removed, no intact checkpoint is one clear error,
and a damaged trace.db is one clear error naming its recovery, `posttrain trace recover`.

One finished run (checkpoints at steps 2 and 4) is made once; each test damages a copy of it
without its end record (`finished.json`), as a run killed after its final checkpoint: its resume
runs (the final evaluation again), where a finished run's resume does nothing (lineage.py).
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from loopcfg import tiny
from records_testlib import assert_same, records

from posttrain.cli import main
from posttrain.trainer.checkpoint import checkpoint_path

TINY = tiny()


@pytest.fixture(scope="module")
def finished(tmp_path_factory, micro_base):
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("finished")
    args = [*TINY, f"model.path={micro_base}", f"run.out_dir={root}", "run.name=run", "run.steps=4"]
    assert main(["train", *args, "run.checkpoint_every=2", "monitor.report=false"]) == 0
    return root / "run"


@pytest.fixture
def run(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    (copy / "finished.json").unlink()
    return copy


def _truncate(path, keep=100):
    path.write_bytes(path.read_bytes()[:keep])


def _pre_manifest(damage):
    """`damage` on a checkpoint as written before manifests existed (checked by structure)."""

    def apply(ckpt):
        (ckpt / "manifest.json").unlink()
        damage(ckpt)

    return apply


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda c: _truncate(c / "model.safetensors"), "model.safetensors has 100 bytes, the manifest says"),
        (lambda c: (c / "optimizer.pt").write_bytes(b"\0" * (c / "optimizer.pt").stat().st_size), "optimizer.pt"),
        (lambda c: (c / "meta.json").unlink(), "meta.json"),
        (lambda c: (c / "meta.json").write_text("{not json"), "meta.json"),
        (lambda c: (c / "loop_state.json").write_text("[" * 100_000), "loop_state.json: nested too deeply"),
        (_pre_manifest(lambda c: _truncate(c / "model.safetensors", 5000)), "has 5000 bytes, its header says"),
        (_pre_manifest(lambda c: _truncate(c / "optimizer.pt", 5000)), "optimizer.pt is unreadable"),
    ],
    ids=[
        "truncated-weights",
        "zeroed-optimizer",
        "no-meta",
        "bad-meta",
        "deep-state",
        "old-truncated-weights",
        "old-cut-optimizer",
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_previous_intact_one(run, finished, capsys, damage, said):
    damage(checkpoint_path(run, 4))
    leftover = run / "checkpoints" / ".tmp-step_00000004-0badc0de"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if "is damaged" in s)
    assert line.startswith("resume: checkpoints/step_00000004 is damaged (") and said in line, line
    assert line.endswith("; resuming from step_00000002"), line
    assert "resume: removed checkpoints/.tmp-step_00000004-0badc0de" in out and not leftover.exists()
    # steps 3 and 4 ran again from step 2: the records equal the unbroken run's, the checkpoint is whole again
    assert_same(records(run), records(finished))
    assert (checkpoint_path(run, 4) / "manifest.json").is_file()


def test_no_intact_checkpoint_is_one_clear_error(run, capsys):
    for step in (2, 4):
        _truncate(checkpoint_path(run, step) / "model.safetensors")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("posttrain train: error: no intact checkpoint in ") and "step_00000002: " in err


def test_a_manifest_that_lies_is_damage(run, capsys):
    """Same size, other bytes: only the sha256 can tell."""
    weights = checkpoint_path(run, 4) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert main(["train", "--resume", str(run)]) == 0
    assert "model.safetensors does not match its sha256 in the manifest" in capsys.readouterr().out


def test_a_partial_last_metrics_line_is_dropped_at_resume(run, finished):
    from posttrain.metrics_log import read_metrics

    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"kind": "train", "step": 5, "rew')  # a write cut short by kill -9
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "train")] == [1, 2, 3, 4]
    assert main(["train", "--resume", str(run)]) == 0
    assert (run / "metrics.jsonl").read_text().endswith("}\n")
    assert_same(records(run), records(finished))


def test_a_corrupt_metrics_line_is_skipped_by_plan_report_and_resume(run, finished, capsys, caplog):
    """A corrupt line in the middle of metrics.jsonl (before the checkpoint's mark, so a resume
    keeps it) is skipped with one warning naming file:line; plan, report and resume go on."""
    from posttrain.metrics_log import read_metrics

    path = run / "metrics.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[1] = b'{"kind": "train", "step": \xff oops'
    path.write_bytes(b"\n".join(lines))
    cluster = run / "cluster.yaml"
    cluster.write_text("search: {generate: [1], execute: [1], verify: [1]}\nsimulate: {steps: 2, search_steps: 2}\n")
    for argv in (["plan", str(run), "--cluster", str(cluster)], ["report", str(run)], ["train", "--resume", str(run)]):
        caplog.clear()
        assert main(argv) == 0, argv
        assert f"{path}:2: corrupt metrics line skipped (not UTF-8)" in caplog.text, argv
    rows = [(r["kind"], r["step"]) for r in read_metrics(finished / "metrics.jsonl")]
    assert [(r["kind"], r["step"]) for r in read_metrics(path)] == rows[:1] + rows[2:]  # nothing else lost


def _garbage(db):
    db.write_bytes(b"this is not a database" * 100)
    for side in ("trace.db-wal", "trace.db-shm"):
        (db.parent / side).unlink(missing_ok=True)


def _cut_pages(db):
    """A database whose last two pages are gone (the file truncated)."""
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    data = db.read_bytes()
    assert len(data) > 8 * page, "the trace is too small to lose pages"
    db.write_bytes(data[: len(data) - 2 * page])


@pytest.mark.parametrize("damage", [_garbage, _cut_pages], ids=["garbage", "truncated"])
@pytest.mark.parametrize("command", ["train --resume", "trace", "report"])
def test_a_damaged_trace_is_one_clear_error_naming_the_recovery(run, capsys, damage, command):
    damage(run / "trace.db")
    code = main([*command.split(), str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"trace database {run / 'trace.db'} is damaged (" in err
    assert f"`posttrain trace recover {run}`" in err


def test_trace_recover_salvages_the_readable_rows_and_the_run_resumes(run, finished, capsys):
    db = run / "trace.db"
    want = sqlite3.connect(finished / "trace.db").execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]
    _cut_pages(db)
    assert main(["trace", "recover", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"recovered {db}: kept ") and "the damaged file is now" in out
    aside = [p.name for p in run.iterdir() if p.name.startswith("trace.db.damaged-")]
    assert len([n for n in aside if not n.endswith(("-wal", "-shm"))]) == 1  # the file, with its WAL if it had one
    con = sqlite3.connect(db)
    kept = con.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    assert 0 < kept < want, (kept, want)  # what SQLite could still reach, nothing invented
    assert main(["trace", str(run)]) == 0
    assert main(["train", "--resume", str(run)]) == 0  # the recovered trace takes the resume's rollback


def test_trace_recover_leaves_a_sound_trace_alone(run, capsys):
    before = (run / "trace.db").read_bytes()
    assert main(["trace", "recover", str(run)]) == 0
    assert "passes SQLite's check; nothing to recover" in capsys.readouterr().out
    assert (run / "trace.db").read_bytes() == before
    assert not [p for p in run.iterdir() if p.name.startswith("trace.db.damaged-")]


def test_trace_recover_of_garbage_keeps_nothing_and_leaves_a_usable_trace(run, capsys):
    _garbage(run / "trace.db")
    assert main(["trace", "recover", str(run)]) == 0
    assert "kept 0 rollouts, 0 events" in capsys.readouterr().out
    assert main(["trace", str(run)]) == 0


def test_a_resume_removes_the_weight_syncs_leftovers(run, finished, capsys):
    weights = run / "weights"
    leftover, kept = weights / ".tmp-v00000003-0badc0de", weights / "v00000002"
    for folder in (leftover, kept):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"partial")
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"resume: removed {leftover} (left by an interrupted weight sync)" in out, out
    assert not leftover.exists() and kept.is_dir()  # a finished version is the sync's own to prune
    assert_same(records(run), records(finished))
