"""The progress bar off a terminal: plain lines at a bounded rate, no carriage-return frames."""

from __future__ import annotations

import io

from posttrain.progress import PlainProgress, progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_log_file_gets_plain_lines_at_a_bounded_rate():
    out, clock = io.StringIO(), Clock()
    bar = PlainProgress(300, "train", stream=out, interval_s=30.0, clock=clock)
    for step in range(300):
        clock.t = step * 1.0  # one step a second: at most one line per 30 steps
        bar.set_postfix_str(f"add={step / 300:.2f}")
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("train 1/300 step | add=0.00")
    assert lines[-1].startswith("train 300/300 step | add=1.00 | 299 s")
    assert len(lines) == 11  # steps 1, 31, ..., 271 and the last one on close


def test_a_pipe_gets_plain_lines_and_a_terminal_gets_tqdm():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(progress(10, "sft", stream=io.StringIO()), PlainProgress)
    assert not isinstance(progress(10, "sft", stream=Tty()), PlainProgress)
    quiet = io.StringIO()
    bar = progress(3, "sft", stream=quiet, disable=True)
    bar.update(3)
    bar.close()
    assert quiet.getvalue() == ""
