"""What several bench scripts share. Imported by its folder name (a bench script runs with bench/
first on sys.path); no side effects on import: no environment variables, no torch."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any


def quiet_run(steps: int, out: str) -> list[str]:
    """Overrides of a demo loop run that only trains: a small held-out set, no periodic evaluation,
    pass@k, above-level set, checkpoint, report or progress bar; the run dir under `out`."""
    return [
        f"run.steps={steps}",
        "eval.tasks_per_domain=10",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        "run.checkpoint_every=0",
        "monitor.report=false",
        "run.progress=false",
        f"run.out_dir={out}",
    ]


def in_child(measure: Callable[[dict[str, Any]], dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    """`measure(spec)` in a forked child, so each point has its own peak RSS; the result comes back
    through a pipe as JSON. A failure in the child stops the bench naming the point."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, write, leave without running the parent's cleanup
        os.close(read)
        try:
            out = json.dumps(measure(spec)).encode()
        except BaseException as e:  # noqa: BLE001 - the parent prints what failed
            out = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
        with os.fdopen(write, "wb") as f:
            f.write(out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(data) if data else {"error": "the child wrote nothing"}
    if "error" in result:
        raise SystemExit(f"point {spec} failed: {result['error']}")
    return result


_M_MMAP_THRESHOLD = -3


def map_large_allocations() -> None:
    """glibc's mmap threshold pinned at 64 KiB: every larger block is mapped and unmapped on its own,
    so a process's VmHWM (`status_kb`) counts what a measured call held, not the heap's high water."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 64 * 1024)


def status_kb(field: str) -> int:
    """A field of /proc/self/status in kB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_kb() -> int:
    """Reset this process's VmHWM to its current RSS and return that RSS in kB: the base a measured
    call's `status_kb("VmHWM")` is read against."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS")


def domain_levels(spec: str) -> dict[str, int]:
    """A bench's `--domains` value, `domain:level,...` (pyfunc_revise:1,ifeval:1), as {domain: level};
    SystemExit naming the value when it is not that."""
    try:
        out = {d.strip(): int(lv) for d, lv in (item.split(":") for item in spec.split(","))}
    except ValueError:
        raise SystemExit(f"--domains {spec!r}: expected domain:level,... (pyfunc_revise:1,ifeval:1)") from None
    if not all(out):
        raise SystemExit(f"--domains {spec!r}: a domain name is empty")
    return out


def vlm_spec(cfg: dict[str, Any]) -> Any:
    """The VisionSpec a VLM bench script's JSON config names: its VisionSpec fields, and `tower`
    [width, depth] for `tower_width` and `tower_depth`."""
    from posttrain.model import vision

    fields = {k: cfg[k] for k in cfg if k in vision.VisionSpec.__dataclass_fields__}
    if "tower" in cfg:
        fields["tower_width"], fields["tower_depth"] = cfg["tower"]
    return vision.VisionSpec(**fields)
