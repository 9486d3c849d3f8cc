"""Kill -9 at seeded random points (during generation, during a train step, during a checkpoint
write), resume each time, and check from the trace alone that every task the pool handed out was
trained on exactly once or dropped with its reason: none lost, none trained twice.

Each run is a real `posttrain train` process (tests/loop/crash_worker.py, the parity domain, so
every step trains), killed with SIGKILL when what it has written shows it reached the point:
- generation of step s: step s-1's monitor row is in metrics.jsonl (and its checkpoint, when
  it has one, is in place) and no rollout of step s is in the trace yet (the kill lands in the
  step's sampling, or the evaluation before it);
- train step s: step s's rollouts are in the trace and its train row is not in metrics.jsonl
  (the kill lands in the trainer's step, the trace links or the draw fates);
- checkpoint s: checkpoints/.tmp-step_s-* exists (if the write is too quick to see, the kill
  lands just after it, in the next step's generation).
Points come in increasing steps, so what a killed process wrote never satisfies the next point
before the resumed process has rolled it back and written it again.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
import sqlite3
from pathlib import Path

import pytest
from test_crash_resume import TINY, _finish, _kill_when, _rows_with, _start

from posttrain.trace import DROP_REASONS, TraceStore

STEPS, EVERY = 8, 2


def _trace_has_step(run: Path, step: int) -> bool:
    db = run / "trace.db"
    if not db.is_file():
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return (
                con.execute("SELECT 1 FROM rollouts WHERE group_id LIKE ? LIMIT 1", (f"{step}:%",)).fetchone()
                is not None
            )
        finally:
            con.close()
    except sqlite3.OperationalError:  # the file is being created
        return False


def _point(kind: str, step: int):
    metrics = "metrics.jsonl"
    if kind == "generation":  # after step s-1's checkpoint when it has one (else the kill is in its write)
        ckpt = f"step_{step - 1:08d}" if (step - 1) % EVERY == 0 else None
        return lambda run: (
            _rows_with(run / metrics, "monitor", step - 1)
            and (ckpt is None or (run / "checkpoints" / ckpt).is_dir())
            and not _trace_has_step(run, step)
        )
    if kind == "train":
        return lambda run: _trace_has_step(run, step) and not _rows_with(run / metrics, "train", step)
    root = f"step_{step:08d}"
    return lambda run: (
        (run / "checkpoints").is_dir()
        and any(p.name.startswith(f".tmp-{root}-") or p.name == root for p in (run / "checkpoints").iterdir())
    )


def _points(seed: int, n: int) -> list[tuple[str, int]]:
    """`n` seeded kill points in increasing steps, past the first checkpoint (step EVERY)."""
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(EVERY + 1, STEPS + 1), n))
    out = []
    for s in steps:
        kinds = ["generation", "train"] + (["checkpoint"] if s % EVERY == 0 else [])
        out.append((rng.choice(kinds), s))
    return out


def _train(tmp_path: Path, base: str, name: str, steps: int, *extra: str):
    args = [*TINY, f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}", f"run.steps={steps}"]
    return _start(tmp_path / f"{name}.log", "train", *args, f"run.checkpoint_every={EVERY}", *extra)


def _killed_run(tmp_path: Path, base: str, points: list[tuple[str, int]], *extra: str) -> Path:
    run = tmp_path / "killed"
    proc = _train(tmp_path, base, "killed", STEPS, *extra)
    log = tmp_path / "killed.log"
    for i, (kind, step) in enumerate(points):
        reached = _point(kind, step)
        killed = _kill_when(proc, functools.partial(reached, run))
        assert killed, f"the run ended before kill point {i} ({kind} at step {step}): {log.read_text()[-2000:]}"
        log = tmp_path / f"killed-{i}.log"
        proc = _start(log, "train", "--resume", str(run))
    _finish(proc, log)
    return run


def _draws(run: Path) -> list[tuple]:
    con = sqlite3.connect(run / "trace.db")
    try:
        return [
            tuple(r)
            for r in con.execute(
                "SELECT id, step, task_id, group_id, fate, reason, fate_step FROM draws ORDER BY rowid"
            )
        ]
    finally:
        con.close()


def _assert_exactly_once(run: Path) -> None:
    store = TraceStore.read_only(run / "trace.db")
    try:
        got = store.accounting()
        trained_rows = store._db.execute(
            "SELECT group_id, COUNT(DISTINCT train_step) FROM rollouts WHERE train_step IS NOT NULL GROUP BY group_id"
        ).fetchall()
    finally:
        store.close()
    assert got.exact, got.describe()
    assert not got.lost and not got.trained_twice and got.trained > 0
    assert all(n == 1 for _, n in trained_rows) and len(trained_rows) == got.trained
    draws = _draws(run)
    for step in range(1, STEPS + 1):  # every step's draws, each once, numbered from 0 in draw order
        ids = [d[0] for d in draws if d[1] == step]
        assert len(ids) >= 4 and ids == [f"d{step}.{k}" for k in range(len(ids))], (step, ids)


@pytest.mark.heavy
def test_kill_at_seeded_points_then_resume_every_draw_is_trained_once_or_dropped_with_a_reason(tmp_path, micro_base):
    """Three seeded points, one of each kind (the first seed from 26 whose points cover them)."""
    kinds = {"generation", "train", "checkpoint"}
    points = next(p for p in map(lambda s: _points(s, 3), itertools.count(26)) if {k for k, _ in p} == kinds)
    run = _killed_run(tmp_path, micro_base, points)
    _assert_exactly_once(run)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_at_several_seeded_points_the_draws_equal_an_uninterrupted_runs(tmp_path, micro_base, seed):
    """Several kill points per run, over seeds: the accounting is exact, and the draws (ids, tasks,
    groups, fates, reasons, steps) are the uninterrupted run's, row for row."""
    full = _train(tmp_path, micro_base, "full", STEPS)
    run = _killed_run(tmp_path, micro_base, _points(seed, 4))
    _finish(full, tmp_path / "full.log")
    _assert_exactly_once(run)
    want = _draws(tmp_path / "full")
    assert _draws(run) == want


