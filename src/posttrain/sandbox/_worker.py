"""The fork-server worker: a warm, root Python that runs one task at a time.

Invariant: the worker is a clean template (a zygote) that never holds a
byte of any request or result: it reads only small control frames (an op
name, a session id, a snapshot number) and, for a request, forks a runner R
that reads that one request from a socket the pool handed over, serves it
and exits. So the memory a task inherits is the zygote's (set-up only) plus
its own request's, never an earlier request's, a group-mate's or another
session's. Every task runs in a process tree forked from its runner in
fresh mount, pid, net, ipc and uts namespaces, in the slot's cgroup, as the
slot's non-root uid with no capabilities under seccomp, in a read-only root
where posttrain's package is masked and no mount names a host folder;
request files are written without following a symlink; when the task ends
(exit, limit or timeout) every process of it is gone before the result is
sent. Neither the worker nor a runner runs task code itself.

Run as a script (`python -E -s _worker.py FD`), importing only the stdlib,
pyseccomp and its sibling modules by file, so it stays small and warm.

Process tree of one request:
    worker (zygote) ── R (runner: reads the request; setsid, a pid namespace for its child; pumps, answers, exits)
                        └─ C2 (pid 1 of the new pid namespace; unshares mount, net, ipc, uts, cgroup;
                             mounts, pivot_root, reaper)
                             └─ C3 (drops to the slot uid, rlimits, seccomp, runs the task)
"""

from __future__ import annotations

import gc
import importlib
import io
import os
import resource
import select
import shutil
import signal
import socket
import sys
import time
import traceback

import _cgroups
import _fs
import _imports
import _linux
import _proto

WORKDIR = "/task"
VENV_AT = "/venv"  # where the interpreter's venv is mounted; its host path is a relative symlink to it
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "USER": "sandbox",
}
RO_TOP = ("usr", "etc", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "opt")
DEVICES = ("null", "zero", "full", "random", "urandom")
MASKED = ("etc/shadow", "etc/gshadow", "etc/shadow-", "etc/gshadow-")
KILL_GRACE_S = 5.0
CG_MEMORY_SLACK = 16 << 20
OWN_PROCS = 3  # the worker, R and C2 also count against the slot's pids limit
CONTROL_OPS = frozenset({"ping", "session_snapshot", "session_restore", "session_close"})  # no request bytes


