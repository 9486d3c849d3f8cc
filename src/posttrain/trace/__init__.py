"""TraceStore: one SQLite row per rollout, linked to the train step that used it.

Invariant: every rollout the loop generates is written exactly once, in WAL
mode, before the train step that consumes it, with its whole transcript (a
multi-turn episode's every action, observation, execution result and reward
parts in `turns`); `mark_consumed` later links it to that step. The schema
is versioned: an older file is migrated, a newer one is refused with a clear
error. Every read of a trace goes through `TraceStore` (or `read_or`); the
`trace explain` query (`explain.py`) reads through it too. A damaged file
(not a database, truncated, failing `PRAGMA quick_check`) is a ConfigError
that names it and its recovery, `posttrain trace recover RUN_DIR`
(`recover.py`); `mark` and `roll_back` let a resume cut the trace back to
what it held at a checkpoint.

Every task the pool hands out is a draw (table `draws`, schema 4, `DrawRecord`), written
with its fate before the checkpoint that holds the pool state that drew it; `accounting`
computes, from the trace alone, what became of every draw (none may be lost or trained twice).
"""

from __future__ import annotations

import json
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from posttrain.errors import ConfigError

SCHEMA_VERSION = 4
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    task_id TEXT NOT NULL,
    domain TEXT NOT NULL,
    split TEXT NOT NULL,
    difficulty INTEGER NOT NULL,
    taskset_version TEXT NOT NULL,
    group_id TEXT NOT NULL,
    model_version INTEGER NOT NULL,
    sampling TEXT NOT NULL,
    prompt TEXT NOT NULL,
    completion TEXT NOT NULL,
    completion_tokens INTEGER NOT NULL,
    finish_reason TEXT NOT NULL,
    reward REAL,
    passed INTEGER,
    parts TEXT NOT NULL,
    reason TEXT NOT NULL,
    verifier TEXT NOT NULL,
    error_kind TEXT,
    error TEXT,
    exec_result TEXT,
    turns TEXT,
    timings TEXT NOT NULL,
    retries INTEGER NOT NULL DEFAULT 0,
    train_step INTEGER,
    advantage REAL,
    ratio REAL,
    clipped REAL
);
CREATE INDEX IF NOT EXISTS rollouts_domain ON rollouts(domain, created_at);
CREATE INDEX IF NOT EXISTS rollouts_step ON rollouts(train_step);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    step INTEGER,
    kind TEXT NOT NULL,
    domain TEXT,
    message TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS draws (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    step INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    domain TEXT NOT NULL,
    group_id TEXT,
    fate TEXT,
    reason TEXT NOT NULL DEFAULT '',
    fate_step INTEGER
);
CREATE INDEX IF NOT EXISTS draws_group ON draws(group_id);
"""

DROP_REASONS = {
    "filtered": "dynamic sampling left the group out (its scored rewards all equal)",
    "no_signal": "trained on with no signal (scored rewards all equal, rollout.dynamic_sampling off)",
    "masked": "every sample of the group was masked by an infra error",
    "stale": "the group's weights were more than pipeline.max_staleness versions old",
    "paused": "its domain was paused by the scheduler (never generated)",
    "guard": "the train step applied no update (trainer.guard skipped or rolled it back)",
    "stopped": "in flight when the run stopped",
    "interrupted": "in flight at the checkpoint a resume started from, and its task could not be rebuilt to re-run",
}
"""Why a draw was dropped: a dropped draw's `reason` is one of these keys, optionally followed
by ': ' and a detail ("stale: 3 versions behind")."""


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as stored. `reward` is None when an infra error masked it."""

    task_id: str
    domain: str
    split: str
    difficulty: int
    taskset_version: str
    group_id: str
    model_version: int
    sampling: Mapping[str, Any]
    prompt: str
    completion: str
    completion_tokens: int
    finish_reason: str
    reward: float | None
    passed: bool | None
    parts: Mapping[str, float]
    reason: str
    verifier: str
    timings: Mapping[str, float]
    error_kind: str | None = None
    error: str | None = None
    exec_result: Any = None
    turns: Any = None
    """Multi-turn episodes: `transcript(rollout.turns)` (None: a single-turn rollout)."""
    retries: int = 0
    """Retries after infra errors this rollout went through (its group's generation, its own
    execute step and verification) before its score or its mask."""
    id: str = field(default_factory=lambda: new_id())
    """16 hex digits, time-ordered (`new_id`)."""
    created_at: float = field(default_factory=time.time)


