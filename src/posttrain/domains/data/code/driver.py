"""Test driver of the `code` domain; runs inside the sandbox as __main__.

Invariant: the driver never sees an expected value. Its request (stdin)
holds the entry point and the test INPUTS only; it runs the solution once
per input, each in a fresh forked child (stdin/stdout/stderr on /dev/null,
every other descriptor closed, its own process group), and writes one line
per input to stdout, in order: what the solution returned, as plain JSON
data (exact builtin types, no subclasses, no objects of the solution's own),
or the type of what it raised, or why there is no result (timeout, no
reply, reply too large). The comparison with the expected values happens on
the host (posttrain.domains.code), outside the sandbox, so nothing the
solution can read, patch or print decides its score. The driver is not
dumpable, so a child cannot read its memory or descriptors through /proc.
"""
import ctypes
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
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
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


def _run_one(code, entry, kind, test_json):
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
    try:
        data = json.dumps(reply).encode()
    except (TypeError, ValueError, RecursionError):
        data = b'{"raised": "unserialisable"}'
    return data if len(data) <= MAX_REPLY else b'{"error": "reply too large"}'


def _child(code, entry, kind, test_json, w_fd):
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, w_fd)
    os.closerange(w_fd + 1, 1 << 16)
    data = _run_one(code, entry, kind, test_json)
    view = memoryview(data)
    while view:
        view = view[os.write(w_fd, view):]
    os._exit(0)


def _collect(r_fd, deadline):
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([r_fd], [], [], left)
        if ready:
            chunk = os.read(r_fd, 65536)
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > MAX_REPLY + 64:
                return b'{"error": "reply too large"}'


def _one(code, entry, kind, test_json, timeout_s):
    r_fd, w_fd = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r_fd)
            _child(code, entry, kind, test_json, w_fd)
        finally:
            os._exit(1)
    os.close(w_fd)
    raw = _collect(r_fd, time.monotonic() + timeout_s)
    os.close(r_fd)
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os.waitpid(pid, 0)
    if raw is None:
        return {"error": "timeout"}
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict) or not (reply.keys() == {"value"} or reply.keys() == {"raised"} or reply.keys() == {"error"}):
        return {"error": "no result"}
    return reply


def main():
    _nondumpable()
    spec = json.loads(sys.stdin.read())
    entry, kind, timeout_s = spec["entry"], spec["kind"], float(spec["timeout_s"])
    with open("solution.py") as fh:
        source = fh.read()
    try:
        code = compile(source, "solution.py", "exec")
    except BaseException as exc:  # noqa: BLE001 - a solution that does not compile raises on every input
        code = compile(f"raise {type(exc).__name__ if isinstance(exc, Exception) else 'SyntaxError'}()", "solution.py", "exec")
    for i, test in enumerate(spec["inputs"]):
        line = dict(_one(code, entry, kind, json.dumps(test), timeout_s), i=i)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
