"""Progress bars: tqdm on a terminal, plain lines anywhere else.

Invariant: when the bar's stream is not a terminal (a log file, a pipe, CI), no
carriage-return frame is written: one plain line per update, at most one every
`interval_s` seconds (the last state always written on close), so a log holds a
bounded number of readable lines instead of hundreds of redraws.

An engine reports progress inside one generate call through `rows_done` (the hf engine: after
each packed batch); whoever wants it counts them under `counting_rows` (the inline scheduler,
pipeline/play.py, for the evaluation's bar). Nothing is counted where no one listens, and a
thread other than the listener's (a server's) is never counted: the listener is a context variable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

INTERVAL_S = 30.0
"""The least time between two plain lines (the final line on close is always written)."""


def progress(
    total: int | None,
    desc: str,
    unit: str = "step",
    initial: int = 0,
    disable: bool = False,
    stream: TextIO | None = None,
    interval_s: float = INTERVAL_S,
    leave: bool = True,
) -> Any:
    """A tqdm bar when `stream` (default stderr, tqdm's own) is a terminal, else a PlainProgress.
    `leave`: False for a bar that may open under another (an evaluation inside a training run's
    steps): tqdm clears it on close; a plain line stays either way."""
    out = stream if stream is not None else sys.stderr
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm

        kw = {"dynamic_ncols": True, "file": out, "leave": leave}
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, **kw)
    return PlainProgress(total, desc, unit, initial, disable, out, interval_s)


def raise_total(bar: Any, total: int) -> None:
    """`bar`'s total raised to `total` where it was lower: work found on the way (an episode's
    next turn)."""
    if bar.total is not None and bar.total < total:
        bar.total = total
        bar.refresh()


_ROWS: ContextVar[Callable[[int], None] | None] = ContextVar("posttrain_rows_listener", default=None)


@contextmanager
def counting_rows(listener: Callable[[int], None]) -> Iterator[None]:
    """`listener(n)` is called, in this thread, for each `rows_done(n)` an engine reports inside
    the block."""
    token = _ROWS.set(listener)
    try:
        yield
    finally:
        _ROWS.reset(token)


def rows_done(n: int) -> None:
    """An engine's report that `n` more sample rows of its current generate call are finished;
    a no-op unless the calling thread is inside `counting_rows`."""
    listener = _ROWS.get()
    if listener is not None:
        listener(n)


class PlainProgress:
    """The part of tqdm's interface posttrain uses (update, set_postfix, set_postfix_str, close,
    refresh, a settable `total`), written as plain lines: `desc n/total unit [postfix] elapsed`."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "step",
        initial: int = 0,
        disable: bool = False,
        stream: TextIO | None = None,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit, self.n, self.disable = total, desc, unit, initial, disable
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s, self.clock = interval_s, clock
        self.start = clock()
        self.last: float | None = None  # when the last line was written
        self.written = initial  # the count the last line showed
        self.postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self.last is None or now - self.last >= self.interval_s:
            self._line(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(dict(ordered_dict) if ordered_dict else {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def refresh(self) -> None:
        """Nothing to redraw: the next line shows the state then."""

    def close(self) -> None:
        if self.n != self.written or self.last is None:
            self._line(self.clock())
        self.disable = True  # nothing after close

    def _line(self, now: float) -> None:
        self.last, self.written = now, self.n
        if self.disable:
            return
        count = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        tail = f" | {self.postfix}" if self.postfix else ""
        self.stream.write(f"{self.desc} {count} {self.unit}{tail} | {now - self.start:.0f} s\n")
        self.stream.flush()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def each_reported(results: Iterable[T], rows: Sequence[int]) -> list[T]:
    """`results` (one a request, in request order) listed, `rows_done(rows[i])` reported as the
    i-th arrives: for an engine whose requests finish one by one (an HTTP client's pool map)."""
    out = []
    for result, n in zip(results, rows):
        out.append(result)
        rows_done(n)
    return out
