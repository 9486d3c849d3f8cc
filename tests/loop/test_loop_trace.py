"""TraceStore: WAL, versioned schema, one row per rollout, links to the train step."""

from __future__ import annotations

import sqlite3

import pytest

from posttrain.errors import ConfigError
from posttrain.trace import SCHEMA_VERSION, RolloutRecord, TraceStore
from posttrain.trainer.batch import RolloutLink


def _rec(**kw) -> RolloutRecord:
    base = dict(
        task_id="add:train:1:0",
        domain="add",
        split="train",
        difficulty=1,
        taskset_version="v",
        group_id="1:0",
        model_version=0,
        sampling={"temperature": 1.0},
        prompt="1+1=",
        completion="2",
        completion_tokens=1,
        finish_reason="stop",
        reward=1.0,
        passed=True,
        parts={"outcome": 1.0},
        reason="",
        verifier="exact_match@1",
        timings={"generate_s": 0.01},
    )
    base.update(kw)
    return RolloutRecord(**base)


def test_write_read_and_link(tmp_path):
    store = TraceStore(tmp_path / "t.db")
    ids = store.write_rollouts([_rec(), _rec(reward=None, passed=None, error_kind="verifier", error="boom")])
    assert store.count() == 2
    store.mark_consumed(5, {ids[0]: RolloutLink(0.5, 1.0, 0.0)})
    row = store.get(ids[0])
    assert row["train_step"] == 5 and row["advantage"] == 0.5 and row["parts"] == {"outcome": 1.0}
    masked = store.get(ids[1])
    assert masked["reward"] is None and masked["error_kind"] == "verifier"
    stats = store.domain_stats()[0]
    assert stats["rollouts"] == 2 and stats["errors"] == 1 and stats["consumed"] == 1
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_readable_from_second_connection_while_open(tmp_path):
    store = TraceStore(tmp_path / "t.db")
    store.write_rollouts([_rec() for _ in range(10)])
    other = sqlite3.connect(tmp_path / "t.db")
    assert other.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0] == 10


def test_newer_schema_refused(tmp_path):
    TraceStore(tmp_path / "t.db").close()
    db = sqlite3.connect(tmp_path / "t.db")
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    with pytest.raises(ConfigError, match="newer"):
        TraceStore(tmp_path / "t.db")


def test_events(tmp_path):
    store = TraceStore(tmp_path / "t.db")
    store.add_event("alarm", "entropy collapse", step=3, domain="add", data={"entropy": 0.01})
    (ev,) = store.events("alarm")
    assert ev["step"] == 3 and ev["domain"] == "add"
