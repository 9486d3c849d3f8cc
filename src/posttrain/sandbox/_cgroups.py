"""cgroup v1 and v2 control for the sandbox tree.

Invariant: every cgroup this module creates lives under the calling
process's own cgroup (read from /proc/self/cgroup), in a tree named after
the owning pid, and is removed when empty; a task cgroup is only reported
clean once no process is left in it. Stdlib only (the worker imports it).

Layout, per controller (v1) or once (v2):
    <own cgroup>/posttrain-sandbox-<pid>/          cpu weight for all sandbox work
    <own cgroup>/posttrain-sandbox-<pid>/slot-<i>/  one worker and the one task it runs

A worker joins its slot once; its task trees are born in the slot by fork,
which avoids a cgroup attach (an RCU grace period on v1) per task.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

CONTROLLERS = ("memory", "pids", "cpu")
TREE_PREFIX = "posttrain-sandbox-"


class CgroupError(OSError):
    """A cgroup operation this machine does not allow."""


@dataclass(frozen=True)
class Hierarchy:
    """Where each controller is mounted and our own cgroup in it.

    version 1: `dirs` maps controller -> <mount>/<own path>.
    version 2: every controller maps to the same <mount>/<own path>.
    """

    version: int
    dirs: dict = field(default_factory=dict)


def _own_paths(proc_cgroup: str) -> tuple[dict, str | None]:
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            v2 = path
        for c in ctrls.split(","):
            if c:
                v1[c] = path
    return v1, v2


def _mounts(proc_mounts: str) -> tuple[dict, str | None]:
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        target, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup":
            for c in CONTROLLERS:
                if c in opts:
                    v1[c] = target
        elif fstype == "cgroup2" and v2 is None:
            v2 = target
    return v1, v2


def detect(proc_cgroup: str | None = None, proc_mounts: str | None = None) -> Hierarchy | None:
    """The hierarchy that has all of memory, pids and cpu, or None.
    v1 is preferred where it holds all three (a hybrid machine's v2 mount is
    often empty); otherwise v2 if its root lists them."""
    proc_cgroup = proc_cgroup if proc_cgroup is not None else _read("/proc/self/cgroup")
    proc_mounts = proc_mounts if proc_mounts is not None else _read("/proc/self/mounts")
    own_v1, own_v2 = _own_paths(proc_cgroup)
    mnt_v1, mnt_v2 = _mounts(proc_mounts)
    if all(c in mnt_v1 and c in own_v1 for c in CONTROLLERS):
        return Hierarchy(1, {c: _join(mnt_v1[c], own_v1[c]) for c in CONTROLLERS})
    if mnt_v2 and own_v2 is not None:
        base = _join(mnt_v2, own_v2)
        have = set(_read(os.path.join(mnt_v2, "cgroup.controllers")).split())
        if set(CONTROLLERS) <= have:
            return Hierarchy(2, {c: base for c in CONTROLLERS})
    return None


def _join(mount: str, path: str) -> str:
    return os.path.join(mount, path.lstrip("/")) if path not in ("", "/") else mount


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _unique_dirs(h: Hierarchy) -> list[str]:
    return sorted(set(h.dirs.values()))


class Tree:
    """The sandbox tree of one owning process."""

    def __init__(self, h: Hierarchy, owner_pid: int | None = None, tag: str = "") -> None:
        self.h = h
        self.name = f"{TREE_PREFIX}{owner_pid or os.getpid()}" + (f"-{tag}" if tag else "")
        self.roots = {c: os.path.join(d, self.name) for c, d in h.dirs.items()}

    def create(self, cpu_weight: int) -> None:
        """Make the tree and its workers leaf; set the CPU weight (1..10000,
        100 = same share as a sibling at the default weight)."""
        for base in _unique_dirs(self.h):
            reap_stale(base)
        if self.h.version == 2:
            base = self.h.dirs["memory"]
            _enable_v2(base)
            os.makedirs(self.roots["memory"], exist_ok=True)
            _enable_v2(self.roots["memory"])
            _write(os.path.join(self.roots["memory"], "cpu.weight"), str(cpu_weight))
        else:
            for d in set(self.roots.values()):
                os.makedirs(d, exist_ok=True)
            shares = max(2, int(1024 * cpu_weight / 100))
            _write(os.path.join(self.roots["cpu"], "cpu.shares"), str(shares))

    def task(self, name: str) -> TaskCgroup:
        return TaskCgroup(self.h.version, {c: os.path.join(r, name) for c, r in self.roots.items()})

    def remove(self) -> None:
        for d in set(self.roots.values()):
            _remove_tree(d)


def _enable_v2(path: str) -> None:
    want = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        _write(os.path.join(path, "cgroup.subtree_control"), want)
    except OSError as exc:
        raise CgroupError(
            exc.errno,
            f"cannot enable {want} in {path}: {exc.strerror} "
            "(cgroup v2 needs a delegated subtree with no processes in it)",
        ) from exc


class TaskCgroup:
    """One task's cgroup: limits, membership, OOM count, kill, removal."""

    def __init__(self, version: int, dirs: dict) -> None:
        self.version = version
        self.dirs = dirs

    def create(self, memory_bytes: int, pids: int, cpus: float) -> None:
        for d in set(self.dirs.values()):
            os.makedirs(d, exist_ok=True)
        self._limits: tuple | None = None
        self.set_limits(memory_bytes, pids, cpus)

    def set_limits(self, memory_bytes: int, pids: int, cpus: float) -> None:
        """Write the limits (only those that changed since the last call)."""
        want = (int(memory_bytes), int(pids), float(cpus))
        if getattr(self, "_limits", None) == want:
            return
        self._limits = want
        period = 100_000
        quota = max(1000, int(cpus * period))
        if self.version == 2:
            d = self.dirs["memory"]
            _write(os.path.join(d, "memory.max"), str(memory_bytes))
            try:
                _write(os.path.join(d, "memory.swap.max"), "0")
            except OSError:
                pass
            _write(os.path.join(d, "pids.max"), str(pids))
            _write(os.path.join(d, "cpu.max"), f"{quota} {period}")
            return
        mem = self.dirs["memory"]
        # memsw must stay >= limit: raise memsw first when growing, limit first when shrinking
        order = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
        cur = _read(os.path.join(mem, "memory.limit_in_bytes")).strip()
        if cur.isdigit() and int(cur) > memory_bytes:
            order = order[::-1]
        for name in order:
            try:
                _write(os.path.join(mem, name), str(memory_bytes))
            except OSError:
                if name == "memory.limit_in_bytes":
                    raise
        _write(os.path.join(self.dirs["pids"], "pids.max"), str(pids))
        _write(os.path.join(self.dirs["cpu"], "cpu.cfs_period_us"), str(period))
        _write(os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"), str(quota))

    def join(self, pid: int = 0) -> None:
        for d in set(self.dirs.values()):
            _write(os.path.join(d, "cgroup.procs"), str(pid or os.getpid()))

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in _read(os.path.join(self.dirs["memory"], name)).splitlines():
            key, _, val = line.partition(" ")
            if key == "oom_kill":
                return int(val)
        return 0

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in set(self.dirs.values()):
            found.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
        return sorted(found)

    def kill_all(self, keep: tuple[int, ...] = (), timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup but `keep` until none is left;
        True if none is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = [p for p in self.pids() if p not in keep]
            if not left:
                return True
            if time.monotonic() > deadline:
                return False
            if self.version == 2 and not keep:
                try:
                    _write(os.path.join(self.dirs["memory"], "cgroup.kill"), "1")
                except OSError:
                    pass
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)

    def remove(self) -> None:
        for d in set(self.dirs.values()):
            for _ in range(200):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)


def _remove_tree(d: str) -> None:
    if not os.path.isdir(d):
        return
    for entry in os.scandir(d):
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(entry.path)
    try:
        os.rmdir(d)
    except OSError:
        pass


def reap_stale(base: str) -> None:
    """Remove trees left by owners that are gone (empty cgroups only)."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(TREE_PREFIX):
            continue
        pid = entry.name[len(TREE_PREFIX) :].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove_tree(entry.path)
