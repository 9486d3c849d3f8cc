"""The metrics log: `metrics.jsonl` of a run, one JSON object per line.

Invariant: stdlib only (no config, no torch), so every part that writes or reads
metrics (the loop, the monitor, the report, the torchrun followers) imports it
without reaching the root config. Every line carries `kind`, `step` and `time`;
each line is appended by one `write` system call on an O_APPEND descriptor, so it
is readable at once while the run goes on and a crash (kill -9) leaves at most
one partial last line, which `read_metrics` skips and `roll_back` removes. `read_metrics` is
the one reader: a corrupt line (not UTF-8, not JSON, not an object, or without a string
`kind`, an integer `step` and a numeric `time`) is skipped with one warning naming file:line
and why, so a plan, a report or a resume reads the rest of the run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per line; readable while the run goes on."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        _drop_partial_tail(self._fd)

    def write(self, kind: str, step: int, **values: Any) -> None:
        line = json.dumps({"kind": kind, "step": step, "time": time.time(), **values}, default=float) + "\n"
        data = memoryview(line.encode())
        while data:  # a regular file takes the whole line in one call; a short write continues it
            data = data[os.write(self._fd, data) :]

    def mark(self) -> int:
        """The log's length in bytes, synced to disk: what a checkpoint records, so that a resume
        can `roll_back` to it."""
        os.fsync(self._fd)
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        os.close(self._fd)


def _drop_partial_tail(fd: int) -> None:
    """Cut a partial last line (a write a crash cut short, never a row) off the log open at `fd`,
    so the next line is not glued to it (a resume from a checkpoint without marks used to leave
    one line that no reader could parse)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = size
    while start > 0:
        chunk = os.pread(fd, min(65536, start), max(0, start - 65536))
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            start = start - len(chunk) + cut + 1
            break
        start -= len(chunk)
    os.ftruncate(fd, start)


def roll_back(path: Path, mark: int) -> int:
    """Cut the log at `path` back to `mark` bytes (a checkpoint's `MetricsLog.mark`): the lines
    written after the checkpoint, and a partial last line, go. Returns the bytes removed (0 when
    the log is not longer than `mark`)."""
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if size <= mark:
        return 0
    with path.open("r+b") as fh:
        fh.truncate(mark)
        fh.flush()
        os.fsync(fh.fileno())
    return size - mark


def read_metrics(path: Path, kind: str | None = None, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a metrics log (of `kind`, when given). A last line without its newline (a
    write cut short by a crash) is not a row yet and is left out; a corrupt line is skipped with
    one warning naming file:line (`parse_row`), also appended to `problems` when given."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    lines.pop()  # a partial last line, or the empty string after the final newline
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row, why = parse_row(line)
        if row is None:
            log.warning("%s:%d: corrupt metrics line skipped (%s)", path, number, why)
            if problems is not None:
                problems.append(f"{path}:{number}: corrupt metrics line skipped ({why})")
        elif kind is None or row["kind"] == kind:
            rows.append(row)
    return rows


def parse_row(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """The row on one line of the log, or None and why it is not one."""
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    except RecursionError:
        return None, "not JSON: nested too deeply"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    if not isinstance(row.get("kind"), str):
        return None, "no string kind"
    step, when = row.get("step"), row.get("time")
    if not isinstance(step, int) or isinstance(step, bool):
        return None, "no integer step"
    if not isinstance(when, int | float) or isinstance(when, bool):
        return None, "no numeric time"
    return row, ""
