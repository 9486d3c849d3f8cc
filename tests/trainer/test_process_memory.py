"""`process_memory_mib`: this process's resident memory and its peak, as the loop logs them each step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from posttrain.trainer.memory import process_memory_mib


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS and VmHWM are Linux's")
def test_the_peak_follows_a_touched_allocation_and_stays_after_it_is_freed():
    before = process_memory_mib()
    assert 0 < before["rss_mib"] <= before["peak_rss_mib"]
    block = bytearray(256 << 20)  # 256 MiB, zero-filled: every page touched
    during = process_memory_mib()
    assert during["rss_mib"] >= before["rss_mib"] + 200
    del block
    after = process_memory_mib()
    # a peak does not fall (Linux syncs its per-CPU RSS counters in batches: a few MiB of slack)
    assert after["peak_rss_mib"] >= during["peak_rss_mib"] - 4 >= before["peak_rss_mib"] - 8
    assert after["peak_rss_mib"] >= before["rss_mib"] + 200


def _glibc() -> bool:
    import platform

    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


_HEAP_SCRIPT = """
import json, torch
from posttrain.trainer.memory import process_memory_mib, release_freed_memory
blocks, pins = [], []
for _ in range(2000):
    blocks.append(bytearray(100_000))
    pins.append(bytearray(600))
held = process_memory_mib()["rss_mib"]
del blocks
kept = process_memory_mib()["rss_mib"]
meta = release_freed_memory(torch.device("meta"))
cpu = release_freed_memory(torch.device("cpu"))
print(json.dumps(dict(held=held, kept=kept, after=process_memory_mib()["rss_mib"], meta=meta, cpu=cpu)))
"""


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_to_the_os_after_a_cpu_step():
    """In a fresh process (a test process's heap already has holes of its own): 2,000 blocks of
    100 KB (below glibc's mmap threshold: they come from the heap), each followed by a small
    block that stays alive, so freeing the big ones leaves holes the heap does not hand back by
    itself; the pages stay resident, as a train step's activations did, until the release."""
    import json
    import os
    import subprocess

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT], capture_output=True, text=True, env=env, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["meta"] is False and got["cpu"] is True  # only the CPU's heap is trimmed
    assert got["held"] - got["kept"] < 40  # freed, yet still resident
    assert got["kept"] > got["after"] + 120  # about 190 MiB handed back
