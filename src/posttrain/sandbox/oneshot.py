"""One-shot backends: bubblewrap (namespaces, no root needed) and unsafe
(rlimits only, for tests of the layer itself).

Invariant: each run gets a fresh host temp directory as its work directory,
removed afterwards (a session's directory is kept between its steps); request
files are written and collected files read without following a symlink
(`_fs`), so what a step left can make a later step fail, never write or read
outside the work directory; the process group is killed at the wall limit,
so a run returns within wall_s plus a short grace; output beyond the cap is
read and dropped, never buffered. posttrain's own package (`_hide`) is masked
in bubblewrap, and in unsafe where it starts as root (a private mount
namespace); a non-root unsafe run can read whatever its user can.
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

from posttrain.errors import ConfigError
from posttrain.sandbox import _fs, _hide, _imports, _linux
from posttrain.sandbox.probe import bwrap_base_args
from posttrain.sandbox.records import ExecRequest, ExecResult, Limits

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "USER": "sandbox"}
RO_TOP = ("usr", "etc", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "opt")


NOBODY = 65534


def _preexec(lim: Limits, nproc: bool, drop_root: bool, view=None) -> None:
    root = os.geteuid() == 0
    if view is not None:
        view()
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
    """Write request files below `base` without following a symlink (raises _fs.Conflict)."""
    _fs.write_files(base, files)


def _tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants (and what they reaped), read before a kill."""
    parent, ticks = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            parent[int(name)] = int(fields[1])
            ticks[int(name)] = sum(int(x) for x in fields[11:15])
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p in found:
            continue
        found.add(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return sum(ticks.get(p, 0) for p in found) / os.sysconf("SC_CLK_TCK")


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
    cpu_at_kill: float = 0.0


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
    cpu_at_kill = 0.0
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0 and not timed_out:
            timed_out = True
            cpu_at_kill = _tree_cpu(proc.pid)
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
    return _Pumped(bytes(bufs[o]), bytes(bufs[e]), total[o] > cap, total[e] > cap, timed_out, cpu_at_kill)


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

    def __init__(self, python: str, ro_binds: tuple[str, ...] = (), hidden: tuple[str, ...] = ()) -> None:
        self.python = python
        self.ro_binds = ro_binds
        self.hidden = hidden
        self.stub = _hide.make_stub() if hidden else None

    def view(self):
        """A callable run in the child before it drops root (a private mount view), or None."""
        return None

    def close(self) -> None:
        if self.stub:
            os.chmod(self.stub, 0o755)
            shutil.rmtree(self.stub, ignore_errors=True)
            self.stub = None

    def command(self, req: ExecRequest, workdir: str, imports: dict | None = None) -> tuple[list[str], str | None]:
        raise NotImplementedError

    @staticmethod
    def python_args(req: ExecRequest, imports: dict | None) -> list[str]:
        """The interpreter's arguments for a python_main run: the program confined to
        its work directory, the stdlib and what it declares (`_imports.boot`)."""
        imports = imports or {}
        boot = _imports.boot_source(req.python_main, imports.get("modules", ()), imports.get("dists", ()))
        return ["-E", "-s", "-c", boot]

    def run(self, req: ExecRequest, workdir: str | None = None, imports: dict | None = None) -> ExecResult:
        own = workdir is None
        workdir = workdir or tempfile.mkdtemp(prefix="posttrain-oneshot-")
        t0 = time.monotonic()
        try:
            try:
                write_files(workdir, req.files)
            except _fs.Conflict as exc:  # what an earlier step of the session left in the way
                return ExecResult(status="failed", error=str(exc), wall_s=time.monotonic() - t0, backend=self.name)
            os.chmod(workdir, 0o777 if own else os.stat(workdir).st_mode & 0o7777)
            if self.drop_root and os.geteuid() == 0:
                _chown_tree(workdir, NOBODY)
            argv, cwd = self.command(req, workdir, imports)
            env = dict(BASE_ENV, HOME=cwd or workdir, **req.env)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            lim = req.limits
            view = self.view()
            proc = subprocess.Popen(
                argv,
                cwd=cwd or workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                preexec_fn=lambda: _preexec(lim, self.nproc, self.drop_root, view),
            )
            p = pump(proc, req.stdin, lim.output_bytes, lim.wall_s)
            _killpg(proc)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = max((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p.cpu_at_kill)
            status, code, sig, error = classify(proc.returncode, p.timed_out, cpu, lim)
            files = {}
            for rel in req.collect:
                data = _fs.read_file(workdir, rel, lim.output_bytes)
                if data is not None:
                    files[rel] = data
            return ExecResult(
                status=status,
                exit_code=code,
                signal=sig,
                stdout=p.out,
                stderr=p.err,
                stdout_truncated=p.out_trunc,
                stderr_truncated=p.err_trunc,
                cpu_s=cpu,
                wall_s=time.monotonic() - t0,
                files=files,
                error=error,
                backend=self.name,
            )
        except (OSError, subprocess.SubprocessError) as exc:  # the latter: a failed private view in the child
            return ExecResult.infra(f"{self.name}: {exc}", self.name, time.monotonic() - t0)
        finally:
            if own:
                shutil.rmtree(workdir, ignore_errors=True)


class UnsafeBackend(OneShot):
    """rlimits, a wall timer and (when started as root) uid nobody only: NO
    isolation. Named explicitly, for tests of the layer itself.

    Started as root, each run also gets a private mount namespace in which
    posttrain's package is masked and, when uid nobody cannot search a folder
    on the way to the interpreter's prefix (a checkout in a 0700 folder), the
    prefix is bound at a world-searchable staging folder and run from there.
    Where that namespace cannot be made, such a folder is a ConfigError that
    names it."""

    name = "unsafe"
    nproc = True  # applied only when started as root (then counted for uid nobody)
    drop_root = True

    def __init__(
        self,
        python: str,
        ro_binds: tuple[str, ...] = (),
        hidden: tuple[str, ...] = (),
        *,
        prefix: str | None = None,
        private_mounts: bool = False,
    ) -> None:
        super().__init__(python, ro_binds, hidden)
        self.private = private_mounts and os.geteuid() == 0
        self.prefix = prefix or os.path.dirname(os.path.dirname(os.path.abspath(python)))
        self.stage: str | None = None
        if os.geteuid() == 0:
            self._check_reachable()

    def _check_reachable(self) -> None:
        real = os.path.realpath(self.python)
        if _hide.untraversable(real) is not None and not _hide.under(real, self.prefix):
            raise ConfigError(_unreachable(_hide.untraversable(real), self.python))
        blocked = _hide.untraversable(self.prefix)
        if blocked is None:
            return
        if not self.private:
            raise ConfigError(_unreachable(blocked, self.python))
        self.stage = tempfile.mkdtemp(prefix="posttrain-unsafe-python-")
        os.chmod(self.stage, 0o755)

    def _staged(self, path: str) -> str:
        path = os.path.abspath(path)
        if self.stage and _hide.under(path, self.prefix):
            return self.stage + path[len(self.prefix) :]
        return path

    def view(self):
        if not self.private:
            return None
        hidden, prefix, stage, stub = self.hidden, self.prefix, self.stage, self.stub

        def enter() -> None:
            _linux.unshare(_linux.CLONE_NEWNS)
            _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
            for path in hidden:
                _mask(path, stub)
            if stage:
                _linux.mount(prefix, stage, None, _linux.MS_BIND | _linux.MS_REC)

        return enter

    def command(self, req: ExecRequest, workdir: str, imports: dict | None = None) -> tuple[list[str], str | None]:
        if req.python_main:
            return [self._staged(self.python), *self.python_args(req, imports)], None
        argv = list(req.argv)
        if self.stage and argv[0].startswith("/"):
            argv[0] = self._staged(argv[0])
        return argv, None

    def close(self) -> None:
        if self.stage:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None
        super().close()


def _unreachable(folder: str, python: str) -> str:
    mode = os.stat(folder).st_mode & 0o7777 if os.path.exists(folder) else 0
    return (
        f"sandbox backend 'unsafe' runs tasks as uid nobody, which cannot search {folder} (mode {mode:o}) on the way "
        f"to the interpreter {python}; make that folder searchable (chmod o+x {folder}), put the checkout and its "
        "venv under a world-searchable folder, or use backend 'forkserver' or 'bwrap'"
    )


def _mask(path: str, stub: str) -> None:
    """Cover `path` (the stub package over a directory, /dev/null over a file), read-only."""
    if not os.path.lexists(path) or os.path.islink(path):
        return
    _linux.mount(stub if os.path.isdir(path) else "/dev/null", path, None, _linux.MS_BIND)
    _linux.mount(None, path, None, _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY)


class BwrapBackend(OneShot):
    """bubblewrap: fresh namespaces per run, read-only root, capabilities
    dropped (and uid 65534 in a user namespace when started as root)."""

    name = "bwrap"
    nproc = False  # RLIMIT_NPROC counts the real uid machine-wide: the pid namespace contains forks instead
    drop_root = False  # bubblewrap itself maps the task to uid 65534 in a user namespace

    def __init__(
        self, python: str, ro_binds: tuple[str, ...] = (), bwrap: str = "bwrap", hidden: tuple[str, ...] = ()
    ) -> None:
        super().__init__(python, ro_binds, hidden)
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
        bound = [r for r in ("/" + t for t in RO_TOP) if os.path.isdir(r) and not os.path.islink(r)] + list(
            self.ro_binds
        )
        for path in self.hidden:  # posttrain's package, wherever a bound tree holds it
            if os.path.lexists(path) and not os.path.islink(path) and any(_hide.under(path, b) for b in bound):
                args += ["--ro-bind", self.stub if os.path.isdir(path) else "/dev/null", path]
        for masked in ("/etc/shadow", "/etc/gshadow"):
            if os.path.exists(masked):
                args += ["--ro-bind", "/dev/null", masked]
        args += ["--proc", "/proc", "--dev", "/dev", "--hostname", "sandbox", "--clearenv"]
        return args

    def command(self, req: ExecRequest, workdir: str, imports: dict | None = None) -> tuple[list[str], str | None]:
        args = self.base + ["--bind", workdir, "/task", "--chdir", "/task", "--setenv", "HOME", "/task"]
        for key, value in {**BASE_ENV, **req.env}.items():
            args += ["--setenv", key, value]
        for site in (imports or {}).get("mask", ()):  # package folders the task finds empty (Pool._imports)
            if os.path.isdir(site):
                args += ["--tmpfs", site, "--remount-ro", site]
        inner = [self.python, *self.python_args(req, imports)] if req.python_main else list(req.argv)
        return args + ["--"] + inner, "/"
