"""`process_memory_mib`: this process's resident memory and its peak, as the loop logs them each step."""

from __future__ import annotations

import sys

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
