"""The metrics log: `metrics.jsonl` of a run, one JSON object per line.

Invariant: stdlib only (no config, no torch), so every part that writes or reads
metrics (the loop, the monitor, the report, the torchrun followers) imports it
without reaching the root config. Every line carries `kind`, `step` and `time`;
the file is appended line-buffered and readable while the run goes on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends one JSON object per line; readable while the run goes on."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("a", buffering=1)

    def write(self, kind: str, step: int, **values: Any) -> None:
        self._f.write(json.dumps({"kind": kind, "step": step, "time": time.time(), **values}, default=float) + "\n")

    def close(self) -> None:
        self._f.close()


def read_metrics(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]