def new_id() -> str:
    """A rollout id: 16 hex digits, the write time's seconds (4 digits, modulo 2**16: about 18 hours)
    then 48 random bits. Ids written in the same second share their first digits, so a step's rows
    go into a few neighbouring pages of the id index instead of one random page each (the insert
    and its commit cost about a third less). Only ids of the same second (of the same 18-hour
    cycle) can clash: at 2,000 rows a second for ten hours, a chance of about 3 in 10,000 (64
    random bits over the same run: about 1 in 10,000). A unique prefix is usually 7-8 digits."""
    return f"{int(time.time()) & 0xFFFF:04x}{os.urandom(6).hex()}"


@dataclass(frozen=True)
class DrawRecord:
    """One task the pool handed out: `id` (`draw_id`), the loop step that drew it, the group
    made from it (None before it has one, or when it never had one: a paused domain), and its
    fate: None (in flight), "trained" or "dropped" with `reason` (DROP_REASONS), decided at
    loop step `fate_step`."""

    id: str
    step: int
    task_id: str
    domain: str
    group_id: str | None = None
    fate: str | None = None
    reason: str = ""
    fate_step: int | None = None


def draw_id(step: int, k: int) -> str:
    """The id of the `k`-th task (from 0) the pool handed out during loop step `step`: a resumed
    run, which draws the same tasks in the same order, gives them the same ids."""
    return f"d{step}.{k}"


@dataclass(frozen=True)
class Accounting:
    """Every draw's fate as the trace holds it. `lost`: draws with no fate (in flight while the
    run runs; 0 once it has finished). `trained_twice`: draws whose rollouts are linked to more
    than one train step, or groups bound to more than one draw. `trained_undrawn`: groups with
    rollouts linked to a train step and no draw (rows written before trace schema 4). A dropped
    draw whose rollouts are linked to a train step is in `contradictions` unless that step
    applied no update (reasons "guard" and "no_signal": the step links its rows, changes nothing),
    and so is a trained draw none of whose rollouts is linked to the step it was trained at.
    `replayed`: groups trained again from trainer.replay's buffer (`replay` events; no new draws:
    a replayed rollout keeps its link to the step that sampled it); a replay of a group whose
    draw was not trained before the replay's step is a contradiction too."""

    drawn: int
    trained: int
    dropped: Mapping[str, int]
    lost: tuple[str, ...]
    trained_twice: tuple[str, ...]
    trained_undrawn: tuple[str, ...]
    contradictions: tuple[str, ...]
    replayed: int = 0

    @property
    def exact(self) -> bool:
        """Every draw trained once or dropped with a reason, nothing trained twice or undrawn."""
        return not (self.lost or self.trained_twice or self.trained_undrawn or self.contradictions) and (
            self.drawn == self.trained + sum(self.dropped.values())
        )

    def describe(self) -> str:
        lines = [f"drawn      {self.drawn}", f"trained    {self.trained}", f"dropped    {sum(self.dropped.values())}"]
        lines += [f"  {reason:<14}{n}" for reason, n in sorted(self.dropped.items())]
        lines.append(f"lost       {len(self.lost)}" + (f"  (no fate: {', '.join(self.lost[:5])})" if self.lost else ""))
        if self.replayed:
            lines.append(f"replayed   {self.replayed}  (groups trained again from trainer.replay; not draws)")
        for name in ("trained_twice", "trained_undrawn", "contradictions"):
            found = getattr(self, name)
            if found:
                lines.append(f"{name.replace('_', ' ')}  {len(found)}: {', '.join(found[:5])}")
        lines.append("exactly once: " + ("yes" if self.exact else "NO"))
        return "\n".join(lines) + "\n"


