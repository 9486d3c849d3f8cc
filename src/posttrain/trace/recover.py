"""`posttrain trace recover RUN_DIR`: salvage the readable rows of a damaged trace database.

Invariant: the damaged file is never written to, and a sound one is left as it
is (its copy passes `quick_check`). The damaged file's copy (with its WAL) is read
with SQLite's schema checks relaxed (`writable_schema`, reads only), table by
table in rowid order; where a page cannot be read, single rows are looked up past
it, so every row SQLite can still reach is kept, under its own rowid (a
checkpoint's trace mark stays valid). The rows go into a fresh database with the
current schema, written beside the old one and renamed into place only when
complete; the damaged file (and its WAL) is moved aside as
`trace.db.damaged-<time>`. Nothing is invented: rows SQLite cannot read are lost,
and the counts say how many were kept.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import ConfigError
from posttrain.trace import SCHEMA_VERSION, TraceStore

TABLES = ("rollouts", "events", "draws", "meta")
_BATCH = 256
_PROBE = 100_000
"""Rowids looked up one at a time past an unreadable page when the table's last rowid is unknown."""


@dataclass(frozen=True)
class Recovered:
    """What `recover` kept: rows per table, and where the damaged file now lies."""

    rows: dict[str, int]
    damaged: Path


def recover(path: str | Path) -> Recovered | None:
    """Salvage the trace database at `path` (a trace.db file) into a fresh one at the same path;
    None (and nothing changed) when its copy passes SQLite's `quick_check`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no trace database at {str(path)!r}")
    fresh = path.with_name(path.name + ".recovering")
    for leftover in (fresh, *_sidecars(fresh)):
        leftover.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="trace-recover-") as scratch:
        copy = Path(scratch) / "damaged.db"
        shutil.copyfile(path, copy)
        for side, dst in zip(_sidecars(path), _sidecars(copy), strict=True):
            if side.is_file():
                shutil.copyfile(side, dst)
        if _sound(copy):
            return None
        rows = _salvage(copy, fresh)
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    path.rename(aside)
    for side, dst in zip(_sidecars(path), _sidecars(aside), strict=True):
        if side.is_file():
            side.rename(dst)
    fresh.rename(path)
    return Recovered(rows, aside)


def _sound(db: Path) -> bool:
    """Whether SQLite's `quick_check` passes the database at `db`."""
    try:
        con = sqlite3.connect(db)
        try:
            return [r[0] for r in con.execute("PRAGMA quick_check(1)")] == ["ok"]
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return False


def _sidecars(db: Path) -> tuple[Path, Path]:
    return db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")


def _salvage(src_path: Path, dst_path: Path) -> dict[str, int]:
    """Copy every readable row of each table of `src_path` into a fresh trace at `dst_path`."""
    dst = TraceStore(dst_path)  # the current schema
    dst.close()
    out = sqlite3.connect(dst_path)
    try:
        src = sqlite3.connect(src_path)
        src.execute("PRAGMA writable_schema=ON")  # read the tables even when the schema names a lost page
    except sqlite3.DatabaseError:
        out.close()
        return dict.fromkeys(TABLES, 0)
    counts = {}
    try:
        for table in TABLES:
            cols = _columns(src, table) & _columns(out, table)
            counts[table] = _copy(src, out, table, sorted(cols)) if cols else 0
        out.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        out.commit()
        out.execute("PRAGMA journal_mode=DELETE")  # everything in the one file before it is renamed
    finally:
        src.close()
        out.close()
    return counts


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    try:
        return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        return set()


def _copy(src: sqlite3.Connection, out: sqlite3.Connection, table: str, cols: list[str]) -> int:
    names = ",".join(cols)
    insert = f"INSERT OR IGNORE INTO {table} (rowid,{names}) VALUES ({','.join('?' * (len(cols) + 1))})"
    n = 0
    for row in _rows(src, table, names):
        if table == "meta" and row[cols.index("key") + 1] == "schema_version":
            continue  # the fresh file's schema version stands
        out.execute(insert, row)
        n += 1
    return n


def _rows(src: sqlite3.Connection, table: str, names: str) -> Iterator[tuple]:
    """Every readable row of `table` as (rowid, *columns), in rowid order."""
    scan = f"SELECT rowid,{names} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT {_BATCH}"
    last, top = -(2**63), _top(src, table)
    while True:
        try:
            batch = src.execute(scan, (last,)).fetchall()
        except sqlite3.DatabaseError:
            found = _probe(src, table, names, last, top)
            if found is None:
                return
            batch = [found]
        if not batch:
            return
        yield from batch
        last = batch[-1][0]


def _probe(src: sqlite3.Connection, table: str, names: str, last: int, top: int | None) -> tuple | None:
    """The next row after rowid `last` that a point lookup can read (up to `top`, or `_PROBE` on)."""
    start = max(last, 0) + 1
    for rowid in range(start, (top if top is not None else start + _PROBE) + 1):
        try:
            row = src.execute(f"SELECT rowid,{names} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            return row
    return None


def _top(src: sqlite3.Connection, table: str) -> int | None:
    try:
        got = src.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]
    except sqlite3.DatabaseError:
        return None
    return int(got) if got is not None else None
