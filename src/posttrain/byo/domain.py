"""A task file or local data set as a Domain.

Invariant: train and held-out never share a row and never share a prompt: a
row's split comes from its split column (or `datasets` split name) or, without
one, from a hash of its normalised prompt (`split_of`), and `build_index`
refuses a file whose split column puts one prompt in both; two rows with the
same id are an error naming both lines (a row's id is its `fields.id` column,
else its column named `id`, else its row number). `sample(index,
split, level)` is a pure function of the file and its arguments: index i of a
(split, level) pool is row `order[i mod n]` of a permutation seeded by (name,
split, level, epoch), so the pool's seeded base index makes the order a
function of the run seed. The index holds only locators and two small ints
per row; rows are read back one at a time.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from posttrain.byo.sources import RawRow, Reader, json_cell, open_source, text_of
from posttrain.configs.byo import SourceConfig, VerifierSpec
from posttrain.domains.base import Budget, Domain, stable_hash
from posttrain.domains.hygiene import normalise
from posttrain.errors import TaskError
from posttrain.types import Message, Split, Task, TaskMeta

ROLES = ("system", "user", "assistant", "tool")
MAX_REPORTED = 20


@dataclass(frozen=True)
class RowRef:
    """A row's reference: the answer column, the metadata columns, the row's declared cheats and
    where it came from. `str()` is the answer, so generic tools that print a reference still work."""

    answer: Any
    metadata: Mapping[str, Any] = field(default_factory=dict)
    cheats: tuple[str, ...] = ()
    where: str = ""

    def __str__(self) -> str:
        return text_of(self.answer)


@dataclass(frozen=True)
class Row:
    """A parsed row: its messages, reference, split, raw difficulty value and id."""

    line: int
    messages: tuple[Message, ...]
    ref: RowRef
    split: str | None
    level_value: int | None
    row_id: str
    priority: int | None = None
    """The row's admission priority (`fields.priority`; None: the domain's)."""
    id_column: str | None = None
    """The column its id is read from (None: the id is the row number)."""


@dataclass
class Index:
    """Per row: its locator; per (split, level): the positions of its rows."""

    locs: array = field(default_factory=lambda: array("q"))
    lines: array = field(default_factory=lambda: array("q"))
    pools: dict[tuple[str, int], array] = field(default_factory=dict)
    levels: tuple[int, ...] = (1,)
    errors: list[tuple[int, str]] = field(default_factory=list)
    skipped: int = 0
    overlap: int = 0

    def size(self, split: str, level: int | None = None) -> int:
        return sum(len(v) for (s, lv), v in self.pools.items() if s == split and (level is None or lv == level))


def parse_row(raw: RawRow, source: SourceConfig, unit: str) -> Row:
    """The row's fields by the mapping; a missing or ill-typed field raises ValueError."""
    data, f = raw.data or {}, source.fields
    missing = [c for c in [f.prompt or f.messages, f.answer] if c not in data]
    if missing:
        raise ValueError(
            f"missing field {', '.join(map(repr, missing))} (has {', '.join(map(repr, sorted(data))) or 'none'})"
        )
    messages = _messages(data, source)
    answer = json_cell(data[f.answer], f.answer)
    if answer is None or answer == "":
        raise ValueError(f"empty answer field {f.answer!r}")
    level = None
    if f.difficulty:
        value = data.get(f.difficulty)
        try:
            level = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"difficulty field {f.difficulty!r} must be an integer, got {value!r}") from None
    cheats = tuple(source.cheats)
    if f.cheats and data.get(f.cheats) not in (None, ""):
        value = json_cell(data[f.cheats], f.cheats)
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise ValueError(f"cheats field {f.cheats!r} must be a list of strings")
        cheats += tuple(value)
    meta = {c: json_cell(data.get(c), c) for c in f.metadata}
    split = _split(data, raw, source)
    id_col = f.id_column(data)
    row_id = text_of(data[id_col]) if id_col and data.get(id_col) not in (None, "") else str(raw.line)
    ref = RowRef(answer, meta, cheats, f"{source.path}:{unit} {raw.line}")
    return Row(raw.line, messages, ref, split, level, row_id, _priority(data, f.priority), id_col)


def _priority(data: dict[str, Any], column: str | None) -> int | None:
    """The row's priority cell as an integer (None: no column, or an empty cell)."""
    if not column or data.get(column) in (None, ""):
        return None
    value = data[column]
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"priority field {column!r} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"priority field {column!r} must be an integer, got {value!r}") from None