def accounting(db: sqlite3.Connection) -> Accounting:
    """`Accounting` of the trace database `db` (a connection with sqlite3.Row rows)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='draws'").fetchone():
        raise ConfigError("this trace was written before draws were recorded (trace schema 4): no accounting")
    drawn = db.execute("SELECT COUNT(*) FROM draws").fetchone()[0]
    trained = db.execute("SELECT COUNT(*) FROM draws WHERE fate='trained'").fetchone()[0]
    dropped: dict[str, int] = {}
    for (reason,) in db.execute("SELECT reason FROM draws WHERE fate='dropped'"):
        key = reason.split(":", 1)[0]
        dropped[key] = dropped.get(key, 0) + 1
    ids = lambda sql: [r[0] for r in db.execute(sql)]  # noqa: E731 - the first column of a query's rows
    lost = tuple(ids("SELECT id FROM draws WHERE fate IS NULL ORDER BY rowid"))
    twice = ids(
        "SELECT d.id FROM draws d JOIN rollouts r ON r.group_id = d.group_id WHERE r.train_step IS NOT NULL "
        "GROUP BY d.id HAVING COUNT(DISTINCT r.train_step) > 1"
    )
    twice += [
        f"group {g}"
        for g in ids("SELECT group_id FROM draws WHERE group_id IS NOT NULL GROUP BY group_id HAVING COUNT(*) > 1")
    ]
    undrawn = tuple(
        ids(
            "SELECT DISTINCT r.group_id FROM rollouts r WHERE r.train_step IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM draws d WHERE d.group_id = r.group_id)"
        )
    )
    contradictions = [
        f"{r[0]} trained at step {r[1]} without a trained rollout"
        for r in db.execute(
            "SELECT d.id, d.fate_step FROM draws d WHERE d.fate='trained' AND NOT EXISTS "
            "(SELECT 1 FROM rollouts r WHERE r.group_id = d.group_id AND r.train_step = d.fate_step)"
        )
    ]
    contradictions += [
        f"{r[0]} dropped ({r[1]}) but its rollouts are linked to step {r[2]}"
        for r in db.execute(
            "SELECT d.id, d.reason, MIN(r.train_step) FROM draws d JOIN rollouts r ON r.group_id = d.group_id "
            "WHERE d.fate='dropped' AND r.train_step IS NOT NULL AND d.reason NOT LIKE 'guard%' "
            "AND d.reason NOT LIKE 'no_signal%' GROUP BY d.id"
        )
    ]
    replayed, bad = _replays(db)
    return Accounting(drawn, trained, dropped, lost, tuple(twice), undrawn, tuple(contradictions + bad), replayed)


def _replays(db: sqlite3.Connection) -> tuple[int, list[str]]:
    """How many groups the `replay` events replayed, and the replays that contradict the draws:
    a group whose draw was not trained at a step before the replay's."""
    fates = {
        r[0]: (r[1], r[2]) for r in db.execute("SELECT group_id, fate, fate_step FROM draws WHERE group_id IS NOT NULL")
    }
    count, bad = 0, []
    for step, data in db.execute("SELECT step, data FROM events WHERE kind='replay' ORDER BY id"):
        for group in json.loads(data).get("groups", []):
            count += 1
            fate, fate_step = fates.get(group["group_id"], (None, None))
            if fate != "trained" or fate_step is None or fate_step >= step:
                bad.append(f"group {group['group_id']} replayed at step {step} but its draw is {fate or 'unknown'}")
    return count, bad


_COLUMNS = (
    "id created_at task_id domain split difficulty taskset_version group_id model_version sampling prompt "
    "completion completion_tokens finish_reason reward passed parts reason verifier error_kind error "
    "exec_result turns timings retries"
).split()
_JSON_COLUMNS = {"sampling", "parts", "timings", "exec_result", "turns"}
_NULLABLE_JSON = {"exec_result", "turns"}


def exec_summary(result: Any) -> dict[str, Any] | None:
    """The trace's view of an execution result: its `summary()` (plain JSON data), else
    None (nothing ran, or a result type that declares no summary)."""
    summary = getattr(result, "summary", None)
    return summary() if callable(summary) else None


def transcript(turns: Sequence[Any]) -> list[dict[str, Any]] | None:
    """A multi-turn episode's turns as plain JSON: action, observation, the turn's
    execution result summary and reward parts, and the sha256 of each image the observation
    showed (`images`, only when it showed one; never the bytes) (None for a single-turn rollout)."""
    if not turns:
        return None
    return [
        {
            "action": t.action,
            "observation": t.observation,
            "exec_result": exec_summary(t.exec_result),
            "parts": dict(t.parts),
            **({"images": list(t.images)} if t.images else {}),
        }
        for t in turns
    ]


