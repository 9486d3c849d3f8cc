"""THE OLD JUDGE of the `code` domain, kept only for bench/sandbox.py (do not use:
its request carries the expected values and a nonce into the sandbox, where a
solution that walks its frames reads them). Runs inside the sandbox as __main__.

Invariant: the solution never shares a process with the hidden tests. The
judge (J) forks one solver (S) per test *before* it reads the tests from
stdin, so no solver's memory ever holds a test or an expected value; each
solver gets only its own arguments (decoded fresh from JSON) and sends back
a strictly typed JSON value (exact int/float/str/bool/None/list/tuple/dict,
no subclasses), which J compares; J never trusts anything else a solver
says. The solvers' stdout/stderr go to /dev/null, J is not dumpable (no
/proc/J/mem or /proc/J/fd), and J's report carries a nonce that only the
verifier and J know. A solver that exits, hangs or kills J fails: no
report, or failed tests.
"""

import ctypes
import json
import math
import os
import select
import signal
import sys
import time

MAX_REPLY = 1 << 20


def _nondumpable():
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass


def _plain(value, depth=0):
    """`value` as plain JSON data, or TypeError for anything else."""
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


def _solver(r_fd, w_fd, entry, kind):
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = {0, 1, 2, r_fd, w_fd}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass
    reply = {}
    try:
        request = json.loads(_read_all(r_fd))
        with open("solution.py") as fh:
            source = fh.read()
        ns = {"__name__": "solution", "__builtins__": __builtins__}
        exec(compile(source, "solution.py", "exec"), ns)
        target = ns.get(entry)
        if target is None:
            raise NameError(f"solution defines no {entry!r}")
        if kind == "class":
            obj, results = None, []
            for method, args in request["calls"]:
                if method == "__init__":
                    obj = target(*args)
                    results.append(None)
                else:
                    results.append(getattr(obj, method)(*args))
            value = results
        else:
            value = target(*request["args"])
        reply = {"value": _plain(value)}
    except BaseException as exc:  # includes SystemExit: a test that exits fails
        reply = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    try:
        data = json.dumps(reply).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"error": f"unserialisable result: {exc}"}).encode()
    os.write(w_fd, data[:MAX_REPLY])
    os._exit(0)


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _same(got, want, mode):
    if mode == "approx":
        if isinstance(want, list):
            return isinstance(got, list) and len(got) == len(want) and all(_same(g, w, mode) for g, w in zip(got, want))
        if type(want) in (int, float) and type(got) in (int, float):
            return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
        return got == want and type(got) is type(want)
    if mode == "unordered" and isinstance(want, list) and isinstance(got, list):
        key = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
        return sorted(got, key=key) == sorted(want, key=key)
    return _strict_eq(got, want)


def _strict_eq(a, b):
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_strict_eq(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_strict_eq(a[k], b[k]) for k in a)
    return a == b


def _collect(r_fd, deadline):
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([r_fd], [], [], left)
        if ready:
            chunk = os.read(r_fd, 65536)
            if not chunk:
                return buf
            buf += chunk


def main():
    _nondumpable()
    n = int(os.environ["HARNESS_TESTS"])
    entry, kind = os.environ["HARNESS_ENTRY"], os.environ["HARNESS_KIND"]
    solvers = []
    for _ in range(n):
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _solver(req_r, res_w, entry, kind)
        os.close(req_r)
        os.close(res_w)
        solvers.append((pid, req_w, res_r))
    spec = json.loads(sys.stdin.read())  # only now: every solver already exists
    tests, mode, timeout_s = spec["tests"], spec.get("mode", "exact"), float(spec["timeout_s"])
    results = []
    for (pid, req_w, res_r), test in zip(solvers, tests):
        request = {"calls": test["calls"]} if kind == "class" else {"args": test["args"]}
        try:
            os.write(req_w, json.dumps(request).encode())
        except OSError:
            pass
        os.close(req_w)
        raw = _collect(res_r, time.monotonic() + timeout_s)
        os.close(res_r)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        if raw is None:
            results.append({"ok": False, "why": "timeout"})
            continue
        try:
            reply = json.loads(raw)
        except ValueError:
            results.append({"ok": False, "why": "no result"})
            continue
        if "value" in reply:
            ok = _same(reply["value"], test["expected"], mode)
            results.append({"ok": ok, "why": "" if ok else "wrong value"})
        else:
            results.append({"ok": False, "why": str(reply.get("error", "error"))[:200]})
    passed = sum(r["ok"] for r in results)
    report = {"nonce": spec["nonce"], "passed": passed, "total": len(tests), "results": results}
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
