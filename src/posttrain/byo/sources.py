"""Row readers of task files and local data sets, streamed.

Invariant: no reader loads its file whole. `scan()` streams every row once,
each with a locator (a byte offset for JSONL and CSV, a row number for
Parquet and `datasets`) and the line a person would look at; `row(loc)`
reads that one row again (a seek and one record, or one cached Parquet row
group). A row that does not parse is yielded with its error and line, never
skipped in silence: a JSON line nested deeper than MAX_DEPTH is refused before
the parser recurses, and bytes that are not UTF-8 are an error (JSONL and CSV),
never replaced. A row longer than `max_row_bytes` (a JSONL line, a CSV record;
the characters of a Parquet or `datasets` row's text) is refused by its line
before it is parsed, and a JSONL or CSV reader never holds more than that of one
line; a string holding a lone surrogate (a JSON escape such as "\\ud800" with no
pair, which no encoder can write) is refused naming its field (`lone_surrogate`).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from posttrain.configs import nests_deeper
from posttrain.configs.byo import SourceConfig, resolve_format
from posttrain.errors import TaskError

DATA_EXTRA = "pip install 'posttrain[data]'"
MAX_ROW_BYTES = 1 << 20
"""The default bound on one row (`source.max_row_bytes`)."""
DRAIN = 1 << 20
"""Bytes read at a time while skipping the rest of a line over the bound."""
MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a JSON row may have."""


@dataclass(frozen=True)
class RawRow:
    """One row as read: its locator, the line (or row number) to report, the
    columns, or the error that kept it from parsing; `split` is the split a
    `datasets` dictionary put it in (None elsewhere)."""

    loc: int
    line: int
    data: dict[str, Any] | None
    error: str | None = None
    split: str | None = None


class JsonlReader:
    """One JSON object per line; blank lines are skipped."""

    unit = "line"

    def __init__(self, path: str, max_row_bytes: int = MAX_ROW_BYTES) -> None:
        self.path, self.max_row_bytes = path, max_row_bytes

    def scan(self) -> Iterator[RawRow]:
        with open(self.path, "rb") as fh:
            line, offset = 0, 0
            while raw := fh.readline(self.max_row_bytes + 1):
                line += 1
                loc, size = offset, len(raw)
                if size > self.max_row_bytes and not raw.endswith(b"\n"):  # over the bound: skip the rest
                    size += _drain(fh)
                    offset += size
                    yield RawRow(loc, line, None, _too_long(size, self.max_row_bytes))
                    continue
                offset += size
                if not raw.strip():
                    continue
                yield self._parse(raw, loc, line)

    def _parse(self, raw: bytes, loc: int, line: int) -> RawRow:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return RawRow(loc, line, None, f"not valid UTF-8 at byte {exc.start} of the line")
        if nests_deeper(text, MAX_DEPTH):
            return RawRow(loc, line, None, f"JSON nested deeper than {MAX_DEPTH} levels")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return RawRow(loc, line, None, f"not valid JSON: {exc}")
        if not isinstance(data, dict):
            return RawRow(loc, line, None, f"expected a JSON object, got {type(data).__name__}")
        where = lone_surrogate(data)
        if where is not None:
            return RawRow(loc, line, None, where)
        return RawRow(loc, line, data)

    def row(self, loc: int) -> dict[str, Any]:
        with open(self.path, "rb") as fh:
            fh.seek(loc)
            got = self._parse(fh.readline(self.max_row_bytes + 1), loc, 0)
        if got.data is None:
            raise TaskError(f"{self.path}: row at byte {loc} no longer parses ({got.error}); was the file changed?")
        return got.data


