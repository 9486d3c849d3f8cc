"""`posttrain sandbox probe` and `posttrain sandbox run`."""

from __future__ import annotations

import os

import pytest

from posttrain.cli import main


def test_probe_reports_backends(capsys):
    rc = main(["sandbox", "probe"])
    out = capsys.readouterr().out
    assert "backend forkserver:" in out and "selected backend:" in out
    assert rc == (0 if "selected backend: forkserver" in out or "selected backend: bwrap" in out else 1)


def test_probe_with_a_bad_backend_is_a_config_error(capsys):
    assert main(["sandbox", "probe", "--backend", "docker"]) == 2
    assert "backend" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")
def test_run_executes_in_the_sandbox(capfd):
    assert main(["sandbox", "run", "--", "sh", "-c", "echo from-sandbox; hostname"]) == 0
    out = capfd.readouterr()
    assert out.out == "from-sandbox\nsandbox\n" and "status=ok" in out.err
