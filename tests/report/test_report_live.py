"""The report while a run trains: refreshed after each evaluation and every N steps, in a child
process, one at a time, a failure logged and never raised; the loop calls it during training."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from posttrain.metrics_log import MetricsLog
from posttrain.report.live import LiveReport


def test_due_after_evaluations_and_every_n_steps(tmp_path):
    live = LiveReport(tmp_path, every=3)
    assert [s for s in range(1, 10) if live.due(s, evaluated=False)] == [3, 6, 9]
    assert live.due(4, evaluated=True)
    assert [s for s in range(1, 10) if LiveReport(tmp_path, every=0).due(s, False)] == []
    assert not LiveReport(tmp_path, every=1, enabled=False).due(2, evaluated=True)


def test_a_failed_refresh_is_logged_and_the_run_goes_on(tmp_path):
    logged = []
    live = LiveReport(tmp_path / "not-a-run", every=1, log=logged.append)
    assert live.refresh(1, evaluated=False) and live.started == [1]
    live.wait()
    (line,) = logged
    assert line.startswith("warning: report not refreshed at step 1:") and "is not a run directory" in line


def test_one_refresh_at_a_time(tmp_path):
    live = LiveReport(tmp_path, every=1)
    # a refresh in flight: a child that waits for its stdin to close
    live._err = tempfile.TemporaryFile()
    live._proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert not live.refresh(2, evaluated=True) and live.started == []  # skipped: the next one shows its rows
    live._proc.stdin.close()
    live.wait()
    assert live._proc is None


def test_close_stops_the_refresh_in_flight_and_removes_its_page(tmp_path):
    """The run's final report follows `close`: a late refresh must not replace it."""
    live = LiveReport(tmp_path, every=1)
    live._err = tempfile.TemporaryFile()
    child = live._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a slow refresh
    partial = tmp_path / f".report.html.{child.pid}.tmp"
    partial.write_text("<html>half")
    live.close()
    assert child.returncode is not None and not partial.exists() and live._proc is None


@pytest.mark.heavy
def test_a_refresh_writes_the_page_of_the_rows_so_far(tmp_path):
    run = tmp_path / "live"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    log = MetricsLog(run / "metrics.jsonl")
    for step in (1, 2):
        log.write("train", step, loss=0.5, grad_norm=1.0, lr=1e-3, reward_mean=0.2)
    live = LiveReport(run, every=2)
    assert live.refresh(2, evaluated=False)
    live.wait()
    log.close()
    page = (run / "report.html").read_text()
    assert "2 steps" in page and 'alt="loss"' in page and "clip fraction: not logged" in page
