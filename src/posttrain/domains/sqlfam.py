"""sql_*: text-to-SQL over a generated SQLite database per task.

Invariant: the database is a pure function of the task's reference (schema,
seed, rows), rebuilt in memory for every score; the model's query runs on a
connection that can only read (PRAGMA query_only, an authorizer that allows
SELECT, reads and functions and nothing else, a length limit) and is
interrupted by a progress handler after MAX_STEPS virtual-machine steps or
MAX_SECONDS, so a
query can neither change the data nor run forever. Reward is 1 exactly when
its result set equals the reference query's (as a multiset of rows, or as a
sequence when the reference orders; numbers rounded to 2 decimals).
"""

from __future__ import annotations

import random
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.domains._common import ANSWER_INSTRUCTION
from posttrain.domains.base import Budget, ProceduralDomain, extract_answer
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, Task

MAX_STEPS = 2_000_000
MAX_SECONDS = 2.0
MAX_ROWS = 10_000
MAX_LENGTH = 1_000_000
ROWS = {1: 12, 2: 30, 3: 80}

FIRST = [
    "Ada",
    "Ben",
    "Cleo",
    "Dev",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivo",
    "Jun",
    "Kai",
    "Lea",
    "Max",
    "Nia",
    "Oto",
    "Pia",
    "Quin",
    "Rui",
    "Sol",
    "Tao",
    "Uma",
    "Vic",
    "Wes",
    "Xia",
    "Yan",
    "Zoe",
]
LAST = [
    "Abe",
    "Baker",
    "Cruz",
    "Diaz",
    "Evans",
    "Fox",
    "Gray",
    "Hill",
    "Ito",
    "Jones",
    "Khan",
    "Lee",
    "Moss",
    "Nash",
    "Ortiz",
    "Park",
    "Quinn",
    "Ross",
    "Shaw",
    "Tran",
    "Ueda",
    "Vance",
    "Wu",
    "Young",
    "Zhou",
]
WORDS = [
    "Amber",
    "Birch",
    "Cobalt",
    "Dune",
    "Ember",
    "Fjord",
    "Granite",
    "Harbor",
    "Iris",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Maple",
    "Nova",
    "Onyx",
    "Pine",
    "Quartz",
    "Raven",
    "Sable",
    "Tide",
]
PLACES = ["Oslo", "Lima", "Pune", "Kyiv", "Lyon", "Perth", "Quito", "Cork", "Graz", "Nara"]


@dataclass(frozen=True)
class Schema:
    """A fact table with a label, a number and a year, and a dimension table it references."""

    key: str
    fact: str
    label: str
    num: str
    num_range: tuple[int, int]
    year: str
    fk: str
    dim: str
    dim_label: str
    dim_attr: str
    noun: str
    dim_noun: str
    attr_noun: str


SCHEMAS = {
    "company": Schema(
        "company",
        "employees",
        "name",
        "salary",
        (30_000, 150_000),
        "hire_year",
        "dept_id",
        "departments",
        "name",
        "city",
        "employee",
        "department",
        "city",
    ),
    "shop": Schema(
        "shop",
        "products",
        "name",
        "price",
        (2, 900),
        "release_year",
        "supplier_id",
        "suppliers",
        "name",
        "country",
        "product",
        "supplier",
        "country",
    ),
    "school": Schema(
        "school",
        "students",
        "name",
        "score",
        (0, 100),
        "enrol_year",
        "house_id",
        "houses",
        "name",
        "campus",
        "student",
        "house",
        "campus",
    ),
    "library": Schema(
        "library",
        "books",
        "title",
        "pages",
        (40, 1200),
        "pub_year",
        "author_id",
        "authors",
        "name",
        "nationality",
        "book",
        "author",
        "nationality",
    ),
}