class Worker:
    def __init__(self, conf: dict) -> None:
        self.conf = conf
        self.uid, self.gid = conf["uid"], conf["gid"]
        self.state = conf["state_dir"]
        self.root = os.path.join(self.state, "root")
        self.sessions = os.path.join(self.state, "sessions")
        self.pid = os.getpid()
        self.hidden = tuple(conf.get("hidden", ()))
        self.venv = conf.get("venv")
        self.python_path = [
            p for p in (conf.get("python_path") or sys.path[1:]) if not any(_under(p, h) for h in self.hidden)
        ]
        self.stdlib = _imports.stdlib_paths(self.python_path)  # what a python_main program imports from
        self.site = _imports.site_paths()  # where its declared packages are found
        self.cgroupns = False
        h = conf.get("cgroup")
        self.cg = None
        if h is not None:
            tree = _cgroups.Tree(_cgroups.Hierarchy(h["version"], h["dirs"]), owner_pid=h["owner_pid"], tag=h["tag"])
            self.cg = tree.task(f"slot-{conf['slot']}")
        self.filter = None
        if conf.get("seccomp", True):
            import _seccomp

            self.filter = _seccomp.build()
        for name in ("runpy", "pkgutil", "traceback", *conf.get("preimport", ())):
            try:
                importlib.import_module(name)
            except Exception:  # a missing optional module is not fatal
                pass
        self.std_modules = _imports.stdlib_modules(self.stdlib)  # confine skips them in each task

    # ---- start-up: a private mount namespace and the read-only root skeleton
    def setup(self) -> None:
        _set_oom_adj(-1000)
        if self.cg is not None:
            self.cg.create(64 << 20, 8, 1.0)
            self.cg.join()
        _linux.unshare(_linux.CLONE_NEWNS)
        _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.sessions, exist_ok=True)
        _linux.mount("tmpfs", self.sessions, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=4k,mode=0700")
        _linux.mount("tmpfs", self.root, "tmpfs", _linux.MS_NOSUID, "size=1m,mode=0755")
        self.cgroupns = _can_unshare(_linux.CLONE_NEWCGROUP)
        self.stub = self._make_stub()
        binds = []
        for top in RO_TOP:
            host = "/" + top
            if os.path.islink(host):
                os.symlink(os.readlink(host), os.path.join(self.root, top))
            elif os.path.isdir(host):
                binds.append(host)
        binds += [p for p in self.conf.get("ro_binds", ()) if os.path.exists(p)]
        for host in binds:
            self._bind_ro(host, os.path.join(self.root, host.lstrip("/")))
        if self.venv:
            self._mount_venv(self.venv)
        self._mask_hidden(self.root)
        for masked in MASKED:
            target = os.path.join(self.root, masked)
            if os.path.exists(target):
                _linux.mount("/dev/null", target, None, _linux.MS_BIND)
        for d in ("task", "tmp", "proc", "dev", ".old"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        self._make_dev(os.path.join(self.root, "dev"))
        _linux.mount(None, self.root, None, _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID)

    def _bind_ro(self, host: str, target: str) -> None:
        if os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _linux.mount(host, target, None, _linux.MS_BIND)
        _linux.mount(
            None,
            target,
            None,
            _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV,
        )

    def _make_stub(self) -> str:
        """A read-only tmpfs holding only an __init__.py that raises ImportError:
        what a masked directory shows (an empty one imports as a namespace package)."""
        stub = os.path.join(self.state, "stub")
        os.makedirs(stub, exist_ok=True)
        _linux.mount("tmpfs", stub, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=4k,mode=0755")
        with open(os.path.join(stub, "__init__.py"), "wb") as fh:
            fh.write(b'raise ImportError("posttrain is not available inside the sandbox")\n')
        os.chmod(os.path.join(stub, "__init__.py"), 0o644)
        _linux.mount(None, stub, None, _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV)
        return stub

    def _mount_venv(self, host: str) -> None:
        """The venv as a read-only overlay at /venv whose mount options name
        only /proc/self/fd/N (so /proc/self/mountinfo shows no host path), and
        its host path a relative symlink to it (module paths, sys.executable)."""
        target = self.root + VENV_AT
        os.makedirs(target, exist_ok=True)
        empty = os.path.join(self.state, "empty")
        os.makedirs(empty, exist_ok=True)
        _linux.mount(
            "tmpfs", empty, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV | _linux.MS_RDONLY, "size=4k,mode=0555"
        )
        fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in (host, empty)]
        try:
            lower = ":".join(f"/proc/self/fd/{fd}" for fd in fds)
            _linux.mount(
                "overlay", target, "overlay", _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV, f"lowerdir={lower}"
            )
        except OSError:  # no overlay over this file system: bind it (its host path then shows in mountinfo)
            os.rmdir(target)
            self.venv = None
            self._bind_ro(host, self.root + host)
            return
        finally:
            for fd in fds:
                os.close(fd)
            _linux.umount2(empty, _linux.MNT_DETACH)
        self._link_venv(self.root)

    def _link_venv(self, root: str) -> None:
        link = root + self.venv
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(VENV_AT, os.path.dirname(self.venv)), link)

    def _inner(self, host: str) -> str:
        """Where a host path lies inside the task's root."""
        if self.venv and _under(host, self.venv):
            return VENV_AT + host[len(self.venv) :]
        return host

    def _mask_hidden(self, root: str, only_under: str = "/") -> None:
        """Cover each hidden path a task could reach: the stub over a
        directory, /dev/null over a file."""
        for host in self.hidden:
            inner = self._inner(host)
            target = root + inner
            if not _under(inner, only_under) or not os.path.lexists(target) or os.path.islink(target):
                continue
            if not _under(os.path.realpath(target), root):
                continue
            _linux.mount(self.stub if os.path.isdir(target) else "/dev/null", target, None, _linux.MS_BIND)
            _linux.mount(
                None,
                target,
                None,
                _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV,
            )

    def _make_dev(self, dev: str) -> None:
        for name in DEVICES:
            target = os.path.join(dev, name)
            open(target, "a").close()
            _linux.mount(f"/dev/{name}", target, None, _linux.MS_BIND)
        os.makedirs(os.path.join(dev, "shm"), exist_ok=True)
        for name, to in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(to, os.path.join(dev, name))

    # ---- the request loop
    def serve(self, sock: socket.socket) -> None:
        """The zygote's loop: control ops are answered here; a `fork` frame
        brings a socket, and a fresh runner serves the request on it."""
        fd = sock.fileno()
        while True:
            try:
                msg, fds = _proto.read_control(sock)
            except EOFError:
                return
            if msg.get("op") == "fork" and len(fds) == 1:
                self._fork_runner(fds[0], fd)
                continue
            for extra in fds:
                os.close(extra)
            if msg.get("op") not in CONTROL_OPS:
                reply = {"infra_error": f"op {msg.get('op')!r} is not served on the control channel"}
            else:
                reply = self._dispatch(msg, (fd,))
            _proto.write_frame(fd, reply)

    def _dispatch(self, msg: dict, watch: tuple[int, ...]) -> dict:
        try:
            return getattr(self, "op_" + msg["op"])(msg, watch)
        except Exception as exc:  # an infra failure of this worker, reported not raised
            return {"infra_error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=4)}

    def _fork_runner(self, chan: int, ctl: int) -> None:
        """Fork R for one request on `chan`, then reap it (R reaps its task tree).
        The zygote never reads `chan`: what R reads dies with R."""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() == self.pid:
                    self._runner(chan, ctl)
                    code = 0
            finally:
                os._exit(code)
        os.close(chan)
        os.waitpid(pid, 0)

    def _runner(self, chan: int, ctl: int) -> None:
        """R: read one FORKED_OPS frame from `chan`, serve it, answer on `chan`.
        Either channel becoming readable while a task runs means the pool is gone."""
        try:
            msg = _proto.read_frame(chan)
        except EOFError:
            return
        if msg.get("op") not in _proto.FORKED_OPS:
            reply = {"infra_error": f"op {msg.get('op')!r} is not served by a runner"}
        else:
            reply = self._dispatch(msg, (ctl, chan))
        reply["runner_peak_rss_kb"] = _status_kb("VmHWM")
        _proto.write_frame(chan, reply)

    def op_ping(self, msg: dict, watch: tuple[int, ...]) -> dict:
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over execve from the
        # pre-exec fork of the (large) parent, which is not this worker's size
        return {"pid": os.getpid(), "peak_rss_kb": _status_kb("VmHWM"), "rss_kb": _status_kb("VmRSS"), "uid": self.uid}

    def op_session_open(self, msg: dict, watch: tuple[int, ...]) -> dict:
        path = self._session_dir(msg["sid"])
        os.makedirs(path)
        _linux.mount(
            "tmpfs", path, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, f"size={int(msg['disk_bytes'])},mode=0700"
        )
        for d in ("base", "layers", "upper", "work"):
            os.mkdir(os.path.join(path, d))
        _fs.write_files(os.path.join(path, "base"), msg.get("files", {}), self.uid, self.gid)
        _freeze(os.path.join(path, "base"))
        os.chown(os.path.join(path, "upper"), self.uid, self.gid)
        return {"ok": True}

    def op_session_snapshot(self, msg: dict, watch: tuple[int, ...]) -> dict:
        path = self._session_dir(msg["sid"])
        n = len(os.listdir(os.path.join(path, "layers")))
        os.rename(os.path.join(path, "upper"), os.path.join(path, "layers", str(n)))
        _freeze(os.path.join(path, "layers", str(n)))
        os.mkdir(os.path.join(path, "upper"))
        os.chown(os.path.join(path, "upper"), self.uid, self.gid)
        return {"snapshot": n + 1}

    def op_session_restore(self, msg: dict, watch: tuple[int, ...]) -> dict:
        path = self._session_dir(msg["sid"])
        keep = int(msg["snapshot"])
        layers = os.path.join(path, "layers")
        for name in os.listdir(layers):
            if int(name) >= keep:
                _linux.umount2(os.path.join(layers, name), _linux.MNT_DETACH)
                shutil.rmtree(os.path.join(layers, name))
        shutil.rmtree(os.path.join(path, "upper"))
        os.mkdir(os.path.join(path, "upper"))
        os.chown(os.path.join(path, "upper"), self.uid, self.gid)
        return {"snapshot": keep}

    def op_session_close(self, msg: dict, watch: tuple[int, ...]) -> dict:
        path = self._session_dir(msg["sid"])
        if os.path.isdir(path):
            _linux.umount2(path, _linux.MNT_DETACH)
            os.rmdir(path)
        return {"ok": True}

    def _session_dir(self, sid: str) -> str:
        if not sid.isalnum():
            raise ValueError(f"bad session id {sid!r}")
        return os.path.join(self.sessions, sid)

    def _overlay_opts(self, sid: str) -> tuple[str, str]:
        """(session directory, overlay options relative to it): mounted from
        inside that directory, so mountinfo shows no host path."""
        path = self._session_dir(sid)
        layers = sorted((int(n) for n in os.listdir(os.path.join(path, "layers"))), reverse=True)
        lower = ":".join([f"layers/{n}" for n in layers] + ["base"])
        return path, f"lowerdir={lower},upperdir=upper,workdir=work,index=off,redirect_dir=off,metacopy=off"

    def op_run(self, msg: dict, watch: tuple[int, ...]) -> dict:
        """Run one task (in R): its tree is forked from R, whose memory is the
        zygote's plus this request."""
        req = msg["req"]
        lim = req["limits"]
        oom0 = 0
        if self.cg is not None:
            # the slot also holds the worker, R and C2: a little slack for them
            self.cg.set_limits(lim["memory_bytes"] + CG_MEMORY_SLACK, lim["pids"] + OWN_PROCS, lim["cpus"])
            oom0 = self.cg.oom_kills()
        overlay = self._overlay_opts(req["session"]) if req.get("session") else None
        try:
            return Task(self, req, oom0, overlay).run(watch)
        finally:
            if self.cg is not None and not self.cg.kill_all(keep=(self.pid, os.getpid())):
                raise RuntimeError("task processes survived SIGKILL")


class Task:
    """One run: fork the tree, feed stdin, collect output, enforce the wall."""

    def __init__(self, worker: Worker, req: dict, oom0: int, overlay: tuple[str, str] | None) -> None:
        self.w, self.req, self.oom0, self.overlay = worker, req, oom0, overlay
        self.cg = worker.cg
        self.lim = req["limits"]
        self.keep = (worker.pid, os.getpid())  # the worker and R: not the task's

    def run(self, watch: tuple[int, ...]) -> dict:
        """In R (a process of this one request): a new session and a pid
        namespace for R's children, then fork C2, the task's pid 1 (which
        unshares the other namespaces for itself), and pump."""
        pipes = {name: os.pipe() for name in ("in", "out", "err", "st")}
        t0 = time.monotonic()
        os.setsid()
        _linux.unshare(_linux.CLONE_NEWPID)
        c2 = os.fork()
        if c2 == 0:
            _init_main(self, pipes)
        for name, (r, w) in pipes.items():
            os.close(r if name == "in" else w)
        res = self._pump(c2, pipes, t0, watch)
        res["wall_s"] = time.monotonic() - t0
        return res

    def _pump(self, c2: int, pipes: dict, t0: float, watch: tuple[int, ...]) -> dict:
        cap = int(self.lim["output_bytes"])
        bufs = {"out": bytearray(), "err": bytearray(), "st": bytearray()}
        total = {"out": 0, "err": 0}
        fds = {pipes["out"][0]: "out", pipes["err"][0]: "err", pipes["st"][0]: "st"}
        stdin = memoryview(self.req.get("stdin", b""))
        in_fd = pipes["in"][1]
        os.set_blocking(in_fd, False)
        if not stdin:
            os.close(in_fd)
            in_fd = -1
        deadline = t0 + float(self.lim["wall_s"])
        timed_out = parent_gone = False
        cpu_at_kill = 0.0
        while fds:
            now = time.monotonic()
            if now > deadline and not timed_out:
                timed_out = True
                cpu_at_kill = self._tree_cpu()
                _kill(c2)
            if timed_out and now > deadline + KILL_GRACE_S:
                break
            wait = max(0.0, (deadline if not timed_out else deadline + KILL_GRACE_S) - now)
            r, w, _ = select.select(list(fds) + list(watch), [in_fd] if in_fd >= 0 else [], [], min(wait, 1.0))
            if any(fd in watch for fd in r) and not parent_gone:
                parent_gone = True  # the pool closed a channel: abandon the task
                timed_out = True
                cpu_at_kill = self._tree_cpu()
                _kill(c2)
            if w:
                try:
                    n = os.write(in_fd, stdin[:65536])
                    stdin = stdin[n:]
                except OSError:  # the task closed its stdin
                    stdin = memoryview(b"")
                if not stdin:
                    os.close(in_fd)
                    in_fd = -1
            for fd in r:
                if fd in watch:
                    continue
                name = fds[fd]
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    del fds[fd]
                    os.close(fd)
                    continue
                if name == "st":
                    bufs["st"] += chunk
                    continue
                total[name] += len(chunk)
                room = cap - len(bufs[name])
                if room > 0:
                    bufs[name] += chunk[:room]
        for fd in fds:
            os.close(fd)
        if in_fd >= 0:
            os.close(in_fd)
        if timed_out:
            _kill(c2)  # again: past the grace, C2 may still live; killing it ends its pid namespace
        _, wstatus, ru = os.wait4(c2, 0)  # then op_run sweeps the slot cgroup
        frames = _proto.split_frames(bytes(bufs["st"]))
        final = next((f for f in frames if "kind" in f), None)
        res = {
            "stdout": bytes(bufs["out"]),
            "stderr": bytes(bufs["err"]),
            "stdout_truncated": total["out"] > cap,
            "stderr_truncated": total["err"] > cap,
            "cpu_s": max(ru.ru_utime + ru.ru_stime, cpu_at_kill),
            "exit_code": None,
            "signal": None,
            "files": {},
            "error": "",
        }
        res.update(self._status(final, timed_out, parent_gone))
        return res

    def _status(self, final: dict | None, timed_out: bool, parent_gone: bool) -> dict:
        if parent_gone:
            return {"status": "infra_error", "error": "pool closed the worker channel"}
        oom = self.cg is not None and self.cg.oom_kills() > self.oom0
        if final is not None and final["kind"] == "setup_error":
            return {"status": "infra_error", "error": final["error"]}
        if final is not None and final["kind"] == "conflict":  # what an earlier step left: this step's failure
            return {"status": "failed", "error": final["error"]}
        if timed_out:
            return {"status": "timeout", "error": f"wall limit {self.lim['wall_s']}s"}
        if final is None:
            if oom:
                return {"status": "oom"}
            return {"status": "infra_error", "error": "task tree ended without a status"}
        out = {"files": final.get("files", {})}
        if final["kind"] == "signal":
            sig = final["signal"]
            out["signal"] = sig
            if oom:
                out["status"] = "oom"
            elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and final.get("cpu_s", 0) >= self.lim["cpu_s"]):
                out["status"], out["error"] = "timeout", f"cpu limit {self.lim['cpu_s']}s"
            else:
                out["status"] = "killed"
            return out
        out["exit_code"] = final["code"]
        out["status"] = "oom" if oom and final["code"] != 0 else ("ok" if final["code"] == 0 else "failed")
        return out

    def _tree_cpu(self) -> float:
        """CPU seconds of the task's processes still alive (and the children
        they reaped), read before a kill: a killed tree reports no rusage."""
        if self.cg is None:
            return 0.0
        total = 0
        for pid in self.cg.pids():
            if pid in self.keep:
                continue
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                total += sum(int(x) for x in fields[11:15])
            except (OSError, IndexError, ValueError):
                pass
        return total / os.sysconf("SC_CLK_TCK")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- the task tree (runs in forked children; never returns)
def _init_main(task: Task, pipes: dict) -> None:
    st = pipes["st"][1]
    try:
        _close_except({pipes["in"][0], pipes["out"][1], pipes["err"][1], st})  # R's channels above all
        _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        flags = _linux.CLONE_NEWNS | _linux.CLONE_NEWNET | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS
        _linux.unshare(flags | (_linux.CLONE_NEWCGROUP if task.w.cgroupns else 0))  # R keeps the worker's
        _mount_task_root(task)
        try:
            _fs.write_files(task.w.root + WORKDIR, task.req.get("files", {}), task.w.uid, task.w.gid)
        except _fs.Conflict as exc:
            _proto.write_frame(st, {"kind": "conflict", "error": str(exc)})
            os._exit(0)
        _enter_task_root(task)
        c3 = os.fork()
        if c3 == 0:
            _task_main(task, pipes)
        _close_task_ends(pipes)
    except BaseException as exc:
        _setup_failed(st, "C2", exc)
    final = _reap(c3)
    final["files"] = _collect(task.req.get("collect", ()), int(task.lim["output_bytes"]))
    _proto.write_frame(st, final)
    os._exit(0)


def _close_except(keep: set) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _close_task_ends(pipes: dict) -> None:
    for fd in (pipes["in"][0], pipes["out"][1], pipes["err"][1]):
        os.close(fd)


def _reap(c3: int) -> dict:
    final: dict = {"kind": "exit", "code": 0}
    while True:
        try:
            pid, status, ru = os.wait4(-1, 0)
        except ChildProcessError:
            return final
        except InterruptedError:
            continue
        if pid == c3:
            final["cpu_s"] = ru.ru_utime + ru.ru_stime
            if os.WIFSIGNALED(status):
                final.update(kind="signal", signal=os.WTERMSIG(status))
            else:
                final["code"] = os.WEXITSTATUS(status)
            try:
                os.kill(-1, signal.SIGKILL)  # every other process of the namespace
            except ProcessLookupError:
                pass


def _mount_task_root(task: Task) -> None:
    w, lim = task.w, task.lim
    root = w.root
    disk = int(lim["disk_bytes"])
    _linux.sethostname("sandbox")
    flags = _linux.MS_NOSUID | _linux.MS_NODEV
    if task.overlay:
        where, opts = task.overlay
        os.chdir(where)
        _linux.mount("overlay", root + "/task", "overlay", flags, opts)
        os.chdir("/")
    else:
        _linux.mount("tmpfs", root + "/task", "tmpfs", flags, f"size={disk},mode=0755,uid={w.uid},gid={w.gid}")
    _linux.mount("tmpfs", root + "/tmp", "tmpfs", flags, f"size={disk},mode=1777")
    _linux.mount("tmpfs", root + "/dev/shm", "tmpfs", flags | _linux.MS_NOEXEC, "size=8m,mode=1777")
    for host in w.conf.get("ro_binds", ()):  # the fresh /tmp hides read-only binds below it (a venv in /tmp)
        if host.startswith("/tmp/") and os.path.exists(host):
            w._bind_ro(host, root + host)
    if w.venv and w.venv.startswith("/tmp/"):
        w._link_venv(root)
    w._mask_hidden(root, "/tmp")
    masked = (task.req.get("imports") or {}).get("mask", ())  # found empty, even by path (Pool._imports)
    for inner in dict.fromkeys(root + w._inner(site) for site in masked):
        if os.path.isdir(inner) and not os.path.islink(inner):
            _linux.mount("tmpfs", inner, "tmpfs", flags | _linux.MS_RDONLY, "size=4k,mode=0555")


def _enter_task_root(task: Task) -> None:
    root = task.w.root
    _linux.pivot_root(root, root + "/.old")
    os.chdir("/")
    _linux.umount2("/.old", _linux.MNT_DETACH)
    _linux.mount("proc", "/proc", "proc", _linux.MS_NOSUID | _linux.MS_NODEV | _linux.MS_NOEXEC)


def _task_main(task: Task, pipes: dict) -> None:
    st = pipes["st"][1]  # kept (close-on-exec) only to report a failed set-up
    try:
        os.dup2(pipes["in"][0], 0)
        os.dup2(pipes["out"][1], 1)
        os.dup2(pipes["err"][1], 2)
        _close_except({st})
        os.set_inheritable(st, False)
        _set_oom_adj(1000)
        _set_rlimits(task.lim)
        # entered as root, before the uid drop: a work directory an earlier step of the session
        # made unsearchable (chmod 000 .) is the task's own state, so its commands fail on it
        # (EACCES, a result) as a shell left in it would, never this set-up (an infra error)
        os.chdir(WORKDIR)
        uid, gid = task.w.uid, task.w.gid
        _linux.drop_bounding_caps()
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _linux.prctl(_linux.PR_SET_NO_NEW_PRIVS, 1)
        if task.w.filter is not None:
            task.w.filter.load()
        env = dict(BASE_ENV)
        env.update(task.req.get("env", {}))
    except BaseException as exc:
        _setup_failed(st, "C3", exc)
    if task.req.get("python_main"):
        os.close(st)
        _run_python(task.req["python_main"], env, task.w, task.req.get("imports") or {})
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    argv = task.req["argv"]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"sandbox: cannot execute {argv[0]}: {exc.strerror}\n".encode())
        os._exit(127)