def _encoder() -> Callable[[Any], str]:
    """json.dumps(value, default=str) without building an encoder per call: the C encoder made
    once (JSONEncoder.encode makes one per call), without the circular-reference check (trace
    values are JSON data; a cycle raises RecursionError instead of ValueError)."""
    default = json.JSONEncoder(default=str)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return default.encode
    iterencode = make(None, default.default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return default.encode(value)
        return join(iterencode(value, 0))

    return encode


_ENCODE = _encoder()
_FIELDS = operator.attrgetter(*_COLUMNS)
_JSON_AT = tuple(i for i, c in enumerate(_COLUMNS) if c in _JSON_COLUMNS)
_NULLABLE_AT = frozenset(i for i, c in enumerate(_COLUMNS) if c in _NULLABLE_JSON)
_PASSED_AT = _COLUMNS.index("passed")


_INSERT = f"INSERT INTO rollouts ({','.join(_COLUMNS)}) VALUES ({','.join('?' * len(_COLUMNS))})"


def _row(rec: RolloutRecord, encoded: dict[int, str] | None = None) -> tuple:
    """The row of `rec`; `encoded`: JSON text by id(value), for values shared by several records
    of one write (the loop passes one sampling dict per domain), encoded once."""
    out, encoded = list(_FIELDS(rec)), {} if encoded is None else encoded
    for i in _JSON_AT:
        value = out[i]
        if value is not None or i not in _NULLABLE_AT:
            text = encoded.get(id(value))
            if text is None:
                text = encoded[id(value)] = _ENCODE(value)
            out[i] = text
    if out[_PASSED_AT] is not None:
        out[_PASSED_AT] = int(out[_PASSED_AT])
    return tuple(out)


def damaged(path: str | Path, why: object) -> ConfigError:
    """The one-line error for a trace database that SQLite cannot read, with its recovery."""
    path = Path(path)
    return ConfigError(
        f"trace database {path} is damaged ({why}); `posttrain trace recover {path.parent}` copies its "
        f"readable rows into a fresh trace.db and moves the damaged file aside"
    )


@contextmanager
def readable(path: str | Path) -> Iterator[None]:
    """Turn SQLite's errors inside the block into ConfigErrors naming `path`: a damaged file
    (`damaged`), or one SQLite cannot use (locked, unopenable, a table missing)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise ConfigError(f"cannot read trace database {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise damaged(path, exc) from None


class TraceStore:
    """A trace database file; safe to read from another process while written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        with readable(self.path):
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._init_schema()

    def check(self) -> None:
        """Raise the `damaged` ConfigError when SQLite's `PRAGMA quick_check` finds the file
        damaged (a pass over every page: run once, at resume)."""
        with readable(self.path):
            found = [r[0] for r in self._db.execute("PRAGMA quick_check(3)")]
        if found != ["ok"]:
            raise damaged(self.path, "; ".join(found))

    def mark(self) -> dict[str, int]:
        """What the trace holds now, for a checkpoint: the last rowid of `rollouts`, `events` and `draws`,
        synced to disk first (a WAL checkpoint, which syncs the WAL and then the database file): a
        power loss after the checkpoint that carries this mark cannot lose what the mark counts
        (with `synchronous=NORMAL` a commit alone is durable against a process crash only)."""
        with readable(self.path):
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        rollouts = self._db.execute("SELECT COALESCE(MAX(rowid), 0) FROM rollouts").fetchone()[0]
        events = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
        draws = self._db.execute("SELECT COALESCE(MAX(rowid), 0) FROM draws").fetchone()[0]
        return {"rollouts": int(rollouts), "events": int(events), "draws": int(draws)}

    def roll_back(self, mark: Mapping[str, int], step: int) -> tuple[int, int]:
        """Back to a checkpoint at loop step `step` whose `mark` this is: the rollouts and events
        written after it are deleted, links to train steps after `step` are cleared, and the events'
        id counter is set back, so the resumed run writes what the uninterrupted run wrote. Draws go
        the same way: those recorded after the mark are deleted (a mark from before draws existed:
        those drawn after `step`), fates decided after `step` are cleared (with the group bound to
        the draw). Returns (rollouts, events) deleted."""
        with readable(self.path), self._db:
            rollouts = self._db.execute("DELETE FROM rollouts WHERE rowid > ?", (int(mark["rollouts"]),)).rowcount
            self._db.execute(
                "UPDATE rollouts SET train_step=NULL, advantage=NULL, ratio=NULL, clipped=NULL WHERE train_step > ?",
                (step,),
            )
            if "draws" in mark:
                self._db.execute("DELETE FROM draws WHERE rowid > ?", (int(mark["draws"]),))
            else:
                self._db.execute("DELETE FROM draws WHERE step > ?", (step,))
            self._db.execute(
                "UPDATE draws SET fate=NULL, reason='', fate_step=NULL, group_id=NULL WHERE fate_step > ?", (step,)
            )
            events = self._db.execute("DELETE FROM events WHERE id > ?", (int(mark["events"]),)).rowcount
            self._db.execute("UPDATE sqlite_sequence SET seq=? WHERE name='events'", (int(mark["events"]),))
        return rollouts, events

    def _init_schema(self) -> None:
        with self._db:
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row["value"]) > SCHEMA_VERSION:
                raise ConfigError(
                    f"trace database {self.path} has schema version {row['value']}, "
                    f"newer than this posttrain's {SCHEMA_VERSION}"
                )
            elif int(row["value"]) < SCHEMA_VERSION:
                self._migrate(int(row["value"]))

    def _migrate(self, version: int) -> None:
        """Version 1 -> 2: the `turns` column (multi-turn transcripts); 2 -> 3: `retries` (0 for
        the rows written before it); 3 -> 4: the `draws` table (made by the schema script, empty:
        the draws of steps written before it are not known, and `accounting` says so)."""
        cols = {r["name"] for r in self._db.execute("PRAGMA table_info(rollouts)")}
        if version < 2 and "turns" not in cols:
            self._db.execute("ALTER TABLE rollouts ADD COLUMN turns TEXT")
        if version < 3 and "retries" not in cols:
            self._db.execute("ALTER TABLE rollouts ADD COLUMN retries INTEGER NOT NULL DEFAULT 0")
        self._db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        self._db.close()

    def write_rollouts(self, records: Sequence[RolloutRecord]) -> list[str]:
        """Every record in one transaction (all or none). The records' values are read while
        writing: a value shared by several records is encoded once."""
        encoded: dict[int, str] = {}  # by id(value): the records keep every value alive meanwhile
        rows = [_row(r, encoded) for r in records]
        with self._db:
            self._db.executemany(_INSERT, rows)
        return [r.id for r in records]

    def mark_consumed(self, step: int, links: Mapping[str, Any]) -> None:
        """Link rollouts to `step`: rollout id -> what the step did with it (anything with
        `advantage`, `ratio` and `clipped`, such as the trainer's StepStats.rollouts). Updated in id
        order: the id index is walked once, left to right."""
        with self._db:
            self._db.executemany(
                "UPDATE rollouts SET train_step=?, advantage=?, ratio=?, clipped=? WHERE id=?",
                [(step, link.advantage, link.ratio, link.clipped, rid) for rid, link in sorted(links.items())],
            )

    # ---- draws: every task the pool handed out, and its fate ----

    def record_draws(self, draws: Sequence[DrawRecord]) -> None:
        """Record draws (new ones, and the fates decided since) in one transaction: a draw not
        yet stored is inserted; a stored one gets its group and fate. A fate, once set, is
        never changed: deciding a second fate for one draw is a ValueError naming it (a prompt
        trained twice, or trained and dropped), and nothing of the call is written."""
        if not draws:
            return
        with readable(self.path), self._db:
            self._db.executemany(
                "INSERT OR IGNORE INTO draws (id, created_at, step, task_id, domain) VALUES (?,?,?,?,?)",
                [(d.id, time.time(), d.step, d.task_id, d.domain) for d in draws],
            )
            bound = [(d.group_id, d.id) for d in draws if d.fate is None and d.group_id is not None]
            self._db.executemany("UPDATE draws SET group_id=? WHERE id=?", bound)
            fated = [d for d in draws if d.fate is not None]
            if not fated:
                return
            taken = self._db.execute(
                f"SELECT id, fate, reason, fate_step FROM draws WHERE fate IS NOT NULL AND id IN "
                f"({','.join('?' * len(fated))}) ORDER BY rowid LIMIT 1",
                [d.id for d in fated],
            ).fetchone()
            if taken is not None:  # a second fate: nothing of the call is written
                d = next(d for d in fated if d.id == taken["id"])
                raise ValueError(
                    f"draw {d.id}: fate {d.fate!r} at step {d.fate_step}, but the trace {self.path} already "
                    f"holds {tuple(taken)[1:]}: a prompt is given one fate"
                )
            done = self._db.executemany(
                "UPDATE draws SET group_id=COALESCE(?, group_id), fate=?, reason=?, fate_step=? "
                "WHERE id=? AND fate IS NULL",
                [(d.group_id, d.fate, d.reason, d.fate_step, d.id) for d in fated],
            ).rowcount
            if done != len(fated):
                raise ValueError(
                    f"{len(fated) - done} of {len(fated)} fates name a draw twice: a prompt is given one fate"
                )

    def record_dropped(self, step: int, dropped: Mapping[str, str]) -> None:
        """Draws dropped at loop step `step`: draw id -> reason (a key of DROP_REASONS, maybe
        followed by ': ' and a detail), in one transaction. The draws must be recorded already."""
        if not dropped:
            return
        unknown = [r for r in dropped.values() if r.split(":", 1)[0] not in DROP_REASONS]
        if unknown:
            raise ConfigError(f"drop reason {unknown[0]!r} is none of {sorted(DROP_REASONS)}")
        missing = [i for i in dropped if not self._db.execute("SELECT 1 FROM draws WHERE id=?", (i,)).fetchone()]
        if missing:
            raise ConfigError(f"draw {missing[0]!r} is not in the trace {self.path}: record it first (record_draws)")
        rows = self._db.execute(
            f"SELECT id, step, task_id, domain FROM draws WHERE id IN ({','.join('?' * len(dropped))})", list(dropped)
        ).fetchall()
        self.record_draws(
            [
                DrawRecord(r["id"], r["step"], r["task_id"], r["domain"], None, "dropped", dropped[r["id"]], step)
                for r in rows
            ]
        )

    def draw_of_group(self, group_id: str) -> dict[str, Any] | None:
        """The draw the group `group_id` was made from (None: none recorded, or a trace from before
        draws were recorded)."""
        try:
            row = self._db.execute("SELECT * FROM draws WHERE group_id=?", (group_id,)).fetchone()
        except sqlite3.OperationalError:  # no draws table: a read-only trace of schema < 4
            return None
        return dict(row) if row else None

    def pending_draws(self) -> list[str]:
        """The ids of the draws with no fate yet (in flight), in draw order."""
        return [r[0] for r in self._db.execute("SELECT id FROM draws WHERE fate IS NULL ORDER BY rowid")]

    def pending_draw_records(self) -> list[DrawRecord]:
        """The draws with no fate yet (in flight), in draw order, as records (with the group bound last)."""
        rows = self._db.execute(
            "SELECT id, step, task_id, domain, group_id FROM draws WHERE fate IS NULL ORDER BY rowid"
        )
        return [DrawRecord(r[0], int(r[1]), r[2], r[3], r[4]) for r in rows]

    def accounting(self) -> Accounting:
        """What became of every draw, from the trace alone (`Accounting`)."""
        return accounting(self._db)

    def add_event(
        self, kind: str, message: str, step: int | None = None, domain: str | None = None, data: Any = None
    ) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO events (created_at, step, kind, domain, message, data) VALUES (?,?,?,?,?,?)",
                (time.time(), step, kind, domain, message, json.dumps(data or {}, default=str)),
            )

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]

    def get(self, rollout_id: str) -> dict[str, Any] | None:
        """The rollout with this id, else the one whose id starts with it; None when none
        does. A prefix that starts several ids ("3:1" starts "3:1/0" and "3:10/0") is a
        ConfigError naming some of them, never an arbitrary pick."""
        row = self._db.execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
        if row is not None:
            return _decode(row)
        pattern = rollout_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            "SELECT * FROM rollouts WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT 6", (pattern,)
        ).fetchall()
        if len(rows) > 1:
            ids = ", ".join(r["id"] for r in rows[:5])
            raise ConfigError(f"rollout id prefix {rollout_id!r} is ambiguous: it starts {ids}, ... (give more)")
        return _decode(rows[0]) if rows else None

    def recent(self, limit: int = 20, domain: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE domain=?", (domain,)) if domain else ("", ())
        rows = self._db.execute(f"SELECT * FROM rollouts {where} ORDER BY created_at DESC LIMIT ?", (*args, limit))
        return [_decode(r) for r in rows]

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE kind=?", (kind,)) if kind else ("", ())
        return [dict(r) for r in self._db.execute(f"SELECT * FROM events {where} ORDER BY id", args)]

    def domain_stats(self) -> list[dict[str, Any]]:
        """Per domain: rollouts, mean reward, pass rate, infra errors, truncations, consumed."""
        sql = """SELECT domain, COUNT(*) AS rollouts, AVG(reward) AS mean_reward, AVG(passed) AS pass_rate,
                 SUM(error_kind IS NOT NULL) AS errors, SUM(finish_reason='length') AS truncated,
                 SUM(train_step IS NOT NULL) AS consumed FROM rollouts GROUP BY domain ORDER BY domain"""
        return [dict(r) for r in self._db.execute(sql)]

    # ---- read queries (report, commands); every read of a trace goes through these ----

    @classmethod
    def read_only(cls, path: str | Path) -> TraceStore:
        """An existing trace opened for reading only: nothing is created, migrated or
        written (a report, or `posttrain trace` while another process trains). Raises
        ConfigError when `path` is not a file."""
        store = cls.__new__(cls)
        store.path = Path(path)
        if not store.path.is_file():
            raise ConfigError(f"no trace database at {str(store.path)!r}")
        store._db = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True, timeout=30.0, check_same_thread=False)
        store._db.row_factory = sqlite3.Row
        with readable(store.path):  # garbage in place of a database fails here, not in the first query
            store._db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return store

    def has(self, rollout_id: str) -> bool:
        """Whether a rollout with this id (or a unique-enough prefix of it) is stored."""
        return self.get(rollout_id) is not None

    def siblings(self, rollout: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The rollouts sampled for the same prompt in the same step as `rollout` (a row of
        `get`), itself included, in write order: id, reward and completion."""
        sql = (
            "SELECT id, reward, completion FROM rollouts WHERE group_id=? AND model_version=? AND task_id=? "
            "ORDER BY rowid"
        )
        args = (rollout["group_id"], rollout["model_version"], rollout["task_id"])
        return [dict(r) for r in self._db.execute(sql, args)]

    def outcomes(self) -> list[tuple[str, str | None, str | None]]:
        """(domain, sandbox status, infra-error kind) of every rollout that ran a program or
        hit an infra error; the status is None when the execution summary has none."""
        sql = (
            "SELECT domain, exec_result, error_kind FROM rollouts "
            "WHERE exec_result IS NOT NULL OR error_kind IS NOT NULL"
        )
        return [(r["domain"], _status(r["exec_result"]), r["error_kind"]) for r in self._db.execute(sql)]


def read_or(path: str | Path, query: Callable[[TraceStore], T], empty: T) -> T:
    """One query of an existing trace, read-only; `empty` when there is no trace at `path` or
    the query cannot run (a table missing, the file locked). A damaged file raises the
    `damaged` ConfigError."""
    if not Path(path).is_file():
        return empty
    store = TraceStore.read_only(path)  # garbage in place of a database raises here
    try:
        return query(store)
    except sqlite3.OperationalError:
        return empty
    except sqlite3.DatabaseError as exc:
        raise damaged(path, exc) from None
    finally:
        store.close()


def _status(exec_result: str | None) -> str | None:
    """The `status` of a stored execution summary (None when absent or unreadable)."""
    try:
        value = json.loads(exec_result) if exec_result else None
    except ValueError:
        return None
    status = value.get("status") if isinstance(value, dict) else None
    return str(status) if status else None


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for col in _JSON_COLUMNS:
        if out.get(col) is not None:
            out[col] = json.loads(out[col])
    return out
