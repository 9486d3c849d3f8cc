"""posttrain.sandbox: run model-written programs under enforced limits.

Invariant: a program's fate is an `ExecResult` whose status is one of ok,
failed, timeout, oom, killed (what the program did) or infra_error (what the
sandbox failed to do); infra_error is never a score, and `raise_for_infra`
turns it into SandboxError for verifiers. A limit the chosen backend cannot
enforce is a ConfigError at start-up, never a silent downgrade.

API (module level, one process-wide pool, created on first use):

    from posttrain import sandbox
    res = sandbox.run(sandbox.ExecRequest(files={"main.py": src}, python_main="main.py",
                                          limits=sandbox.Limits(wall_s=5)))
    res.status, res.exit_code, res.stdout, res.cpu_s
    with sandbox.get_pool().session({"notes.txt": "hi"}) as s:   # multi-step, overlay root
        s.run(sandbox.ExecRequest(argv=("sh", "-c", "echo more >> notes.txt")))
        snap = s.snapshot(); ...; s.restore(snap)
    pool = sandbox.Pool(SandboxConfig(workers=4, domain_limits={"code": 2}))  # posttrain.configs.sandbox
    await pool.arun(req, domain="code")        # per-domain concurrency caps

Covered by the default (fork-server) backend, each with an adversarial test
in tests/sandbox/: no network (fresh net namespace, only a downed loopback);
a read-only root with fresh size-limited tmpfs at /task (work dir) and /tmp,
/etc/shadow masked, so no writes outside the work directory and no reading
of secrets or of the parent's environment (fresh pid namespace and /proc,
clean environment); a non-root uid per slot with every capability dropped
and no_new_privs; a seccomp filter (mount, unshare, setns, ptrace, bpf,
keyctl, namespace flags of clone, ...); cgroup memory (OOM kill reported as
oom), pids (fork bombs) and cpu quota, under the process's own cgroup (v1 or
v2); rlimits for CPU time, file size, address space, processes and open
files; a parent-side wall timer and output cap; setsid per task; descriptors
above 2 closed; when a task ends every process of it is killed (pid
namespace teardown plus a cgroup sweep), so daemons do not survive and the
next task sees a fresh /task. The warm worker is a clean template that
never reads a request or a result: each run (and session open) is read and
served by a fresh runner forked from it, which forks the task tree and
exits, so no task finds an earlier request's bytes (source, stdin, files,
argv, env, outputs: a group-mate's solution) or another session's in any
memory it can read (tests/sandbox/test_sandbox_leaks.py, worker memory);
bubblewrap and unsafe start a new process per run. A worker (or runner)
killed mid-task yields infra_error and the worker is replaced; callers never wait past acquire timeout + wall + grace.
A `python_main` program imports only from its work directory, the stdlib
and the packages its request declares (`ExecRequest.packages`, with what
they require: `packages`, `_imports`), in every backend, so a verdict does
not depend on what else the venv holds. posttrain's own package (its hidden
task data) is masked in every backend and install layout (`_hide`); request files are written, and collected
files read, without following a symlink (`_fs`), so a session step's
leftovers make a later step `failed` with a reason, never a write outside
the task, and session layers are read-only; the venv is mounted at /venv
and session overlays by relative paths, with a cgroup namespace, so
/proc/self/mountinfo and /proc/self/cgroup show no host path or pid.

Not covered: kernel exploits (the kernel is shared; seccomp is a deny list,
not an allow list); timing side channels and CPU contention between tasks;
reading world-readable host files under the bound read-only directories
(/usr, /etc except shadow files, the interpreter prefix); the memory limit
includes about 16 MiB of slack for the worker's own processes in the slot;
the bubblewrap backend enforces no cgroup limits (memory only via
RLIMIT_AS, processes only via its pid namespace and the wall timer) and its
mountinfo shows the host paths of its binds; unsafe enforces nothing but
rlimits and the wall timer, and hides posttrain's package only from its
task's python path (as root), not the rest of the host. A task's memory
holds its own request (a session step's, its own step): what the request
carries is the task's to read; the pool's own process holds every request
and result but is never forked from for a task.
"""

from __future__ import annotations

import atexit
import threading

from posttrain.configs.sandbox import SandboxConfig
from posttrain.errors import SandboxError
from posttrain.sandbox.pool import Pool, PoolStats, Session
from posttrain.sandbox.probe import Probe, probe, select_backend
from posttrain.sandbox.records import STATUSES, ExecRequest, ExecResult, Limits, Status

__all__ = [
    "ExecRequest",
    "ExecResult",
    "Limits",
    "Status",
    "STATUSES",
    "Pool",
    "PoolStats",
    "Session",
    "Probe",
    "probe",
    "select_backend",
    "get_pool",
    "set_pool_config",
    "run",
    "raise_for_infra",
    "close_pool",
]

_POOL: Pool | None = None
_CONFIG: SandboxConfig | None = None
_LOCK = threading.Lock()


def set_pool_config(config: SandboxConfig) -> None:
    """Configure the process-wide pool (before its first use, or it is replaced)."""
    global _CONFIG
    with _LOCK:
        _CONFIG = config
    close_pool()


def get_pool() -> Pool:
    """The process-wide pool, started on first use and closed at exit."""
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL.closed:
            _POOL = Pool(_CONFIG)
        return _POOL


def close_pool() -> None:
    global _POOL
    with _LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


def run(req: ExecRequest, *, domain: str | None = None) -> ExecResult:
    """Run one request on the process-wide pool."""
    return get_pool().run(req, domain=domain)


def raise_for_infra(result: ExecResult) -> ExecResult:
    """Return `result`, or raise SandboxError if the sandbox (not the program) failed."""
    if result.status == "infra_error":
        raise SandboxError(f"sandbox infra error ({result.backend}): {result.error}")
    return result


atexit.register(close_pool)