def _run_python(main: str, env: dict, w: Worker, imports: dict) -> None:
    """Run `main` as __main__ in this already-warm interpreter, its imports confined to
    the work directory, the stdlib and what the request declares (`_imports`)."""
    import runpy

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [main]
    _imports.confine(WORKDIR, w.stdlib, w.site, imports.get("modules", ()), imports.get("dists", ()), w.std_modules)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    code = 0
    try:
        runpy.run_path(os.path.join(WORKDIR, main), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code & 0xFF)


def _set_rlimits(lim: dict) -> None:
    cpu = max(1, int(-(-float(lim["cpu_s"]) // 1)))
    mem = int(lim["memory_bytes"])
    pairs = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, (int(lim["file_bytes"]),) * 2),
        (resource.RLIMIT_AS, (mem * 4 + (1 << 30),) * 2),
        (resource.RLIMIT_NPROC, (int(lim["pids"]),) * 2),
        (resource.RLIMIT_NOFILE, (int(lim["open_files"]),) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in pairs:
        resource.setrlimit(which, value)


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _set_oom_adj(value: int) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(value))
    except OSError:
        pass


def _collect(paths, cap: int) -> dict:
    """Read files the task left (all its processes are dead by now),
    refusing links and anything outside the work directory."""
    out = {}
    for rel in paths:
        data = _fs.read_file(WORKDIR, rel, cap)
        if data is not None:
            out[rel] = data
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _freeze(path: str) -> None:
    """Make a session layer read-only (for root too) by a read-only bind onto itself."""
    _linux.mount(path, path, None, _linux.MS_BIND)
    _linux.mount(
        None, path, None, _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV
    )


def _can_unshare(flag: int) -> bool:
    pid = os.fork()
    if pid == 0:
        try:
            _linux.unshare(flag)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _setup_failed(st: int, where: str, exc: BaseException) -> None:
    try:
        _proto.write_frame(st, {"kind": "setup_error", "error": f"{where}: {type(exc).__name__}: {exc}"})
    finally:
        os._exit(120)


def main() -> None:
    ctl_fd = int(sys.argv[1])
    os.closerange(3, ctl_fd)
    os.closerange(ctl_fd + 1, 1 << 16)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=ctl_fd)
    conf = _proto.read_frame(ctl_fd)
    try:
        worker = Worker(conf)
        worker.setup()
    except Exception as exc:
        _proto.write_frame(ctl_fd, {"infra_error": f"worker start-up failed: {type(exc).__name__}: {exc}"})
        return
    gc.collect()
    gc.freeze()
    _proto.write_frame(ctl_fd, {"ready": True, "pid": os.getpid()})
    worker.serve(sock)


if __name__ == "__main__":
    main()
