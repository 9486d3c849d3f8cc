"""One-shot backends: bubblewrap (namespaces, no root needed) and unsafe
(rlimits only, for tests of the layer itself).

Invariant: each run gets a fresh host temp directory as its work directory,
removed afterwards; the process group is killed at the wall limit, so a run
returns within wall_s plus a short grace; output beyond the cap is read and
dropped, never buffered.
"""
from __future__ import annotations

import os
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from posttrain.sandbox.probe import bwrap_base_args
from posttrain.sandbox.records import ExecRequest, ExecResult, Limits

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "USER": "sandbox"}
RO_TOP = ("usr", "etc", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "opt")


NOBODY = 65534


def _preexec(lim: Limits, nproc: bool, drop_root: bool) -> None:
    root = os.geteuid() == 0
    _rlimits(lim, nproc and drop_root and root)  # NPROC only for nobody: a real user's count is machine-wide
    if drop_root and root:
        # even "unsafe" never runs model code as root: kill(-1) or a stray rm
        # as root would reach every process and file on the machine
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _rlimits(lim: Limits, nproc: bool) -> None:
    cpu = max(1, int(-(-lim.cpu_s // 1)))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_bytes, lim.file_bytes))
    resource.setrlimit(resource.RLIMIT_AS, (lim.memory_bytes * 4 + (1 << 30),) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim.open_files, lim.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (lim.pids, lim.pids))


def write_files(base: str, files) -> None:
    for rel, data in files.items():
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        raw = data.encode() if isinstance(data, str) else data
        with open(path, "wb") as fh:
            fh.write(raw)
        os.chmod(path, 0o755 if raw[:2] == b"#!" else 0o644)


def _chown_tree(top: str, uid: int) -> None:
    os.chown(top, uid, uid)
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            os.lchown(os.path.join(base, name), uid, uid)


@dataclass
class _Pumped:
    out: bytes
    err: bytes
    out_trunc: bool
    err_trunc: bool
    timed_out: bool


def pump(proc: subprocess.Popen, stdin: bytes, cap: int, wall_s: float) -> _Pumped:
    """Feed stdin, read both streams up to `cap`, kill the group at the wall."""
    deadline = time.monotonic() + wall_s
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    total = dict.fromkeys(bufs, 0)
    open_fds = set(bufs)
    data = memoryview(stdin)
    in_fd = proc.stdin.fileno()
    os.set_blocking(in_fd, False)
    if not data:
        proc.stdin.close()
        in_fd = -1
    timed_out = False
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0 and not timed_out:
            timed_out = True
            _killpg(proc)
            deadline = time.monotonic() + 5.0
            continue
        if left <= 0:
            break
        r, w, _ = select.select(list(open_fds), [in_fd] if in_fd >= 0 else [], [], min(left, 1.0))
        if w:
            try:
                n = os.write(in_fd, data[:65536])
                data = data[n:]
            except OSError:
                data = memoryview(b"")
            if not data:
                proc.stdin.close()
                in_fd = -1
        for fd in r:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
                continue
            total[fd] += len(chunk)
            room = cap - len(bufs[fd])
            if room > 0:
                bufs[fd] += chunk[:room]
    if in_fd >= 0:
        proc.stdin.close()
    o, e = proc.stdout.fileno(), proc.stderr.fileno()
    return _Pumped(bytes(bufs[o]), bytes(bufs[e]), total[o] > cap, total[e] > cap, timed_out)


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def classify(returncode: int, timed_out: bool, cpu_s: float, lim: Limits) -> tuple[str, int | None, int | None, str]:
    """(status, exit_code, signal, error) from a finished process."""
    if timed_out:
        return "timeout", None, None, f"wall limit {lim.wall_s}s"
    if returncode >= 0:
        return ("ok" if returncode == 0 else "failed"), returncode, None, ""
    sig = -returncode
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= lim.cpu_s):
        return "timeout", None, sig, f"cpu limit {lim.cpu_s}s"
    return "killed", None, sig, ""


class OneShot:
    """Shared run loop of the bwrap and unsafe backends."""

    name = "oneshot"

    def __init__(self, python: str, ro_binds: tuple[str, ...] = ()) -> None:
        self.python = python
        self.ro_binds = ro_binds

    def command(self, req: ExecRequest, workdir: str) -> tuple[list[str], str | None]:
        raise NotImplementedError

    def run(self, req: ExecRequest, workdir: str | None = None) -> ExecResult:
        own = workdir is None
        workdir = workdir or tempfile.mkdtemp(prefix="posttrain-oneshot-")
        t0 = time.monotonic()
        try:
            write_files(workdir, req.files)
            os.chmod(workdir, 0o777 if own else os.stat(workdir).st_mode & 0o7777)
            if self.drop_root and os.geteuid() == 0:
                _chown_tree(workdir, NOBODY)
            argv, cwd = self.command(req, workdir)
            env = dict(BASE_ENV, HOME=cwd or workdir, **req.env)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            lim = req.limits
            proc = subprocess.Popen(argv, cwd=cwd or workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                    preexec_fn=lambda: _preexec(lim, self.nproc, self.drop_root))
            p = pump(proc, req.stdin, lim.output_bytes, lim.wall_s)
            _killpg(proc)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            status, code, sig, error = classify(proc.returncode, p.timed_out, cpu, lim)
            files = {}
            for rel in req.collect:
                path = os.path.join(workdir, rel)
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as fh:
                        files[rel] = fh.read(lim.output_bytes)
            return ExecResult(status=status, exit_code=code, signal=sig, stdout=p.out, stderr=p.err,
                              stdout_truncated=p.out_trunc, stderr_truncated=p.err_trunc, cpu_s=cpu,
                              wall_s=time.monotonic() - t0, files=files, error=error, backend=self.name)
        except OSError as exc:
            return ExecResult.infra(f"{self.name}: {exc}", self.name, time.monotonic() - t0)
        finally:
            if own:
                shutil.rmtree(workdir, ignore_errors=True)


class UnsafeBackend(OneShot):
    """rlimits, a wall timer and (when started as root) uid nobody only: NO
    isolation. Named explicitly, for tests of the layer itself."""

    name = "unsafe"
    nproc = True  # applied only when started as root (then counted for uid nobody)
    drop_root = True

    def command(self, req: ExecRequest, workdir: str) -> tuple[list[str], str | None]:
        if req.python_main:
            return [self.python, "-E", "-s", req.python_main], None
        return list(req.argv), None


class BwrapBackend(OneShot):
    """bubblewrap: fresh namespaces per run, read-only root, capabilities
    dropped (and uid 65534 in a user namespace when started as root)."""

    name = "bwrap"
    nproc = False  # RLIMIT_NPROC counts the real uid machine-wide: the pid namespace contains forks instead
    drop_root = False  # bubblewrap itself maps the task to uid 65534 in a user namespace

    def __init__(self, python: str, ro_binds: tuple[str, ...] = (), bwrap: str = "bwrap") -> None:
        super().__init__(python, ro_binds)
        self.bwrap = bwrap
        self.base = self._base_args()

    def _base_args(self) -> list[str]:
        args = bwrap_base_args(self.bwrap, os.geteuid() == 0)
        args += ["--tmpfs", "/tmp"]  # first, so read-only binds below /tmp (a venv there) stay visible
        for top in RO_TOP:
            host = "/" + top
            if os.path.islink(host):
                args += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                args += ["--ro-bind", host, host]
        for path in self.ro_binds:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        for masked in ("/etc/shadow", "/etc/gshadow"):
            if os.path.exists(masked):
                args += ["--ro-bind", "/dev/null", masked]
        args += ["--proc", "/proc", "--dev", "/dev", "--hostname", "sandbox", "--clearenv"]
        return args

    def command(self, req: ExecRequest, workdir: str) -> tuple[list[str], str | None]:
        args = self.base + ["--bind", workdir, "/task", "--chdir", "/task", "--setenv", "HOME", "/task"]
        for key, value in {**BASE_ENV, **req.env}.items():
            args += ["--setenv", key, value]
        inner = [self.python, "-E", "-s", req.python_main] if req.python_main else list(req.argv)
        return args + ["--"] + inner, "/"