def _messages(data: dict[str, Any], source: SourceConfig) -> tuple[Message, ...]:
    f = source.fields
    system = data.get(f.system) if f.system else None
    system = system or source.system_prompt
    head = (Message("system", text_of(system)),) if system else ()
    if f.prompt:
        prompt = data[f.prompt]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"prompt field {f.prompt!r} must be a non-empty string")
        return head + (Message("user", source.template.replace("{prompt}", prompt)),)
    chat = json_cell(data[f.messages], f.messages)
    if not isinstance(chat, list) or not chat:
        raise ValueError(f"messages field {f.messages!r} must be a non-empty list of {{role, content}}")
    out = []
    for i, m in enumerate(chat):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be {{role: one of {'/'.join(ROLES)}, content: string}}, got {m!r}")
        out.append(Message(m["role"], m["content"]))
    if out[-1].role == "assistant":
        raise ValueError("messages must not end with an assistant message (the model writes it)")
    has_system = out[0].role == "system"
    return (() if has_system else head) + tuple(out)


def _split(data: dict[str, Any], raw: RawRow, source: SourceConfig) -> str | None:
    """'train', 'eval', 'hash' (no split given: decided by the prompt's hash), or None for a
    row whose split value is neither train nor held-out (it is skipped)."""
    f = source.fields
    value = data.get(f.split) if f.split else raw.split
    if value is None and not f.split:
        return "hash"
    text = str(value).strip().lower()
    if text in (v.lower() for v in source.train_values):
        return "train"
    if text in (v.lower() for v in source.eval_values):
        return "eval"
    return None


def prompt_key_of(messages: tuple[Message, ...]) -> str:
    return normalise("\n".join(m.content for m in messages))


def hash_split(name: str, key: str, eval_percent: int) -> Split:
    return "eval" if stable_hash("split", name, key) % 100 < eval_percent else "train"


def build_index(name: str, reader: Reader, source: SourceConfig) -> Index:
    """One streaming pass: every row's split and level; bad rows are collected with their line."""
    index = Index()
    rows: list[tuple[int, str, int | None]] = []
    prompt_split: dict[str, str] = {}
    id_lines: dict[int, tuple[int, int]] = {}  # a hash of each row id -> (line, locator) of its first row
    conflicts = 0
    for raw in reader.scan():
        if raw.error is not None:
            index.errors.append((raw.line, raw.error))
            continue
        try:
            row = parse_row(raw, source, reader.unit)
        except ValueError as exc:
            index.errors.append((raw.line, str(exc)))
            continue
        first = _first_with_id(id_lines, row, raw, reader) if row.id_column else None
        if first is not None:
            index.errors.append((raw.line, f"duplicate id {row.row_id!r} (first at {reader.unit} {first})"))
            continue
        if row.split is None:
            index.skipped += 1
            continue
        key = prompt_key_of(row.messages)
        split = hash_split(name, key, source.eval_percent) if row.split == "hash" else row.split
        h = f"{stable_hash(key):016x}"
        if prompt_split.setdefault(h, split) != split:
            conflicts += 1
            continue  # a prompt already in the other split: never let it cross over
        index.locs.append(raw.loc)
        index.lines.append(raw.line)
        rows.append((len(index.locs) - 1, split, row.level_value))
    index.overlap = conflicts
    values = sorted({lv for _, _, lv in rows if lv is not None}) or [1]
    rank = {v: i + 1 for i, v in enumerate(values)}
    index.levels = tuple(range(1, len(values) + 1))
    for pos, split, lv in rows:
        index.pools.setdefault((split, rank[lv] if lv is not None else 1), array("q")).append(pos)
    return index


def _first_with_id(seen: dict[int, tuple[int, int]], row: Row, raw: RawRow, reader: Reader) -> int | None:
    """The line of an earlier row with `row`'s id, else None (and `row` is remembered). Ids are
    kept as 64-bit hashes; a hash seen before is confirmed by reading that row's id again."""
    key = stable_hash("id", row.row_id)
    first = seen.setdefault(key, (raw.line, raw.loc))
    if first == (raw.line, raw.loc):
        return None
    earlier = reader.row(first[1])
    return first[0] if text_of(earlier.get(row.id_column)) == row.row_id else None


