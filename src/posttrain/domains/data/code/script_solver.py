"""The solution's side of a script-judge run: a fresh interpreter
(`python -I script_solver.py R W`) that holds only the solution.

Invariant: this process is exec'd, never forked from one that read the
tests, so the test script is not in its address space; it loads
solution.py and answers the runner's requests (get an attribute, call, len,
iterate, index, repr) over two pipes, one JSON frame each way. Values cross
as plain data (exact builtin types) or as handles to objects that stay here;
exceptions cross as the first builtin class of their type, and a
BaseException that is not an Exception (SystemExit, ...) as "fatal".
"""

import base64
import builtins
import json
import math
import os
import struct
import sys
import traceback
import types

MAX_FRAME = 4 << 20


def _read(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def read_frame(fd):
    (n,) = struct.unpack(">I", _read(fd, 4))
    if n > MAX_FRAME:
        raise EOFError
    return json.loads(_read(fd, n))


def write_frame(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


class Handles:
    def __init__(self):
        self.objs = {}

    def encode(self, v, depth=0):
        t = type(v)
        if depth > 50:
            raise TypeError("value nested too deeply")
        if v is None or t in (bool, int, str):
            return v
        if t is float:
            return v if math.isfinite(v) else {"$x": repr(v)}
        if t is list:
            return [self.encode(x, depth + 1) for x in v]
        if t is tuple:
            return {"$t": [self.encode(x, depth + 1) for x in v]}
        if t in (set, frozenset):
            return {"$s" if t is set else "$f": [self.encode(x, depth + 1) for x in v]}
        if t is dict:
            return {"$d": [[self.encode(k, depth + 1), self.encode(x, depth + 1)] for k, x in v.items()]}
        if t is bytes:
            return {"$b": base64.b64encode(v).decode()}
        hid = len(self.objs) + 1
        self.objs[hid] = v
        return {"$h": hid, "t": t.__name__, "c": callable(v)}

    def decode(self, v):
        if isinstance(v, list):
            return [self.decode(x) for x in v]
        if not isinstance(v, dict):
            return v
        if "$h" in v:
            return self.objs[v["$h"]]
        if "$t" in v:
            return tuple(self.decode(x) for x in v["$t"])
        if "$s" in v:
            return {self.decode(x) for x in v["$s"]}
        if "$f" in v:
            return frozenset(self.decode(x) for x in v["$f"])
        if "$d" in v:
            return {self.decode(k): self.decode(x) for k, x in v["$d"]}
        if "$b" in v:
            return base64.b64decode(v["$b"])
        if "$x" in v:
            return float(v["$x"])
        raise ValueError("bad value")


def _error(exc):
    base = next((c for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c), BaseException)
    fatal = not isinstance(exc, Exception)
    traceback.print_exception(exc, file=sys.stderr)
    return {"error": {"type": base.__name__, "name": type(exc).__name__, "msg": str(exc)[:500], "fatal": fatal}}


def serve(h, req, module):
    op = req["op"]
    obj = module if req.get("obj", 0) == 0 else h.objs[req["obj"]]
    if op == "get":
        return getattr(obj, req["name"])
    if op == "call":
        return obj(*h.decode(req["args"]), **h.decode(req["kwargs"]))
    if op == "len":
        return len(obj)
    if op == "iter":
        return list(obj)
    if op == "getitem":
        return obj[h.decode(req["key"])]
    if op == "repr":
        return repr(obj)
    if op == "bool":
        return bool(obj)
    raise ValueError(f"unknown op {op!r}")


def main():
    r_fd, w_fd = int(sys.argv[1]), int(sys.argv[2])
    h = Handles()
    module = types.ModuleType("solution")
    module.__file__ = os.path.abspath("solution.py")
    sys.modules["solution"] = module
    try:
        with open("solution.py") as fh:
            exec(compile(fh.read(), "solution.py", "exec"), module.__dict__)
        reply = {"value": None}
    except BaseException as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        reply = _error(exc)
    while True:
        sys.stdout.flush()
        write_frame(w_fd, reply)
        try:
            req = read_frame(r_fd)
        except EOFError:
            return
        try:
            reply = {"value": h.encode(serve(h, req, module))}
        except BaseException as exc:  # noqa: BLE001
            reply = _error(exc)


if __name__ == "__main__":
    main()
