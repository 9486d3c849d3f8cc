"""Run records compared by content: a run directory's metrics rows, trace rollouts, trace
events and draws in write order, less the values that are random, wall-clock or thread-scheduling figures
by design (write times, per-stage timings, and every `time`, `*seconds`, `*_s`,
`*_share` and `*_max_depth` field: a queue's deepest fill depends on which thread ran first;
and the process's memory, `*rss_mib`: what else the process held)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

_WALL = re.compile(r"^(time|.*seconds|.*_s|.*_share|.*_max_depth|.*rss_mib)$")


def strip_wall(value):
    """`value` less every mapping key named like a wall-clock or scheduling figure, at any depth."""
    if isinstance(value, dict):
        return {k: strip_wall(v) for k, v in value.items() if not _WALL.match(k)}
    if isinstance(value, list):
        return [strip_wall(v) for v in value]
    return value


def records(run: Path) -> dict[str, list]:
    """A run's metrics rows, trace rollouts and trace events in write order, less the values that
    are random, wall-clock or scheduling figures by design."""
    metrics = [strip_wall(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]
    db = sqlite3.connect(run / "trace.db")
    db.row_factory = sqlite3.Row
    try:
        rollouts = [
            {k: v for k, v in dict(r).items() if k not in ("created_at", "timings")}  # ids from birth: compared
            for r in db.execute("SELECT * FROM rollouts ORDER BY rowid")
        ]
        draws = [
            {k: v for k, v in dict(r).items() if k != "created_at"}
            for r in db.execute("SELECT * FROM draws ORDER BY rowid")
        ]
        events = [
            {**{k: v for k, v in dict(r).items() if k != "created_at"}, "data": strip_wall(json.loads(r["data"]))}
            for r in db.execute("SELECT * FROM events ORDER BY id")
        ]
    finally:
        db.close()
    return {"metrics": metrics, "rollouts": rollouts, "events": events, "draws": draws}


def assert_same(got: dict[str, list], want: dict[str, list]) -> None:
    """Fail naming the first part (metrics, rollouts, events) and row where `got` and `want` differ."""
    for part in ("metrics", "rollouts", "events", "draws"):
        assert len(got[part]) == len(want[part]), f"{part}: {len(got[part])} rows, uninterrupted {len(want[part])}"
        for i, (a, b) in enumerate(zip(got[part], want[part], strict=True)):
            assert a == b, f"{part} row {i} differs"