class SourceDomain(Domain):
    """Rows of a file or data set, scored by a verifier chosen by name."""

    version = "1"

    def __init__(
        self,
        name: str,
        source: SourceConfig,
        verifier: VerifierSpec | None = None,
        base_dir: str | None = None,
        origin: str = "",
    ) -> None:
        from posttrain.byo.verifiers import build_verifier

        self.name = name
        self.source = source
        self.category = source.category
        self.path, self.reader = open_source(source, base_dir)
        self.origin = origin or f"file {self.path}"
        self.description = source.description or f"rows of {self.path}"
        self.budget = Budget(tokens=source.max_tokens)
        self.spec = verifier or VerifierSpec(name="exact")
        self.verifier = build_verifier(self.spec)
        self._index: Index | None = None

    # ---- the index --------------------------------------------------------
    @property
    def index(self) -> Index:
        if self._index is None:
            self._index = build_index(self.name, self.reader, self.source)
        return self._index

    def check(self) -> None:
        """Raise TaskError naming the first bad rows (with their line) or an empty split."""
        idx = self.index
        if idx.errors:
            shown = "; ".join(f"{self.reader.unit} {line}: {msg}" for line, msg in idx.errors[:5])
            more = f" (and {len(idx.errors) - 5} more; see posttrain tasks validate)" if len(idx.errors) > 5 else ""
            raise TaskError(f"{self.path}: {len(idx.errors)} bad rows: {shown}{more}")
        for split in ("train", "eval"):
            if not idx.size(split):
                raise TaskError(
                    f"{self.path}: no {split} rows (held-out comes from the split column or "
                    f"{self.source.eval_percent}% by hash; a file needs rows of both)"
                )

    @property
    def levels(self) -> int:  # type: ignore[override]
        return len(self.index.levels)

    @property
    def taskset_version(self) -> str:
        stamp = (
            self.name,
            self.version,
            self.source.model_dump_json(),
            self.spec.model_dump_json(),
            len(self.index.locs),
        )
        return f"{stable_hash(*stamp):016x}"[:12]

    def size(self, split: Split, difficulty: int | None = None) -> int:
        """Distinct rows of `split` (at `difficulty`, when given)."""
        return self.index.size(split, difficulty)

    # ---- sampling ---------------------------------------------------------
    def _pool(self, split: Split, difficulty: int) -> array:
        idx = self.index
        pool = idx.pools.get((split, difficulty))
        if pool is None:  # no row of this level in this split: the split's rows of every level
            pool = _merged(idx, split)
        if not pool:
            raise TaskError(f"{self.name}: {self.path} has no {split} rows")
        return pool

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        pool = self._pool(split, difficulty)
        epoch, i = divmod(index, len(pool))
        pos = pool[_order(stable_hash(self.name, split, difficulty, epoch, len(pool)), len(pool))[i]]
        return self.task_at(pos, split, difficulty)

    def task_at(self, pos: int, split: Split, difficulty: int) -> Task:
        """The task of indexed row `pos`."""
        loc = self.index.locs[pos]
        raw = RawRow(loc, self.index.lines[pos], self.reader.row(loc))
        row = parse_row(raw, self.source, self.reader.unit)
        return Task(
            id=f"{self.name}:{row.row_id}",
            domain=self.name,
            prompt=row.messages,
            reference=row.ref,
            meta=TaskMeta(
                split=split,
                difficulty=difficulty,
                source=f"file:{self.path}",
                taskset_version=self.taskset_version,
                priority=row.priority,
            ),
        )

    # ---- contract ---------------------------------------------------------
    def gold(self, task: Task) -> str:
        """The verifier's gold completion for the row, else the reference answer as text (a
        verifier that cannot build one, e.g. `code` without a `solution` column)."""
        got = self.declared_gold(task)
        return got if got is not None else str(task.reference)

    def declared_gold(self, task: Task) -> str | None:
        """The verifier's own gold completion, or None when it has none for this row."""
        fn = getattr(self.verifier, "gold", None)
        return fn(task) if fn is not None else str(task.reference)

    def wrong(self, task: Task) -> str:
        fn = getattr(self.verifier, "wrong", None)
        return fn(task) if fn else "<answer>\u2205</answer>"

    def cheats(self, task: Task) -> list[str]:
        """The row's and the file's declared cheats; programmatic verifiers also get the empty answer."""
        declared = list(task.reference.cheats)
        return declared + ([""] if getattr(self.verifier, "programmatic", False) else [])


def _merged(idx: Index, split: str) -> array:
    out = array("q")
    for (s, _), v in sorted(idx.pools.items()):
        if s == split:
            out.extend(v)
    return out


@lru_cache(maxsize=16)
def _order(seed: int, n: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return tuple(order)
