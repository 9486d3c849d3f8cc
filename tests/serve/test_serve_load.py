"""Bounded load test: `posttrain serve` in its own process, 32 concurrent streaming clients."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "serving.py"


@pytest.mark.slow
def test_32_concurrent_clients_zero_errors():
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "load",
            "--preset",
            "micro",
            "--clients",
            "32",
            "--requests",
            "128",
            "--max-tokens",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "completed 128/128, errors 0" in out.stdout
    assert re.search(r"TTFT p50 \d+ ms, p99 \d+ ms", out.stdout)
