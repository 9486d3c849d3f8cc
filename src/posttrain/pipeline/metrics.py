"""Per-stage meters: throughput, latency percentiles, busy and idle time.

Invariant: for each stage, busy_s + idle_s == workers x elapsed_s (up to
clock resolution): a worker is busy from taking an item until it hands the
result on, and idle otherwise; latency percentiles cover the last `window`
calls, throughput counts every completed call.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StageStats:
    name: str
    workers: int
    items: int
    errors: int
    elapsed_s: float
    busy_s: float
    idle_s: float
    throughput: float
    """Items per second over the elapsed time."""
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float

    @property
    def utilisation(self) -> float:
        total = self.busy_s + self.idle_s
        return self.busy_s / total if total > 0 else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


class StageMeter:
    def __init__(self, name: str, workers: int, window: int = 4096) -> None:
        self.name = name
        self.workers = workers
        self._lat: deque[float] = deque(maxlen=window)
        self._items = self._errors = 0
        self._busy = 0.0
        self._start = time.perf_counter()
        self._open: dict[int, float] = {}

    def begin(self, token: int) -> None:
        self._open[token] = time.perf_counter()

    def end(self, token: int, items: int = 1, error: bool = False) -> float:
        took = time.perf_counter() - self._open.pop(token)
        self._busy += took
        self._lat.append(took)
        self._items += items
        self._errors += error
        return took

    def stats(self) -> StageStats:
        now = time.perf_counter()
        elapsed = now - self._start
        busy = self._busy + sum(now - t for t in self._open.values())
        lat = list(self._lat)
        idle, rate = max(0.0, self.workers * elapsed - busy), self._items / elapsed if elapsed > 0 else 0.0
        tail = (percentile(lat, 50), percentile(lat, 90), percentile(lat, 99), max(lat, default=0.0))
        return StageStats(self.name, self.workers, self._items, self._errors, elapsed, busy, idle, rate, *tail)