def _reruns(run: Path) -> tuple[list[str], list[tuple]]:
    """The draws the resumes re-ran (their `resume_rerun` events), and every re-run group's rows:
    (draw id, its task, the group bound to it, its fate, the task of each of the group's rollouts,
    the distinct train steps its rollouts are linked to)."""
    con = sqlite3.connect(run / "trace.db")
    try:
        listed = [
            d
            for (data,) in con.execute("SELECT data FROM events WHERE kind='resume_rerun'")
            for d in json.loads(data)["draws"]
        ]
        rows = con.execute(
            "SELECT d.id, d.task_id, d.group_id, d.fate, d.reason, "
            "(SELECT GROUP_CONCAT(DISTINCT r.task_id) FROM rollouts r WHERE r.group_id = d.group_id), "
            "(SELECT COUNT(DISTINCT r.train_step) FROM rollouts r WHERE r.group_id = d.group_id) "
            "FROM draws d WHERE d.group_id LIKE '%~%' ORDER BY d.rowid"
        ).fetchall()
    finally:
        con.close()
    return listed, [tuple(r) for r in rows]


@pytest.mark.slow
def test_the_async_mode_killed_and_resumed_reruns_what_was_in_flight(tmp_path, micro_base):
    """pipeline.mode async, max_staleness 1: the stream holds up to 2 x prompts_per_step groups
    admitted and not trained, so draws are in flight at every checkpoint; a resume re-runs those
    (the same tasks, a new group each, "~" + the resume's step) instead of dropping them, each
    re-run draw ends trained or dropped with a reason, once; the end of the run drops what is
    still outstanding as "stopped"; nothing is lost, interrupted or trained twice, from the trace alone."""
    points = [("generation", 3), ("checkpoint", 6)]
    run = _killed_run(tmp_path, micro_base, points, "pipeline.mode=async", "pipeline.max_staleness=1")
    _assert_exactly_once(run)
    store = TraceStore.read_only(run / "trace.db")
    try:
        got = store.accounting()
    finally:
        store.close()
    assert "interrupted" not in got.dropped and got.dropped.get("stopped", 0) >= 4, got.describe()
    listed, rows = _reruns(run)
    assert len(listed) >= 2 * 4 and len(set(listed)) == len(listed), listed  # two resumes, each with draws in flight
    assert sorted(listed) == sorted(r[0] for r in rows)  # every re-run draw is bound to its re-run group
    for draw, task, group, fate, reason, tasks, steps in rows:
        assert fate in ("trained", "dropped"), (draw, group, fate)
        assert re.fullmatch(r"\d+:\d+(r1)?~\d+(r1)?", group), group  # its last group's id + "~" + the checkpoint's step
        assert tasks in (task, None), (draw, task, tasks)  # its rollouts (when written) are the same prompt's
        if fate == "trained":  # trained at one step
            assert tasks == task and steps == 1, (draw, task, tasks, steps)
        else:
            assert reason.split(":")[0] in set(DROP_REASONS) - {"interrupted"}, (draw, reason)
    assert sum(r[3] == "trained" for r in rows) >= 4
