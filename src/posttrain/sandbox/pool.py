"""Pools of sandbox slots: warm fork-server workers or one-shot slots.

Invariant: a slot runs one request at a time; every call returns (a result or
SandboxError) within its acquire timeout plus the request's wall limit plus
the grace period; a worker that dies or hangs yields infra_error for the one
request it held and is replaced before its slot is used again; per-domain
concurrency never exceeds `domain_limits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import shutil
import stat
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from posttrain.configs.sandbox import SandboxConfig
from posttrain.errors import SandboxError
from posttrain.sandbox import _cgroups, _hide, packages
from posttrain.sandbox.forkserver import ForkServerWorker, WorkerDied
from posttrain.sandbox.oneshot import BwrapBackend, OneShot, UnsafeBackend, write_files
from posttrain.sandbox.probe import Probe, probe, select_backend
from posttrain.sandbox.records import ExecRequest, ExecResult, Limits

_POOL_SEQ = itertools.count()
RO_ROOTS = (
    "/usr",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/opt",
)  # bound whole into every task
_UID_SPAN = 512


@dataclass(frozen=True)
class PoolStats:
    backend: str
    slots: int
    idle: int
    runs: int
    infra_errors: int
    replaced: int
    by_status: Mapping[str, int]


class Pool:
    """N sandbox slots with acquire/release, health checks and replacement."""

    def __init__(self, config: SandboxConfig | None = None, *, found: Probe | None = None) -> None:
        self.config = config or SandboxConfig()
        self.found = found or probe(self.config.python)
        self.backend = select_backend(self.config, self.found)
        self.seq = next(_POOL_SEQ)
        self._idle: queue.Queue[int] = queue.Queue()
        self._domain = {d: threading.BoundedSemaphore(n) for d, n in self.config.domain_limits.items()}
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self.replaced = 0
        self.closed = False
        self._workers: list[ForkServerWorker | None] = [None] * self.config.workers
        self._oneshot: OneShot | None = None
        self._tree: _cgroups.Tree | None = None
        binds = self._ro_binds()
        self.hidden = _hide.hidden_paths(binds + RO_ROOTS)
        self.site = tuple(_hide.site_dirs(self._prefix()))
        """The sandbox interpreter's site-packages (host paths): where declared packages are found."""
        self.system_site = tuple(
            d for d in dict.fromkeys(x for root in RO_ROOTS for x in _hide.site_dirs(root)) if d not in self.site
        )
        """Every other interpreter's site and dist-packages in the system trees bound into each task
        (/usr/lib/python3/dist-packages, /usr/local/lib/python3.X/dist-packages, ...): what a shell
        task's `python3` would import from; an empty folder inside every task (`_imports`)."""
        if self.backend == "forkserver":
            self._start_tree()
        elif self.backend == "bwrap":
            self._oneshot = BwrapBackend(self.config.python, binds, self.found.bwrap or "bwrap", hidden=self.hidden)
        else:
            self._oneshot = UnsafeBackend(
                self.config.python,
                binds,
                hidden=self.hidden,
                prefix=self._prefix(),
                private_mounts=self.found.namespaces,
            )
        for slot in range(self.config.workers):
            self._idle.put(slot)
        if self.backend == "forkserver":
            try:
                for slot in range(self.config.workers):
                    self._workers[slot] = self._spawn(slot)
            except BaseException:
                self.close()
                raise

    # ---- set-up
    def _prefix(self) -> str:
        """The interpreter's prefix (a venv's root), as the host sees it."""
        py = self.config.python
        return os.path.realpath(
            sys.prefix if py == sys.executable else os.path.dirname(os.path.dirname(os.path.abspath(py)))
        )

    def _venv(self) -> str | None:
        """The prefix to mount apart (at /venv inside), unless a bound system tree holds it."""
        prefix = self._prefix()
        return None if any(_hide.under(prefix, r) for r in RO_ROOTS) else prefix

    def _ro_binds(self) -> tuple[str, ...]:
        prefix = self._prefix()
        extra = () if any(_hide.under(prefix, r) for r in RO_ROOTS) else (prefix,)
        return tuple(dict.fromkeys(extra + tuple(self.config.ro_binds)))

    def _start_tree(self) -> None:
        h = _cgroups.detect()
        if h is None:
            raise SandboxError("fork-server: no cgroup hierarchy with memory, pids and cpu")
        _remove_stale_state_dirs()
        self._tree = _cgroups.Tree(h, tag=str(self.seq))
        try:
            self._tree.create(self.config.cpu_weight)
        except OSError as exc:
            raise SandboxError(f"fork-server: cannot create the sandbox cgroup tree: {exc}") from exc

    def _uid(self, slot: int) -> int:
        return (
            self.config.uid_base
            + (os.getpid() % 30_000) * _UID_SPAN
            + (self.seq * self.config.workers + slot) % _UID_SPAN
        )

    def _spawn(self, slot: int) -> ForkServerWorker:
        assert self._tree is not None
        uid = self._uid(slot)
        conf = {
            "uid": uid,
            "gid": uid,
            "slot": slot,
            "state_dir": os.path.join(tempfile.gettempdir(), f"{self._tree.name}-slot{slot}"),
            "cgroup": {
                "version": self._tree.h.version,
                "dirs": self._tree.h.dirs,
                "owner_pid": os.getpid(),
                "tag": str(self.seq),
            },
            "seccomp": True,
            "preimport": list(self.config.preimport),
            "ro_binds": [b for b in self._ro_binds() if b != self._venv()],
            "venv": self._venv(),
            "hidden": list(self.hidden),
        }
        try:
            return ForkServerWorker(slot, conf, self.config.python, self.config.start_timeout_s, self.config.grace_s)
        except (WorkerDied, OSError) as exc:
            raise SandboxError(f"fork-server worker {slot} failed to start: {exc}") from exc

    # ---- acquire / release
    @contextlib.contextmanager
    def domain_slot(self, domain: str | None, timeout_s: float | None = None) -> Iterator[None]:
        """Hold one of `domain`'s concurrency slots (a run of that domain inside needs another)."""
        timeout_s = self.config.acquire_timeout_s if timeout_s is None else timeout_s
        sem = self._domain.get(domain or "")
        if sem is not None and not sem.acquire(timeout=timeout_s):
            raise SandboxError(f"sandbox: no {domain!r} slot free within {timeout_s:.0f}s (domain_limits[{domain!r}])")
        try:
            yield
        finally:
            if sem is not None:
                sem.release()

    def acquire(self, timeout_s: float | None = None) -> int:
        """A free slot index (its worker alive), or SandboxError after the timeout."""
        if self.closed:
            raise SandboxError("sandbox pool is closed")
        timeout_s = self.config.acquire_timeout_s if timeout_s is None else timeout_s
        try:
            slot = self._idle.get(timeout=timeout_s)
        except queue.Empty:
            raise SandboxError(
                f"sandbox: no worker free within {timeout_s:.0f}s ({self.config.workers} workers)"
            ) from None
        if self.backend == "forkserver":
            try:
                self._ensure_worker(slot)
            except SandboxError:
                self._idle.put(slot)
                raise
        return slot

    def _ensure_worker(self, slot: int) -> None:
        w = self._workers[slot]
        if w is None or not w.alive():
            if w is not None:
                w.kill()
                self._count("replaced")
                self.replaced += 1
            self._workers[slot] = None
            self._workers[slot] = self._spawn(slot)

    def release(self, slot: int) -> None:
        w = self._workers[slot] if self.backend == "forkserver" else None
        if w is not None and not w.alive() and not self.closed:
            try:
                self._ensure_worker(slot)
            except SandboxError:
                pass  # retried by the next acquire of this slot
        self._idle.put(slot)

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    # ---- running
    def run(self, req: ExecRequest, *, domain: str | None = None, timeout_s: float | None = None) -> ExecResult:
        """Run one request in a fresh sandbox. Never raises for what the
        program does; raises SandboxError only when no slot can be had."""
        timeout_s = self.config.acquire_timeout_s if timeout_s is None else timeout_s
        with self.domain_slot(domain, timeout_s):
            slot = self.acquire(timeout_s)
            try:
                result = self._run_on(slot, req, None)
            finally:
                self.release(slot)
        self._count(result.status)
        return result

    async def arun(self, req: ExecRequest, *, domain: str | None = None) -> ExecResult:
        return await asyncio.to_thread(self.run, req, domain=domain)

    def _imports(self, req: ExecRequest) -> dict:
        """What the request's program may import beyond the stdlib (`sandbox.packages`), and the
        package folders its task sees empty (`mask`, host paths): the system interpreters' always,
        the sandbox interpreter's own where the request declares nothing. For a python_main
        program and a shell command alike (a `python3` in a terminal task), so no verdict depends
        on what else is installed on the machine, even for a program that puts a folder back on
        its path (fork-server and bubblewrap; the unsafe backend has no mounts of its own)."""
        modules, dists = packages.resolve(req.packages, self.site)
        mask = [*self.system_site, *(() if modules else self.site)]
        return {"modules": list(modules), "dists": list(dists), "mask": mask}

    def _run_on(self, slot: int, req: ExecRequest, session: str | None, workdir: str | None = None) -> ExecResult:
        try:
            imports = self._imports(req)
        except SandboxError as exc:  # the environment lacks what the request declares: never the program's fault
            return ExecResult.infra(str(exc), self.backend)
        if self.backend == "forkserver":
            w = self._workers[slot]
            if w is None:
                return ExecResult.infra("no worker in slot", self.backend)
            return w.run(req, session, imports)
        assert self._oneshot is not None
        return self._oneshot.run(req, workdir, imports)

    @contextlib.contextmanager
    def session(
        self,
        files: Mapping[str, bytes | str] | None = None,
        *,
        disk_bytes: int = Limits().disk_bytes,
        domain: str | None = None,
    ) -> Iterator[Session]:
        """A multi-step session holding one slot until it closes."""
        timeout_s = self.config.acquire_timeout_s
        with self.domain_slot(domain, timeout_s):
            slot = self.acquire(timeout_s)
            sess = None
            try:
                sess = Session(self, slot, dict(files or {}), disk_bytes)
                yield sess
            finally:
                if sess is not None:
                    sess.close()
                self.release(slot)

    # ---- health and shutdown
    def health_check(self, timeout_s: float = 5.0) -> int:
        """Ping every idle worker, replacing the dead or silent; returns how many were replaced."""
        if self.backend != "forkserver":
            return 0
        replaced = 0
        for _ in range(self.config.workers):
            try:
                slot = self._idle.get_nowait()
            except queue.Empty:
                break
            w = self._workers[slot]
            try:
                if w is None:
                    raise WorkerDied("empty slot")
                w.ping(timeout_s)
            except WorkerDied:
                try:
                    self._ensure_worker(slot)
                    replaced += 1
                except SandboxError:
                    pass
            finally:
                self._idle.put(slot)
        return replaced

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers if w is not None and w.alive()]

    def worker_info(self) -> list[dict]:
        """Each live worker's ping answer (pid, uid, RSS and peak RSS in KiB, and
        the largest peak RSS of a per-request runner it forked). Idle workers only."""
        out = []
        for w in list(self._workers):
            if w is not None and w.alive():
                with contextlib.suppress(WorkerDied):
                    out.append(w.ping())
        return out

    def cpu_seconds(self) -> float:
        """CPU used by the workers and their finished task trees so far."""
        return sum(w.cpu_seconds() for w in self._workers if w is not None)

    def stats(self) -> PoolStats:
        with self._lock:
            counts = dict(self._counts)
        return PoolStats(
            self.backend,
            self.config.workers,
            self._idle.qsize(),
            sum(v for k, v in counts.items() if k != "replaced"),
            counts.get("infra_error", 0),
            self.replaced,
            counts,
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for i, w in enumerate(self._workers):
            if w is not None:
                w.close()
                shutil.rmtree(w.conf["state_dir"], ignore_errors=True)
            self._workers[i] = None
        if self._tree is not None:
            self._tree.remove()
        if self._oneshot is not None:
            self._oneshot.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove_stale_state_dirs() -> None:
    """Worker state directories (empty mount points) left by owners that are gone."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if name.startswith(_cgroups.TREE_PREFIX):
            pid = name[len(_cgroups.TREE_PREFIX) :].split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def _special_files(folder: str, names: list[str]) -> set[str]:
    """FIFOs, sockets and devices a task made: a copy snapshot skips them (opening a FIFO would block)."""
    skip = set()
    for name in names:
        mode = os.lstat(os.path.join(folder, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skip.add(name)
    return skip


class Session:
    """Steps that share one work directory, with snapshot() and restore().

    fork-server: /task is an overlay over the session's layers, in a
    size-limited tmpfs private to the worker; snapshot() freezes the current
    upper layer (a rename) and restore(n) drops the layers above n, so both
    take milliseconds whatever the size of the tree. Other backends copy the
    directory (O(files)).
    """

    def __init__(self, pool: Pool, slot: int, files: dict, disk_bytes: int) -> None:
        self.pool, self.slot = pool, slot
        self.sid = uuid.uuid4().hex[:16]
        self.closed = False
        self._snaps: list[str] = []
        if pool.backend == "forkserver":
            self._call({"op": "session_open", "sid": self.sid, "files": files, "disk_bytes": disk_bytes})
            self.dir = None
        else:
            self.dir = tempfile.mkdtemp(prefix="posttrain-session-")
            os.makedirs(os.path.join(self.dir, "task"))
            os.chmod(os.path.join(self.dir, "task"), 0o777)
            write_files(os.path.join(self.dir, "task"), files)
            self._copy_snapshot()

    def _call(self, msg: dict) -> dict:
        w = self.pool._workers[self.slot]
        if w is None:
            raise SandboxError("session worker is gone")
        try:
            reply = w.call(msg, 30.0)
        except WorkerDied as exc:
            raise SandboxError(f"session worker died: {exc}") from exc
        if "infra_error" in reply:
            raise SandboxError(f"session {msg['op']}: {reply['infra_error']}")
        return reply

    def run(self, req: ExecRequest) -> ExecResult:
        if self.closed:
            raise SandboxError("session is closed")
        workdir = None if self.dir is None else os.path.join(self.dir, "task")
        result = self.pool._run_on(self.slot, req, self.sid if self.dir is None else None, workdir)
        self.pool._count(result.status)
        return result

    def snapshot(self) -> int:
        """Freeze the current state; returns an id for restore()."""
        if self.dir is None:
            return int(self._call({"op": "session_snapshot", "sid": self.sid})["snapshot"])
        return self._copy_snapshot()

    def _copy_snapshot(self) -> int:
        assert self.dir is not None
        dest = os.path.join(self.dir, f"snap{len(self._snaps)}")
        shutil.copytree(os.path.join(self.dir, "task"), dest, symlinks=True, ignore=_special_files)
        self._snaps.append(dest)
        return len(self._snaps) - 1

    def restore(self, snapshot: int) -> None:
        """Return to the state at `snapshot` (0 = the initial files)."""
        if snapshot < 0:
            raise ValueError(f"snapshot must be >= 0, got {snapshot}")
        if self.dir is None:
            self._call({"op": "session_restore", "sid": self.sid, "snapshot": snapshot})
            return
        if snapshot >= len(self._snaps):
            raise ValueError(f"unknown snapshot {snapshot}")
        task = os.path.join(self.dir, "task")
        shutil.rmtree(task)
        shutil.copytree(self._snaps[snapshot], task, symlinks=True, ignore=_special_files)
        for extra in self._snaps[snapshot + 1 :]:
            shutil.rmtree(extra, ignore_errors=True)
        del self._snaps[snapshot + 1 :]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.dir is None:
            with contextlib.suppress(SandboxError):
                self._call({"op": "session_close", "sid": self.sid})
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
