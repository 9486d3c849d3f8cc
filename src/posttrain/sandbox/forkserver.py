"""Parent-side handle of one fork-server worker process.

Invariant: a call on a handle returns within the request's wall limit plus
the grace period, whatever the worker does; a worker that dies, hangs or
breaks the protocol is killed and every later call on this handle returns
infra_error (the pool then replaces it). The handle is used by one thread
at a time (the pool guarantees it). An op that carries request bytes
(`_proto.FORKED_OPS`: run, session_open) never goes over the worker's
control channel: it goes over a fresh socket pair whose other end the worker
hands to a process it forks for that one request (see `_worker`).
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import subprocess
import time

from posttrain.sandbox import _proto
from posttrain.sandbox.records import ExecRequest, ExecResult

WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
BACKEND = "forkserver"
# the worker's initial environment is what /proc/self/environ shows inside a task: keep it empty of secrets
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class WorkerDied(Exception):
    """The worker is gone or unusable."""


class ForkServerWorker:
    def __init__(self, slot: int, conf: dict, python: str, start_timeout_s: float, grace_s: float) -> None:
        self.slot = slot
        self.conf = conf
        self.grace_s = grace_s
        self.dead = False
        self.runner_peak_kb = 0  # the largest VmHWM a per-request runner reported
        parent, child = socket.socketpair()
        self.sock = parent
        try:
            self.proc = subprocess.Popen(
                [python, "-E", "-s", WORKER_FILE, str(child.fileno())],
                pass_fds=[child.fileno()],
                env=dict(WORKER_ENV),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if os.environ.get("POSTTRAIN_SANDBOX_DEBUG") else subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            child.close()
        try:
            _proto.write_frame(self.sock.fileno(), conf)
            ready = self._recv(start_timeout_s)
        except WorkerDied:
            self.kill()
            raise
        if not ready.get("ready"):
            self.kill()
            raise WorkerDied(ready.get("infra_error", f"worker start-up failed: {ready!r}"))
        self.pid = self.proc.pid

    def _recv(self, timeout_s: float, sock: socket.socket | None = None) -> dict:
        sock = self.sock if sock is None else sock
        r, _, _ = select.select([sock.fileno()], [], [], timeout_s)
        if not r:
            raise WorkerDied(f"worker {self.slot} did not answer within {timeout_s:.1f}s")
        try:
            sock.settimeout(timeout_s)
            header = sock.recv(4, socket.MSG_WAITALL)
            if len(header) < 4:
                raise WorkerDied(f"worker {self.slot} closed its channel (exit {self.proc.poll()})")
            length = int.from_bytes(header, "big")
            body = bytearray()
            while len(body) < length:
                chunk = sock.recv(min(length - len(body), 1 << 20))
                if not chunk:
                    raise WorkerDied(f"worker {self.slot} closed its channel mid-reply")
                body += chunk
            return pickle.loads(bytes(body))
        except (TimeoutError, OSError, EOFError) as exc:
            raise WorkerDied(f"worker {self.slot}: {type(exc).__name__}: {exc}") from exc

    def call(self, msg: dict, timeout_s: float) -> dict:
        """Send one op and return the worker's reply: a FORKED_OPS op to a
        fresh runner over its own socket pair, any other over the control channel."""
        if self.dead:
            raise WorkerDied(f"worker {self.slot} is dead")
        try:
            if msg["op"] in _proto.FORKED_OPS:
                return self._forked(msg, timeout_s)
            self.sock.sendall(_proto.encode(msg))
            return self._recv(timeout_s)
        except (WorkerDied, OSError) as exc:
            self.kill()
            raise WorkerDied(str(exc)) from exc

    def _forked(self, msg: dict, timeout_s: float) -> dict:
        mine, theirs = socket.socketpair()
        try:
            _proto.send_fork(self.sock, theirs)
            theirs.close()
            mine.settimeout(timeout_s)
            mine.sendall(_proto.encode(msg))
            reply = self._recv(timeout_s, mine)
        finally:
            theirs.close()
            mine.close()
        self.runner_peak_kb = max(self.runner_peak_kb, int(reply.pop("runner_peak_rss_kb", 0)))
        return reply

    def run(self, req: ExecRequest, session: str | None = None, imports: dict | None = None) -> ExecResult:
        """Run `req`; `imports`: what its program may import beyond the stdlib (`sandbox.packages`)."""
        t0 = time.monotonic()
        wire = req.to_wire(session) | {"imports": imports or {}}
        try:
            reply = self.call({"op": "run", "req": wire}, req.limits.wall_s + self.grace_s)
        except WorkerDied as exc:
            return ExecResult.infra(f"worker died: {exc}", BACKEND, time.monotonic() - t0)
        if "infra_error" in reply:
            return ExecResult.infra(reply["infra_error"], BACKEND, time.monotonic() - t0)
        return ExecResult.from_wire(reply, BACKEND)

    def ping(self, timeout_s: float = 5.0) -> dict:
        """The worker's pid, uid, RSS and peak RSS (VmHWM, KiB), and the largest
        peak a per-request runner of it reported (`runner_peak_rss_kb`)."""
        return self.call({"op": "ping"}, timeout_s) | {"runner_peak_rss_kb": self.runner_peak_kb}

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def kill(self) -> None:
        self.dead = True
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.sock.close()

    def close(self) -> None:
        """Ask the worker to exit (closing the channel ends its loop)."""
        if self.dead:
            return
        self.dead = True
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cpu_seconds(self) -> float:
        """CPU of the worker and the task trees it reaped (from /proc)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            return 0.0
