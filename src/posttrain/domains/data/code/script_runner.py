"""Runner of a test script against a solution (envs.coding.script_judge);
runs inside the sandbox as __main__, the test script on stdin.

Invariant: the solution never shares a process with the test script, so
the outcome is decided outside the solver's process: this runner (not
dumpable, so /proc gives nobody its memory or descriptors) reads the tests,
then starts the solution in a FRESH interpreter (script_solver.py, fork and
exec, so the tests are not in its address space) and installs a module
`solution` whose attributes are proxies: every call crosses a pipe as plain
data and comes back as plain data or a handle, so nothing the solution
returns can run code here. The test script runs in this process and the
run passes only if it ends normally (exit 0). A solution that exits, is
killed, raises SystemExit or breaks the protocol raises SolutionFailed, a
BaseException the tests cannot catch with `except Exception`.
"""

import builtins
import ctypes
import json
import os
import struct
import sys
import traceback
import types

MAX_FRAME = 4 << 20


class SolutionFailed(BaseException):
    """The solution's process ended, raised SystemExit, or broke the protocol."""


def _nondumpable():
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass


class Solver:
    def __init__(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(2, 1)  # the solution's prints reach the feedback, never the outcome
                for fd in (req_r, rep_w):
                    os.set_inheritable(fd, True)
                keep = {0, 1, 2, req_r, rep_w}
                for fd in range(3, 1024):
                    if fd not in keep:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                here = os.path.dirname(os.path.abspath(__file__))
                os.execv(
                    sys.executable,
                    [sys.executable, "-I", os.path.join(here, "script_solver.py"), str(req_r), str(rep_w)],
                )
            finally:
                os._exit(127)
        os.close(req_r)
        os.close(rep_w)
        self.r, self.w = rep_r, req_w
        self.dead = None
        self.first = self._reply()

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(self.r, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _reply(self):
        if self.dead:
            raise SolutionFailed(self.dead)
        try:
            (n,) = struct.unpack(">I", self._read(4))
            if n > MAX_FRAME:
                raise ValueError("reply too large")
            reply = json.loads(self._read(n))
            if not isinstance(reply, dict):
                raise ValueError("bad reply")
            return reply
        except EOFError:
            self.dead = "the solution's process ended"
        except (ValueError, RecursionError) as exc:
            self.dead = f"the solution broke the protocol: {exc}"
        raise SolutionFailed(self.dead)

    def ask(self, req):
        if self.dead:
            raise SolutionFailed(self.dead)
        data = json.dumps(req).encode()
        try:
            os.write(self.w, struct.pack(">I", len(data)) + data)
        except OSError:
            self.dead = "the solution's process ended"
            raise SolutionFailed(self.dead) from None
        return unwrap(self, self._reply())


def unwrap(solver, reply):
    if "error" in reply:
        err = reply["error"]
        if not isinstance(err, dict) or err.get("fatal"):
            raise SolutionFailed(f"the solution raised {str(err.get('name') if isinstance(err, dict) else err)[:80]}")
        cls = getattr(builtins, str(err.get("type")), None)
        msg = str(err.get("msg", ""))
        if str(err.get("name")) != err.get("type"):
            msg = f"{err.get('name')}: {msg}"
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(msg)
            except Exception:
                exc = RuntimeError(f"{err.get('type')}: {msg}")
            raise exc
        raise RuntimeError(f"{err.get('name')}: {msg}")
    if "value" not in reply:
        raise SolutionFailed("the solution broke the protocol")
    return decode(solver, reply["value"])


def decode(solver, v):
    if isinstance(v, list):
        return [decode(solver, x) for x in v]
    if v is None or type(v) in (bool, int, float, str):
        return v
    if not isinstance(v, dict) or len(v) == 0:
        raise SolutionFailed("the solution broke the protocol")
    if "$h" in v:
        return Remote(solver, int(v["$h"]), str(v.get("t", "object")), bool(v.get("c")))
    if "$t" in v:
        return tuple(decode(solver, x) for x in v["$t"])
    if "$s" in v or "$f" in v:
        items = [decode(solver, x) for x in v.get("$s", v.get("$f", []))]
        return set(items) if "$s" in v else frozenset(items)
    if "$d" in v:
        return {decode(solver, k): decode(solver, x) for k, x in v["$d"]}
    if "$b" in v:
        import base64

        return base64.b64decode(v["$b"])
    if "$x" in v:
        return float(v["$x"])
    raise SolutionFailed("the solution broke the protocol")


def encode(v, depth=0):
    t = type(v)
    if depth > 50:
        raise TypeError("value nested too deeply")
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else {"$x": repr(v)}
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"$t": [encode(x, depth + 1) for x in v]}
    if t in (set, frozenset):
        return {"$s" if t is set else "$f": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"$d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        import base64

        return {"$b": base64.b64encode(v).decode()}
    if t is Remote:
        return {"$h": object.__getattribute__(v, "_hid")}
    raise TypeError(f"cannot pass a {t.__name__} to the solution")


class Remote:
    """An object of the solution, living in the solver's process."""

    __slots__ = ("_solver", "_hid", "_type", "_callable")

    def __init__(self, solver, hid, type_name, is_callable):
        object.__setattr__(self, "_solver", solver)
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_callable", is_callable)

    def _ask(self, op, **kw):
        return object.__getattribute__(self, "_solver").ask(
            dict(op=op, obj=object.__getattribute__(self, "_hid"), **kw)
        )

    def __getattr__(self, name):
        return self._ask("get", name=name)

    def __call__(self, *args, **kwargs):
        return self._ask("call", args=encode(list(args)), kwargs={"$d": [[k, encode(v)] for k, v in kwargs.items()]})

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return iter(self._ask("iter"))

    def __getitem__(self, key):
        return self._ask("getitem", key=encode(key))

    def __bool__(self):
        return self._ask("bool")

    def __repr__(self):
        return self._ask("repr")


class SolutionModule(types.ModuleType):
    def __init__(self, solver):
        super().__init__("solution")
        self._solver = solver

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._solver.ask({"op": "get", "obj": 0, "name": name})


def main():
    _nondumpable()
    tests = sys.stdin.read()
    solver = Solver()
    unwrap(solver, solver.first)  # the solution's import error, if any, fails here with its type
    sys.modules["solution"] = SolutionModule(solver)
    ns = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(tests, "run_tests.py", "exec"), ns)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - any failure of the tests or the solution fails the run
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
