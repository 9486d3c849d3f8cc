"""Kill -9 at seeded points, then `posttrain train --resume`: the trace and metrics equal an
uninterrupted run's, row for row.

Each run is a real `posttrain train` process (tests/loop/crash_worker.py: the CLI's main with
the parity domain registered, so every step trains), killed with SIGKILL when a file it writes
shows it has reached the chosen point. The uninterrupted run is made in the same test. Rows are
compared by content in write order; left out are only the values that are random, wall-clock or
thread-scheduling figures by design (records_testlib.py: write times, per-stage
timings, and every `time`, `*seconds`, `*_s`, `*_share`, `*_max_depth` field of the metrics and
event data).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopcfg import tiny
from records_testlib import assert_same, records, strip_wall

WORKER = Path(__file__).with_name("crash_worker.py")
TINY = tiny("{parity: {difficulty: 1}}")


def _start(log: Path, *args: str) -> subprocess.Popen:
    """The worker with `args`; its output goes to the file `log` (a pipe nobody reads could fill
    and stall it before the kill point)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("a") as out:
        return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=out, stderr=subprocess.STDOUT, env=env)


def _train(tmp_path: Path, base: str, name: str, steps: int) -> subprocess.Popen:
    return _start(
        tmp_path / f"{name}.log",
        "train",
        *TINY,
        f"model.path={base}",
        f"run.out_dir={tmp_path}",
        f"run.name={name}",
        f"run.steps={steps}",
        "run.checkpoint_every=2",
    )


def _finish(proc: subprocess.Popen, log: Path) -> str:
    proc.wait(timeout=600)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    return out


def _rows_with(path: Path, kind: str, step: int) -> bool:
    """Whether metrics.jsonl at `path` holds a complete row of `kind` at `step`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    for line in text.split("\n")[:-1]:  # a last piece without its newline is not a row yet
        row = json.loads(line)
        if row["kind"] == kind and row["step"] == step:
            return True
    return False


def _writing_checkpoint(run: Path) -> bool:
    root = run / "checkpoints"
    return root.is_dir() and any(p.name.startswith(".tmp-") for p in root.iterdir())


def _kill_when(proc: subprocess.Popen, reached) -> bool:
    """SIGKILL `proc` as soon as `reached()` holds (polled); False when it ended first."""
    while proc.poll() is None:
        if reached():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002)
    return False


def _weights(run: Path, step: int):
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))


def _run_killed(tmp_path: Path, base: str, steps: int, points: list) -> tuple[Path, str]:
    """A run killed at each of `points` in turn (each a function of the run directory telling
    whether it has been reached), resumed after each kill, then run to its end; the last
    process's output."""
    run = tmp_path / "killed"
    proc, log = _train(tmp_path, base, "killed", steps), tmp_path / "killed.log"
    for i, reached in enumerate(points):
        log = tmp_path / f"killed-{i}.log"
        killed = _kill_when(proc, lambda reached=reached: reached(run))
        assert killed, f"the run ended before kill point {i}"
        proc = _start(log, "train", "--resume", str(run))
    return run, _finish(proc, log)


@pytest.mark.heavy
def test_a_run_killed_after_a_step_and_resumed_writes_what_an_uninterrupted_run_writes(tmp_path, micro_base):
    # the kill point: a seeded step past a checkpoint (every 2 steps), so its rows must be rolled back
    step = random.Random(24).choice([3, 5])
    full = _train(tmp_path, micro_base, "full", 6)
    run, output = _run_killed(tmp_path, micro_base, 6, [lambda run: _rows_with(run / "metrics.jsonl", "monitor", step)])
    _finish(full, tmp_path / "full.log")
    assert "resume: rolled back what was written after step" in output, output[-3000:]
    want, got = records(tmp_path / "full"), records(run)
    assert_same(got, want)
    start, end = _weights(tmp_path / "full", 2), _weights(tmp_path / "full", 6)
    assert any((start[k] != end[k]).any() for k in start), "the run never trained: the comparison would be vacuous"
    resumed = _weights(run, 6)
    assert all((resumed[k] == end[k]).all() for k in end)


@pytest.mark.heavy
def test_the_comparison_catches_a_duplicated_rollout_and_a_repeated_metrics_row(tmp_path, micro_base):
    """The comparison above can fail: one rollout written twice, or one metrics row repeated (what
    a resume without the rollback wrote), is caught."""
    run = tmp_path / "one"
    _finish(_train(tmp_path, micro_base, "one", 2), tmp_path / "one.log")
    want = records(run)
    db = sqlite3.connect(run / "trace.db")
    cols = [r[1] for r in db.execute("PRAGMA table_info(rollouts)") if r[1] != "id"]
    with db:
        db.execute(
            f"INSERT INTO rollouts (id,{','.join(cols)}) SELECT 'dup' || id,{','.join(cols)} FROM rollouts "
            "WHERE rowid = (SELECT MAX(rowid) FROM rollouts)"
        )
    db.close()
    with pytest.raises(AssertionError, match="rollouts"):
        assert_same(records(run), want)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines + [lines[-1]]))
    with pytest.raises(AssertionError, match="metrics"):
        assert_same(records(run), {**want, "rollouts": records(run)["rollouts"]})


@pytest.mark.slow
def test_a_run_killed_at_several_seeded_points_writes_what_an_uninterrupted_run_writes(tmp_path, micro_base):
    """Kill points, in one run, in order: after a seeded step's train row; while a checkpoint is
    being written (a .tmp- folder seen; if the write is too quick to see, the kill lands just
    after it); after the last step's row, during the final evaluation; and once the final
    checkpoint exists, before eval.json."""
    rng = random.Random(2024)
    first = rng.choice([3, 5])  # past a checkpoint (every 2 steps): before the first one there is none to resume
    points = [
        lambda run: _rows_with(run / "metrics.jsonl", "train", first),
        lambda run: _writing_checkpoint(run) or (run / "checkpoints" / "step_00000006").is_dir(),
        lambda run: _rows_with(run / "metrics.jsonl", "train", 8),
        lambda run: (run / "checkpoints" / "step_00000008").is_dir(),
    ]
    full = _train(tmp_path, micro_base, "full", 8)
    run, _ = _run_killed(tmp_path, micro_base, 8, points)
    _finish(full, tmp_path / "full.log")
    assert_same(records(run), records(tmp_path / "full"))
    end, resumed = _weights(tmp_path / "full", 8), _weights(run, 8)
    assert all((resumed[k] == end[k]).all() for k in end)
    tables = [strip_wall(json.loads((r / "eval.json").read_text())) for r in (run, tmp_path / "full")]
    assert tables[0] == tables[1]
