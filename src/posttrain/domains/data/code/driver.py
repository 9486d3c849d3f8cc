"""Test driver of the `code` domain; runs inside the sandbox as __main__.

Invariant: the driver never sees an expected value. Its request (stdin)
holds the entry point and the test INPUTS only. It forks a solver child
(stdin/stdout/stderr on /dev/null, every other descriptor closed, its own
process group) and sends it one input at a time over a pipe; for each input
the child executes the solution afresh in a new module (no state of one
input reaches the next) and replies with what the entry point returned, as
plain JSON data (exact builtin types, no subclasses, no objects of the
solution's own; 64 KiB cap), or the type of what it raised (with "explain"
in the request, also the tail of its traceback in solution.py, for the
visible tests of the coding loop). A child that
times out, dies, breaks the protocol or leaves threads running is killed
and the next input gets a fresh fork. The driver writes one line per input
to stdout, in order; the comparison with the expected values happens on
the host (posttrain.domains.code), outside the sandbox, so nothing the
solution can read, patch or print decides its score. The driver is not
dumpable, so the child can neither read nor write its memory or
descriptors through /proc.
"""

import json
import math
import os
import select
import signal
import sys
import time
import types

MAX_REPLY = 64 << 10  # bytes of one serialised return value


def _nondumpable():
    """PR_SET_DUMPABLE 0, unless it already is: the kernel makes /proc/PID of a
    non-dumpable process root's, as after the fork-server's drop to the slot uid
    (importing ctypes would cost more than a test)."""
    if os.getuid() != 0 and os.stat("/proc/self/mem").st_uid == 0:
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass


def _plain(value, depth=0):
    """`value` as plain JSON data, or TypeError for anything else (the encoder
    of the judge: tuples become lists, NaN and infinities their repr)."""
    t = type(value)
    if depth > 50:
        raise TypeError("value nested too deeply")
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        if math.isnan(value) or math.isinf(value):
            return repr(value)
        return value
    if t is list or t is tuple:
        return [_plain(v, depth + 1) for v in value]
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TypeError("dict keys must be str or int")
            out[str(k)] = _plain(v, depth + 1)
        return out
    raise TypeError(f"unsupported return type {t.__name__}")


TRACE_CHARS = 1200  # the tail of a traceback kept in an explained reply


def _trace(exc):
    """The traceback of `exc` through solution.py only, and its message; the tail."""
    try:
        import traceback

        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "solution.py"]
        text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(exc), exc))
        return ("Traceback (most recent call last):\n" if frames else "") + text[-TRACE_CHARS:]
    except BaseException:  # noqa: BLE001 - a message that cannot be formatted is left out
        return type(exc).__name__


def _run_one(code, entry, kind, test_json, explain=False):
    """In the child: run the solution on one input; the reply as bytes."""
    try:
        mod = types.ModuleType("solution")
        sys.modules["solution"] = mod
        exec(code, mod.__dict__)
        target = mod.__dict__.get(entry)
        if target is None:
            raise NameError(f"solution defines no {entry!r}")
        test = json.loads(test_json)  # a fresh copy: the solution may mutate its arguments
        if kind == "class":
            obj, value = None, []
            for method, args in test:
                if method == "__init__":
                    obj = target(*args)
                    value.append(None)
                else:
                    value.append(getattr(obj, method)(*args))
        else:
            value = target(*test)
        reply = {"value": _plain(value)}
    except BaseException as exc:  # SystemExit too: a solution that exits has no result
        reply = {"raised": type(exc).__name__}
        if explain:
            reply["trace"] = _trace(exc)
    try:
        data = json.dumps(reply).encode()
    except (TypeError, ValueError, RecursionError):
        data = b'{"raised": "unserialisable"}'
    return data if len(data) <= MAX_REPLY else b'{"error": "reply too large"}'


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _write_frame(fd, data):
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _solver(code, entry, kind, r_fd, w_fd, explain=False):
    """The child: one input at a time from r_fd, each in a fresh module."""
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted({r_fd, w_fd})
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 1 << 16)
    while True:
        head = _read_exact(r_fd, 4)
        if head is None:
            os._exit(0)
        test_json = _read_exact(r_fd, int.from_bytes(head, "big")).decode()
        reply = _run_one(code, entry, kind, test_json, explain)
        # threads of this input would run on into the next: then the next input gets a fresh child
        last = "threading" in sys.modules and sys.modules["threading"].active_count() > 1
        _write_frame(w_fd, (b"X" if last else b"K") + reply)
        if last:
            os._exit(0)


class Solver:
    """A forked child that runs inputs one at a time; replaced after a timeout or a crash."""

    def __init__(self, code, entry, kind, explain=False):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sys.stdout.flush()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(req_w)
                os.close(rep_r)
                _solver(code, entry, kind, req_r, rep_w, explain)
            finally:
                os._exit(1)
        os.close(req_r)
        os.close(rep_w)
        self.w, self.r = req_w, rep_r

    def ask(self, test_json, timeout_s):
        """(reply, state): state "keep" or "last" (the child exits after it), or
        (None, "timeout" | "gone")."""
        try:
            _write_frame(self.w, test_json.encode())
        except OSError:
            return None, "gone"
        deadline = time.monotonic() + timeout_s
        buf = b""
        while True:
            need = 4 if len(buf) < 4 else 4 + int.from_bytes(buf[:4], "big")
            if len(buf) >= 4 and need > MAX_REPLY + 64:
                return b'{"error": "reply too large"}', "last"
            if len(buf) >= need > 4:
                return buf[5:need], "keep" if buf[4:5] == b"K" else "last"
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "timeout"
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 65536)
                if not chunk:
                    return None, "gone"
                buf += chunk

    def close(self):
        os.close(self.w)
        os.close(self.r)
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        os.waitpid(self.pid, 0)


def _one(solver, test_json, timeout_s):
    """(the line for this input, whether the solver can take the next one)."""
    raw, state = solver.ask(test_json, timeout_s)
    if raw is None:
        return {"error": "timeout" if state == "timeout" else "no result"}, False
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict) or reply.keys() not in ({"value"}, {"raised"}, {"raised", "trace"}, {"error"}):
        return {"error": "no result"}, False
    return reply, state == "keep"


def main():
    _nondumpable()
    spec = json.loads(sys.stdin.read())
    entry, kind, timeout_s = spec["entry"], spec["kind"], float(spec["timeout_s"])
    explain = spec.get("explain") is True
    with open("solution.py") as fh:
        source = fh.read()
    try:
        code = compile(source, "solution.py", "exec")
    except BaseException as exc:  # noqa: BLE001 - a solution that does not compile raises on every input
        name = type(exc).__name__ if isinstance(exc, Exception) else "SyntaxError"
        detail = f"{getattr(exc, 'msg', '')} (line {getattr(exc, 'lineno', '?')})"[:300] if explain else ""
        code = compile(f"raise {name}({detail!r})", "<compile>", "exec")
    solver = None
    for i, test in enumerate(spec["inputs"]):
        solver = solver or Solver(code, entry, kind, explain)
        reply, healthy = _one(solver, json.dumps(test), timeout_s)
        if not healthy:
            solver.close()
            solver = None
        sys.stdout.write(json.dumps(dict(reply, i=i)) + "\n")
        sys.stdout.flush()
    if solver is not None:
        solver.close()


if __name__ == "__main__":
    main()