def build_db(schema: Schema, seed: int, rows: int) -> sqlite3.Connection:
    """The task's database, in memory, deterministic in (schema, seed, rows)."""
    rng = random.Random(f"sql:{schema.key}:{seed}:{rows}")
    conn = sqlite3.connect(":memory:")
    s = schema
    conn.execute(
        f"CREATE TABLE {s.dim} (id INTEGER PRIMARY KEY, {s.dim_label} TEXT NOT NULL, {s.dim_attr} TEXT NOT NULL)"
    )
    conn.execute(
        f"CREATE TABLE {s.fact} (id INTEGER PRIMARY KEY, {s.label} TEXT NOT NULL, {s.fk} INTEGER REFERENCES "
        f"{s.dim}(id), "
        f"{s.num} INTEGER NOT NULL, {s.year} INTEGER NOT NULL)"
    )
    n_dim = max(3, rows // 6)
    dims = rng.sample(WORDS, min(n_dim, len(WORDS)))
    conn.executemany(
        f"INSERT INTO {s.dim} VALUES (?, ?, ?)",
        [(i + 1, name, rng.choice(PLACES[: 3 + rows // 20])) for i, name in enumerate(dims)],
    )
    labels = set()
    while len(labels) < rows:
        labels.add(
            f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            if s.label == "name"
            else f"{rng.choice(WORDS)} {rng.choice(LAST)}"
        )
    conn.executemany(
        f"INSERT INTO {s.fact} VALUES (?, ?, ?, ?, ?)",
        [
            (i + 1, lab, rng.randint(1, len(dims)), rng.randint(*s.num_range), rng.randint(2000, 2024))
            for i, lab in enumerate(_shuffled(sorted(labels), rng))
        ],
    )
    conn.commit()
    return conn


def _shuffled(items: list[str], rng: random.Random) -> list[str]:
    rng.shuffle(items)  # from a sorted list: never from a set's (hash-seed dependent) order
    return items


def ddl(conn: sqlite3.Connection) -> str:
    return "\n".join(r[0] + ";" for r in conn.execute("SELECT sql FROM sqlite_master WHERE type='table' ORDER BY name"))


def preview(conn: sqlite3.Connection, table: str, n: int = 3) -> str:
    cur = conn.execute(f"SELECT * FROM {table} ORDER BY id LIMIT {n}")
    cols = [c[0] for c in cur.description]
    return "\n".join([f"-- {table}: " + " | ".join(cols)] + ["-- " + " | ".join(map(str, r)) for r in cur.fetchall()])


# ---- the read-only runner --------------------------------------------------------

_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


class QueryRejected(Exception):
    """The model's query could not run (not a SELECT, error, timeout, too large)."""


def run_readonly(conn: sqlite3.Connection, sql: str) -> list[tuple]:
    """Rows of one read-only query, or QueryRejected with the reason."""
    steps = {"n": 0}
    deadline = time.monotonic() + MAX_SECONDS

    def progress() -> int:
        steps["n"] += 1
        return 1 if steps["n"] * 1000 > MAX_STEPS or time.monotonic() > deadline else 0

    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_LENGTH)
    conn.set_authorizer(_authorize)
    conn.set_progress_handler(progress, 1000)
    try:
        cur = conn.execute(sql)
        rows = cur.fetchmany(MAX_ROWS + 1)
    except sqlite3.OperationalError as exc:
        raise QueryRejected("timeout" if "interrupt" in str(exc) else f"error: {exc}") from None
    except (sqlite3.Error, ValueError, OverflowError, MemoryError) as exc:
        raise QueryRejected(f"error: {exc}") from None
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_authorizer(None)
    if len(rows) > MAX_ROWS:
        raise QueryRejected(f"more than {MAX_ROWS} rows")
    return rows


def _norm_row(row: tuple) -> tuple:
    return tuple(round(float(v), 2) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in row)


def same_result(gold: list[tuple], got: list[tuple], ordered: bool) -> bool:
    g, r = [_norm_row(x) for x in gold], [_norm_row(x) for x in got]
    if ordered:
        return g == r
    return sorted(g, key=repr) == sorted(r, key=repr)


def extract_sql(text: str) -> str:
    body = extract_answer(text)
    fenced = re.findall(r"```(?:sql|SQL)?\s*(.*?)```", body, re.DOTALL)
    return (fenced[-1] if fenced else body).strip().rstrip(";").strip()


class SqlVerifier:
    """Runs the model's query read-only and compares result sets with the reference query's."""

    name = "sql_result_set"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        ref = task.reference
        conn = build_db(SCHEMAS[ref["schema"]], ref["seed"], ref["rows"])
        try:
            gold = conn.execute(ref["sql"]).fetchall()
            sql = extract_sql(episode.completion)
            if not sql:
                return Score(0.0, {"outcome": 0.0, "runs": 0.0}, False, "no query")
            try:
                got = run_readonly(conn, sql)
            except QueryRejected as exc:
                return Score(0.0, {"outcome": 0.0, "runs": 0.0}, False, str(exc))
        finally:
            conn.close()
        ok = same_result(gold, got, ref["ordered"])
        return Score(float(ok), {"outcome": float(ok), "runs": 1.0}, ok, "" if ok else "different result set")


# ---- question templates: (schema, conn, rng, difficulty) -> (question, sql, ordered) ----

Template = Callable[[Schema, sqlite3.Connection, random.Random, int], tuple[str, str, bool]]


def _pick(conn: sqlite3.Connection, sql: str, rng: random.Random) -> Any:
    return rng.choice([r[0] for r in conn.execute(sql).fetchall()])


def _threshold(s: Schema, conn: sqlite3.Connection, rng: random.Random) -> int:
    values = sorted(r[0] for r in conn.execute(f"SELECT {s.num} FROM {s.fact}"))
    return values[rng.randint(len(values) // 4, 3 * len(values) // 4)]


def t_filter(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    x = _threshold(s, conn, rng)
    if d == 1:
        return (
            f"List the {s.label} of every {s.noun} whose {s.num} is greater than {x}.",
            f"SELECT {s.label} FROM {s.fact} WHERE {s.num} > {x}",
            False,
        )
    y = rng.randint(2005, 2020)
    return (
        f"List the {s.label} and {s.num} of every {s.noun} whose {s.num} is at least {x} and whose {s.year} is {y} or "
        "later.",
        f"SELECT {s.label}, {s.num} FROM {s.fact} WHERE {s.num} >= {x} AND {s.year} >= {y}",
        False,
    )


def t_count(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    name = _pick(conn, f"SELECT {s.dim_label} FROM {s.dim}", rng)
    where = f"WHERE d.{s.dim_label} = '{name}'"
    q = f"How many {s.noun}s belong to the {s.dim_noun} named {name}?"
    if d >= 2:
        x = _threshold(s, conn, rng)
        where += f" AND f.{s.num} < {x}"
        q = f"How many {s.noun}s of the {s.dim_noun} named {name} have a {s.num} below {x}?"
    return q, f"SELECT COUNT(*) FROM {s.fact} f JOIN {s.dim} d ON f.{s.fk} = d.id {where}", False


def t_aggregate(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    name = _pick(conn, f"SELECT d.{s.dim_label} FROM {s.dim} d JOIN {s.fact} f ON f.{s.fk} = d.id", rng)
    fn, word = rng.choice([("AVG", "average"), ("MAX", "largest"), ("MIN", "smallest"), ("SUM", "total")][: 1 + d])
    return (
        f"What is the {word} {s.num} of the {s.noun}s of the {s.dim_noun} named {name}? (Round averages to 2 "
        "decimals.)",
        f"SELECT ROUND({fn}(f.{s.num}), 2) FROM {s.fact} f JOIN {s.dim} d ON f.{s.fk} = d.id WHERE d.{s.dim_label} = "
        f"'{name}'",
        False,
    )


def t_group_by(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    if d == 1:
        return (
            f"For each {s.dim_noun} that has {s.noun}s, give its {s.dim_label} and its number of {s.noun}s.",
            f"SELECT d.{s.dim_label}, COUNT(*) FROM {s.fact} f JOIN {s.dim} d ON f.{s.fk} = d.id GROUP BY d.id",
            False,
        )
    return (
        f"For each {s.dim_noun} that has {s.noun}s, give its {s.dim_label} and the average {s.num} of its {s.noun}s "
        "rounded to 2 decimals.",
        f"SELECT d.{s.dim_label}, ROUND(AVG(f.{s.num}), 2) FROM {s.fact} f JOIN {s.dim} d ON f.{s.fk} = d.id GROUP BY "
        "d.id",
        False,
    )


def t_join(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    attr = _pick(conn, f"SELECT d.{s.dim_attr} FROM {s.dim} d JOIN {s.fact} f ON f.{s.fk} = d.id", rng)
    sql = f"SELECT f.{s.label} FROM {s.fact} f JOIN {s.dim} d ON f.{s.fk} = d.id WHERE d.{s.dim_attr} = '{attr}'"
    q = f"List the {s.label} of every {s.noun} whose {s.dim_noun}'s {s.attr_noun} is {attr}."
    if d >= 2:
        y = rng.randint(2004, 2018)
        sql += f" AND f.{s.year} < {y}"
        q = (
            f"List the {s.label} of every {s.noun} whose {s.dim_noun}'s {s.attr_noun} is {attr} and whose {s.year} is "
            f"before {y}."
        )
    return q, sql, False


def t_top_k(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    k = rng.randint(2, 2 + 2 * d)
    order, word = rng.choice([("DESC", "highest"), ("ASC", "lowest")])
    return (
        f"List the {s.label} of the {k} {s.noun}s with the {word} {s.num}, in that order (break ties by {s.label} "
        "ascending).",
        f"SELECT {s.label} FROM {s.fact} ORDER BY {s.num} {order}, {s.label} ASC LIMIT {k}",
        True,
    )


def t_having(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    counts = sorted(r[0] for r in conn.execute(f"SELECT COUNT(*) FROM {s.fact} GROUP BY {s.fk}"))
    n = counts[rng.randint(0, len(counts) - 1)] - 1
    return (
        f"List the {s.dim_label} of every {s.dim_noun} with more than {n} {s.noun}s.",
        f"SELECT d.{s.dim_label} FROM {s.fact} f JOIN {s.dim} d ON f.{s.fk} = d.id GROUP BY d.id HAVING COUNT(*) > {n}",
        False,
    )


def t_above_average(s: Schema, conn: sqlite3.Connection, rng: random.Random, d: int) -> tuple[str, str, bool]:
    if d == 1:
        return (
            f"List the {s.label} of every {s.noun} whose {s.num} is above the average {s.num} of all {s.noun}s.",
            f"SELECT {s.label} FROM {s.fact} WHERE {s.num} > (SELECT AVG({s.num}) FROM {s.fact})",
            False,
        )
    return (
        f"List the {s.label} of every {s.noun} whose {s.num} is above the average {s.num} of its own {s.dim_noun}.",
        f"SELECT f.{s.label} FROM {s.fact} f WHERE f.{s.num} > (SELECT AVG(g.{s.num}) FROM {s.fact} g WHERE g.{s.fk} = "
        f"f.{s.fk})",
        False,
    )


TEMPLATES: dict[str, tuple[Template, str]] = {
    "filter": (t_filter, "filter rows by a condition"),
    "count": (t_count, "count with a join"),
    "aggregate": (t_aggregate, "aggregate over a group"),
    "group_by": (t_group_by, "group by with counts or averages"),
    "join": (t_join, "join and filter on the other table"),
    "top_k": (t_top_k, "ordered top-k"),
    "having": (t_having, "group by with HAVING"),
    "above_average": (t_above_average, "correlated subquery"),
}


class SqlDomain(ProceduralDomain):
    category = "sql"
    levels = 3
    budget = Budget(tokens=160)

    def __init__(self, template: str, schema: Schema) -> None:
        self.name = f"sql_{template}_{schema.key}"
        self.template, self.schema = TEMPLATES[template][0], schema
        self.description = f"{TEMPLATES[template][1]} on a generated {schema.key} database"
        self.verifier = SqlVerifier()

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:
        rows = ROWS[difficulty]
        while True:  # a question whose answer is empty or NULL cannot tell a right query from a wrong one
            seed = rng.getrandbits(32)
            conn = build_db(self.schema, seed, rows)
            question, sql, ordered = self.template(self.schema, conn, rng, difficulty)
            result = conn.execute(sql).fetchall()
            if result and all(v is not None for row in result for v in row):
                break
            conn.close()
        try:
            prompt = (
                "SQLite "
                f"database:\n{ddl(conn)}\n{preview(conn, self.schema.dim)}\n{preview(conn, self.schema.fact)}\n\n"
                f"Write one SQLite SELECT query that answers: {question}\n{ANSWER_INSTRUCTION}"
            )
        finally:
            conn.close()
        return prompt, {"schema": self.schema.key, "seed": seed, "rows": rows, "sql": sql, "ordered": ordered}

    def gold(self, task: Task) -> str:
        return f"<answer>{task.reference['sql']}</answer>"

    def wrong(self, task: Task) -> str:
        s = SCHEMAS[task.reference["schema"]]
        return f"<answer>SELECT {s.label} FROM {s.fact} WHERE id < 0</answer>"

    def cheats(self, task: Task) -> list[str]:
        """Whole tables, writes, several statements, schema queries, and the gold's rows
        as text (a string never equals a number): never accepted."""
        s = SCHEMAS[task.reference["schema"]]
        return [
            f"<answer>SELECT * FROM {s.fact}</answer>",
            f"<answer>DELETE FROM {s.fact}</answer>",
            f"<answer>SELECT 1; {task.reference['sql']}</answer>",
            "<answer>SELECT sql FROM sqlite_master</answer>",
            "",
            *_as_text(task),
        ]


def _as_text(task: Task) -> list[str]:
    """The gold query with every column cast to TEXT (none when no column holds a number)."""
    ref = task.reference
    conn = build_db(SCHEMAS[ref["schema"]], ref["seed"], ref["rows"])
    try:
        cur = conn.execute(ref["sql"])
        rows, width = cur.fetchall(), len(cur.description)
    finally:
        conn.close()
    if not any(isinstance(v, (int, float)) for row in rows for v in row):
        return []
    cols = ", ".join(f"c{i}" for i in range(width))
    casts = ", ".join(f"CAST(c{i} AS TEXT)" for i in range(width))
    return [f"<answer>WITH g({cols}) AS ({ref['sql']}) SELECT {casts} FROM g</answer>"]


for _template in TEMPLATES:
    for _schema in SCHEMAS.values():
        register(SqlDomain(_template, _schema))
