"""The trace's marks and roll-back (what a resume cuts the trace back to), its damage check,
and recovery of a database with an unreadable page; the metrics log's whole-line writes and
its roll-back. Real SQLite files, real bytes overwritten."""

from __future__ import annotations

import json
import sqlite3
from types import SimpleNamespace

import pytest

from posttrain.errors import ConfigError
from posttrain.metrics_log import MetricsLog, read_metrics, roll_back
from posttrain.trace import RolloutRecord, TraceStore
from posttrain.trace.recover import recover


def _record(i: int) -> RolloutRecord:
    return RolloutRecord(
        task_id=f"add:train:1:{i}", domain="add", split="train", difficulty=1, taskset_version="v",
        group_id=f"{i // 4}", model_version=i // 4, sampling={"n": 4}, prompt=f"{i}+1=" + "x" * 300,
        completion=str(i + 1), completion_tokens=2, finish_reason="stop", reward=1.0, passed=True,
        parts={"outcome": 1.0}, reason="", verifier="exact@1", timings={},
    )  # fmt: skip


LINK = SimpleNamespace(advantage=0.5, ratio=1.0, clipped=0.0)  # what the trainer's stats give per rollout


def _step(store: TraceStore, step: int, n: int = 4) -> list[str]:
    ids = store.write_rollouts([_record(step * n + k) for k in range(n)])
    store.mark_consumed(step, dict.fromkeys(ids, LINK))
    store.add_event("pipeline", "stats", step=step)
    return ids


def test_roll_back_deletes_what_came_after_the_mark_and_event_ids_continue(tmp_path):
    store = TraceStore(tmp_path / "trace.db")
    for step in (1, 2):
        _step(store, step)
    mark = store.mark()
    assert mark == {"rollouts": 8, "events": 2, "draws": 0}
    for step in (3, 4):
        _step(store, step)
    store.mark_consumed(2, {})  # nothing relinked: step 2's links stay
    assert store.roll_back(mark, 2) == (8, 2)
    assert store.count() == 8 and store.mark() == mark
    assert {r["train_step"] for r in store.recent(100)} == {1, 2}
    store.add_event("pipeline", "again", step=3)
    assert [e["id"] for e in store.events()] == [1, 2, 3]  # as the uninterrupted run numbers them
    assert store.roll_back(mark, 4) == (0, 1)  # back again: the new event goes, nothing else
    store.close()


def test_a_mark_is_on_disk_in_the_database_file_itself(tmp_path):
    """After `mark`, the database file alone (its WAL lost, as a power loss may lose the part of
    it not yet synced) holds every row the mark counts."""
    import shutil

    store = TraceStore(tmp_path / "trace.db")
    for step in (1, 2):
        _step(store, step)
    mark = store.mark()
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "trace.db", tmp_path / "copy" / "trace.db")  # without trace.db-wal
    store.close()
    copy = TraceStore(tmp_path / "copy" / "trace.db")
    assert copy.mark() == mark and copy.count() == 8
    copy.close()


def test_links_to_steps_after_the_checkpoint_are_cleared(tmp_path):
    store = TraceStore(tmp_path / "trace.db")
    ids = _step(store, 1)
    mark = store.mark()
    store.mark_consumed(2, {ids[0]: LINK})  # a rollout of step 1 consumed by step 2, after the mark
    store.roll_back(mark, 1)
    assert store.get(ids[0])["train_step"] is None and store.get(ids[1])["train_step"] == 1
    store.close()


def _scribble(db, page_no: int) -> None:
    """Overwrite page `page_no` (1-based) of the database file with garbage."""
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(db, "r+b") as fh:
        fh.seek((page_no - 1) * size)
        fh.write(b"\xa5" * size)


def test_a_scribbled_page_is_found_and_recovery_keeps_the_rest(tmp_path):
    db = tmp_path / "trace.db"
    store = TraceStore(db)
    for step in range(1, 31):
        _step(store, step)  # 120 rollouts over many leaf pages
    store.close()
    pages = sqlite3.connect(db).execute("PRAGMA page_count").fetchone()[0]
    _scribble(db, pages // 2)
    with pytest.raises(ConfigError, match=rf"trace database {db} is damaged \(.*posttrain trace recover {tmp_path}"):
        TraceStore(db).check()
    got = recover(db)
    assert 0 < got.rows["rollouts"] < 120 and got.rows["events"] <= 30
    assert got.damaged.name.startswith("trace.db.damaged-") and got.damaged.is_file()
    fresh = TraceStore(db)
    fresh.check()
    kept = fresh.recent(1000)
    assert len(kept) == got.rows["rollouts"]
    assert all(r["completion"] == str(int(r["task_id"].rsplit(":", 1)[1]) + 1) for r in kept)  # rows intact
    fresh.close()


def test_metrics_lines_are_whole_and_roll_back_to_a_mark(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write("train", 1, big="x" * 100_000)  # longer than any buffer: still one line
    mark = log.mark()
    log.write("train", 2)
    log.close()
    with path.open("a") as fh:
        fh.write('{"kind": "train", "st')  # torn by a crash
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert roll_back(path, mark) > 0 and [r["step"] for r in read_metrics(path)] == [1]
    assert roll_back(path, mark) == 0
    assert json.loads(path.read_text().splitlines()[0])["big"] == "x" * 100_000


@pytest.mark.parametrize("torn", ['{"kind": "train", "st', "x" * 200_000], ids=["short", "longer-than-a-read"])
def test_a_log_reopened_after_a_torn_line_drops_it_instead_of_gluing_the_next_row_to_it(tmp_path, torn):
    """A resume from a checkpoint without marks reopens a log whose last line a crash tore."""
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write("train", 1, big="y" * 100_000)
    log.close()
    with path.open("a") as fh:
        fh.write(torn)
    log = MetricsLog(path)
    log.write("train", 2)
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert json.loads(path.read_text().splitlines()[0])["big"] == "y" * 100_000