def _drain(fh: Any) -> int:
    """Read past the rest of the current line, DRAIN bytes at a time; the bytes skipped."""
    skipped = 0
    while chunk := fh.readline(DRAIN):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _too_long(size: int, bound: int, unit: str = "bytes") -> str:
    return f"row too long: {size:,} {unit}, over the bound of {bound:,} per row; refused unparsed"


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """Why `value` (a parsed row, cell or message list) is not text, naming the field of the first
    string holding a lone surrogate (U+D800..U+DFFF alone, from a JSON escape), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            code = ord(value[exc.start])
            return f"field {where or 'value'!r} holds a lone surrogate \\u{code:04x} at character {exc.start}: not text"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        name = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and lone_surrogate(key) is not None:
            return f"a key of {where or 'the row'!r} holds a lone surrogate: not text"
        found = lone_surrogate(item, name)
        if found is not None:
            return found
    return None


def text_size(value: Any, bound: int) -> int:
    """The characters of `value`'s strings (keys included, 8 per other scalar), counted up to
    just past `bound`."""
    total = 0
    stack = [value]
    while stack and total <= bound:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += sum(len(str(k)) for k in v)
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        else:
            total += 8
    return total


class _Lines:
    """Line iterator over a binary file that remembers where each line began."""

    def __init__(self, fh: Any, max_line: int = MAX_ROW_BYTES) -> None:
        self.fh, self.offset, self.line, self.starts = fh, fh.tell(), 0, []
        self.max_line = max_line
        self.bad: list[tuple[int, int]] = []
        """(line, byte within it) of each line read that is not UTF-8 (its text has U+FFFD in place)."""
        self.over = 0
        """Bytes of the record being read, while one of its lines is over `max_line` (0: none)."""

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self.fh.readline(self.max_line + 1)
        if not raw:
            raise StopIteration
        self.starts.append((self.offset, self.line + 1))
        if len(raw) > self.max_line and not raw.endswith(b"\n"):  # over the bound: skipped, never held
            size = len(raw) + _drain(self.fh)
            self.offset += size
            self.line += 1
            self.over += size
            return "\n"
        self.offset += len(raw)
        self.line += 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.bad.append((self.line, exc.start))
            return raw.decode("utf-8", "replace")


class CsvReader:
    """A header row, then one record per row (quoted fields may span lines); values are strings."""

    unit = "line"

    def __init__(self, path: str, max_row_bytes: int = MAX_ROW_BYTES) -> None:
        self.path, self.max_row_bytes = path, max_row_bytes
        with open(path, "rb") as fh:
            lines = _Lines(fh, max_row_bytes)
            try:
                self.header = next(csv.reader(lines))
            except StopIteration:
                raise TaskError(f"{path}: empty CSV file (no header row)") from None
            if lines.bad:
                line, at = lines.bad[0]
                raise TaskError(f"{path}: line {line}: the header is not valid UTF-8 (byte {at} of the line)")
            self.data_start = lines.offset
        if len(set(self.header)) != len(self.header):
            raise TaskError(f"{path}: line 1: duplicate column names in the header {self.header}")

    def scan(self) -> Iterator[RawRow]:
        with open(self.path, "rb") as fh:
            fh.seek(self.data_start)
            lines = _Lines(fh, self.max_row_bytes)
            lines.line = 1
            reader = csv.reader(lines)
            while True:
                lines.starts.clear()
                lines.bad.clear()
                lines.over = 0
                try:
                    with _field_limit(self.max_row_bytes):
                        record = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    loc, line = lines.starts[0] if lines.starts else (lines.offset, lines.line)
                    yield RawRow(loc, line, None, f"malformed CSV: {exc}")
                    continue
                loc, line = lines.starts[0]
                size = lines.over or sum(len(f) for f in record)
                if size > self.max_row_bytes:
                    yield RawRow(loc, line, None, _too_long(size, self.max_row_bytes))
                    continue
                if lines.bad:
                    yield RawRow(loc, line, None, f"not valid UTF-8 (line {lines.bad[0][0]}, byte {lines.bad[0][1]})")
                    continue
                if not record:
                    continue
                yield self._make(record, loc, line)

    def _make(self, record: list[str], loc: int, line: int) -> RawRow:
        if len(record) != len(self.header):
            return RawRow(loc, line, None, f"{len(record)} fields, the header has {len(self.header)}")
        return RawRow(loc, line, dict(zip(self.header, record)))

    def row(self, loc: int) -> dict[str, Any]:
        with open(self.path, "rb") as fh:
            fh.seek(loc)
            with _field_limit(self.max_row_bytes):
                record = next(csv.reader(_Lines(fh, self.max_row_bytes)))
        got = self._make(record, loc, 0)
        if got.data is None:
            raise TaskError(f"{self.path}: row at byte {loc} no longer parses ({got.error}); was the file changed?")
        return got.data


class ParquetReader:
    """Row groups streamed through pyarrow; `row` reads (and caches a few) row groups."""

    unit = "row"

    def __init__(self, path: str, columns: list[str], max_row_bytes: int = MAX_ROW_BYTES) -> None:
        self.max_row_bytes = max_row_bytes
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise TaskError(f"{path}: reading Parquet needs pyarrow: {DATA_EXTRA}") from None
        try:
            self.file = pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise TaskError(f"{path}: not a readable Parquet file: {exc}") from None
        names = set(self.file.schema_arrow.names)
        self.columns = [c for c in dict.fromkeys(columns) if c in names]
        meta = self.file.metadata
        self.starts = [0]
        for g in range(meta.num_row_groups):
            self.starts.append(self.starts[-1] + meta.row_group(g).num_rows)
        self._cache: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()

    def scan(self) -> Iterator[RawRow]:
        n = 0
        for g in range(self.file.metadata.num_row_groups):
            for data in self.file.read_row_group(g, columns=self.columns).to_pylist():
                yield _checked(RawRow(n, n + 1, data), self.max_row_bytes)
                n += 1

    def row(self, loc: int) -> dict[str, Any]:
        import bisect

        g = bisect.bisect_right(self.starts, loc) - 1
        rows = self._cache.get(g)
        if rows is None:
            rows = self.file.read_row_group(g, columns=self.columns).to_pylist()
            self._cache[g] = rows
            while len(self._cache) > 4:
                self._cache.popitem(last=False)
        self._cache.move_to_end(g)
        return rows[loc - self.starts[g]]


class DatasetsReader:
    """A directory saved by `datasets` (`save_to_disk`): a Dataset, or a DatasetDict whose split
    names say train or held-out. Memory-mapped Arrow: rows are read on demand."""

    unit = "row"

    def __init__(self, path: str, max_row_bytes: int = MAX_ROW_BYTES) -> None:
        self.max_row_bytes = max_row_bytes
        try:
            from datasets import load_from_disk
        except ImportError:
            raise TaskError(
                f"{path}: reading a `datasets` directory needs the datasets package: {DATA_EXTRA}"
            ) from None
        try:
            loaded = load_from_disk(path)
        except Exception as exc:  # noqa: BLE001 - datasets raises FileNotFoundError and others
            raise TaskError(f"{path}: not a directory saved by datasets.save_to_disk: {exc}") from None
        parts = sorted(loaded.items()) if hasattr(loaded, "items") else [(None, loaded)]
        self.parts = [(name, ds) for name, ds in parts]
        self.starts = [0]
        for _, ds in self.parts:
            self.starts.append(self.starts[-1] + len(ds))

    def scan(self) -> Iterator[RawRow]:
        n = 0
        for name, ds in self.parts:
            for data in ds:
                yield _checked(RawRow(n, n + 1, dict(data), split=name), self.max_row_bytes)
                n += 1

    def row(self, loc: int) -> dict[str, Any]:
        import bisect

        p = bisect.bisect_right(self.starts, loc) - 1
        return dict(self.parts[p][1][loc - self.starts[p]])


def _checked(raw: RawRow, bound: int) -> RawRow:
    """A Parquet or `datasets` row, or its error when its text is over `bound` characters."""
    size = text_size(raw.data, bound)
    if size > bound:
        return RawRow(raw.loc, raw.line, None, _too_long(size, bound, "characters or more"), raw.split)
    return raw


class _field_limit:
    """csv's field size limit set to `bound` while a record is read (the module keeps one global)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound

    def __enter__(self) -> None:
        self.before = csv.field_size_limit(max(self.bound, 1))

    def __exit__(self, *exc: object) -> None:
        csv.field_size_limit(self.before)


