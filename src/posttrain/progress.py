"""Progress bars: tqdm on a terminal, plain lines anywhere else.

Invariant: when the bar's stream is not a terminal (a log file, a pipe, CI), no
carriage-return frame is written: one plain line per update, at most one every
`interval_s` seconds (the last state always written on close), so a log holds a
bounded number of readable lines instead of hundreds of redraws.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

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
) -> Any:
    """A tqdm bar when `stream` (default stderr, tqdm's own) is a terminal, else a PlainProgress."""
    out = stream if stream is not None else sys.stderr
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, dynamic_ncols=True, file=out)
    return PlainProgress(total, desc, unit, initial, disable, out, interval_s)


class PlainProgress:
    """The part of tqdm's interface posttrain uses (update, set_postfix, set_postfix_str, close),
    written as plain lines: `desc n/total unit [postfix] elapsed`."""

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
