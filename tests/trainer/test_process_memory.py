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


def _glibc() -> bool:
    import platform

    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_to_the_os_after_a_cpu_step():
    import torch

    from posttrain.trainer.memory import release_freed_memory

    # 2,000 blocks of 100 KB (below glibc's mmap threshold: they come from the heap), each
    # followed by a small block that stays alive, so freeing the big ones leaves holes the heap
    # does not hand back by itself: the pages stay resident, as a train step's activations did
    blocks, pins = [], []
    for _ in range(2000):
        blocks.append(bytearray(100_000))
        pins.append(bytearray(600))
    held = process_memory_mib()["rss_mib"]
    del blocks
    kept = process_memory_mib()["rss_mib"]
    assert release_freed_memory(torch.device("meta")) is False  # only the CPU's heap is trimmed
    assert release_freed_memory(torch.device("cpu")) is True
    after = process_memory_mib()["rss_mib"]
    assert held - kept < 40  # freed, yet still resident
    assert kept > after + 120  # about 190 MiB handed back
    del pins
