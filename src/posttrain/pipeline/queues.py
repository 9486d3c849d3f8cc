"""Bounded asyncio queues between pipeline stages, with a `stats()` view.

Invariant: a queue never holds more than its capacity (a full queue blocks
the producer: backpressure), every item put is got at most once, and the
counters in `stats()` are exact: puts - gets == depth.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class QueueStats:
    name: str
    depth: int
    capacity: int
    max_depth: int
    puts: int
    gets: int
    blocked_put_s: float
    """Seconds producers spent waiting on a full queue (backpressure)."""


class BoundedQueue(Generic[T]):
    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"queue {name!r}: capacity must be >= 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._q: asyncio.Queue[T] = asyncio.Queue(capacity)
        self._puts = self._gets = self._max = 0
        self._blocked = 0.0

    async def put(self, item: T) -> None:
        if self._q.full():
            t0 = time.perf_counter()
            await self._q.put(item)
            self._blocked += time.perf_counter() - t0
        else:
            self._q.put_nowait(item)
        self._puts += 1
        self._max = max(self._max, self._q.qsize())

    async def get(self) -> T:
        item = await self._q.get()
        self._gets += 1
        return item

    def get_nowait(self) -> T | None:
        """An item if one is queued now, else None."""
        try:
            item = self._q.get_nowait()
        except asyncio.QueueEmpty:
            return None
        self._gets += 1
        return item

    def fill(self) -> float:
        return self._q.qsize() / self.capacity

    def stats(self) -> QueueStats:
        return QueueStats(self.name, self._q.qsize(), self.capacity, self._max, self._puts, self._gets, self._blocked)