Reader = JsonlReader | CsvReader | ParquetReader | DatasetsReader


def open_source(source: SourceConfig, base_dir: str | None = None) -> tuple[str, Reader]:
    """The absolute path and a reader of `source` (a relative path is taken from `base_dir`,
    else the current directory). A missing file or an unusable format is a TaskError."""
    path = source.path if os.path.isabs(source.path) or base_dir is None else os.path.join(base_dir, source.path)
    if not os.path.exists(path) and base_dir is not None and os.path.exists(source.path):
        path = source.path
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise TaskError(f"task source {source.path!r} does not exist (looked at {path})")
    try:
        fmt = resolve_format(source, os.path.isdir(path))
    except ValueError as exc:
        raise TaskError(str(exc)) from None
    if fmt != "datasets" and os.path.isdir(path):
        raise TaskError(f"task source {path} is a directory; format {fmt} needs a file")
    bound = source.max_row_bytes
    if fmt == "jsonl":
        return path, JsonlReader(path, bound)
    if fmt == "csv":
        return path, CsvReader(path, bound)
    if fmt == "parquet":
        return path, ParquetReader(path, source.fields.columns(), bound)
    return path, DatasetsReader(path, bound)


def text_of(value: Any) -> str:
    """A cell as text (CSV cells already are)."""
    return value if isinstance(value, str) else json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def json_cell(value: Any, name: str = "") -> Any:
    """A list or object cell: as is, or parsed from the JSON text a CSV holds. A ValueError when
    the parsed JSON holds a lone surrogate (`lone_surrogate`)."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        if nests_deeper(value, MAX_DEPTH):
            return value
        try:
            parsed = json.load(io.StringIO(value))
        except (ValueError, RecursionError):
            return value
        where = lone_surrogate(parsed, name)
        if where is not None:
            raise ValueError(where)
        return parsed
    return value
