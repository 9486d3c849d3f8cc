"""The report while a run trains: RUN_DIR/report.html rewritten after each evaluation and every
`monitor.report_every_steps` steps, in a child process, so the loop never waits on plotting.

Invariant: at most one refresh runs at a time (one due while another runs is skipped: the next
one shows its rows too); each refresh is a whole `posttrain report RUN_DIR`, which writes the
page atomically (`html._write_atomic`); `close` stops the refresh in flight and removes its
temporary file (the run's final report, written next, supersedes it), so a late refresh can
never replace the final page; a refresh that fails is logged with its stderr and never stops
the run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_CLI = "import sys; from posttrain.cli import main; sys.exit(main())"


class LiveReport:
    """Refreshes one run's report in the background; `every` 0: after evaluations only."""

    def __init__(self, run_dir: Path, every: int, enabled: bool = True, log: Any = print) -> None:
        self.run_dir, self.every, self.enabled, self.log = Path(run_dir), every, enabled, log
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: Any = None  # the running refresh's stderr (a file: a pipe could fill and block it)
        self._step = 0
        self.started: list[int] = []
        """The steps whose refresh started (a skipped one is not here)."""

    def due(self, step: int, evaluated: bool) -> bool:
        return self.enabled and (evaluated or bool(self.every and step % self.every == 0))

    def refresh(self, step: int, evaluated: bool) -> bool:
        """Start a refresh when one is due and none runs; True when one started."""
        if not self.due(step, evaluated) or not self._reap():
            return False
        self._err = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CLI, "report", str(self.run_dir)], stdout=subprocess.DEVNULL, stderr=self._err
        )
        self._step = step
        self.started.append(step)
        return True

    def _reap(self) -> bool:
        """Whether no refresh runs now (a finished one's failure is logged)."""
        if self._proc is None:
            return True
        if self._proc.poll() is None:
            return False
        self._finished()
        return True

    def _finished(self) -> None:
        proc, err_file, self._proc, self._err = self._proc, self._err, None, None
        assert proc is not None and err_file is not None  # called only with a child started
        err_file.seek(0)
        err = err_file.read().decode(errors="replace").strip()
        err_file.close()
        if proc.returncode:
            tail = err.splitlines()[-1] if err else f"exit status {proc.returncode}"
            self.log(f"warning: report not refreshed at step {self._step}: {tail}")

    def close(self) -> None:
        """Stop the refresh in flight (if any) and remove its temporary page."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait()
            (self.run_dir / f".report.html.{self._proc.pid}.tmp").unlink(missing_ok=True)
            self._proc, self._err = None, None
            return
        self._finished()

    def wait(self) -> None:
        """Wait for the refresh in flight (if any) to end."""
        if self._proc is not None:
            self._proc.wait()
            self._finished()
