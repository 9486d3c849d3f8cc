"""End-state checker for the `terminal` domain; runs in the sandbox as
`python3 -I -c <this file>` with the checks on stdin, cwd /task.

Invariant: it runs after every process of the episode is dead (each session
step ends with its whole process tree), from a read-only interpreter with
isolated mode (no cwd on sys.path, no PYTHON* variables), and only reads;
it is the only process of its step, so its one line of stdout is the
verdict (no nonce is needed). The checks reach it on stdin only, never as
a file of the session.
"""

import fnmatch
import json
import os
import re
import stat
import sys


def _read(path):
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def _lines(text):
    return [line.rstrip("\r") for line in text.rstrip("\n").split("\n")] if text.strip("\n") else []


def same_json(a, b):
    """Type-strict JSON equality: a bool equals only a bool (Python's `True == 1` is never
    relied on), a string never a number, lists item by item, objects key by key; numbers
    compare as numbers (1 equals 1.0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def check(c):
    p = c.get("path", "")
    kind = c["type"]
    if kind == "absent":
        return not os.path.lexists(p)
    if kind == "dir":
        return os.path.isdir(p) and not os.path.islink(p)
    if kind == "symlink":
        return os.path.islink(p) and os.readlink(p).rstrip("/") == c["target"].rstrip("/")
    if kind == "mode":
        if not os.path.isfile(p) or os.path.islink(p):
            return False
        mode = stat.S_IMODE(os.stat(p).st_mode)
        if "exact" in c:
            return mode == int(c["exact"], 8)
        return bool(mode & stat.S_IXUSR) == c["exec"]
    if kind == "count":
        base = c.get("dir", ".")
        found = [n for n in os.listdir(base) if fnmatch.fnmatch(n, c["glob"])] if os.path.isdir(base) else []
        return len(found) == c["n"]
    if not os.path.isfile(p) or os.path.islink(p):
        return False
    text = _read(p)
    if kind == "equals":
        return text == c["text"]
    if kind == "lines":
        return _lines(text) == c["lines"]
    if kind == "contains":
        return all(s in text for s in c["all"]) and not any(s in text for s in c.get("none", []))
    if kind == "regex":
        return re.search(c["pattern"], text, re.M) is not None
    if kind == "json":
        try:
            return same_json(json.loads(text), c["value"])
        except (ValueError, RecursionError):
            return False
    raise ValueError(f"unknown check type {kind!r}")


def main():
    spec = json.loads(sys.stdin.read())
    results = []
    for c in spec["checks"]:
        try:
            ok = bool(check(c))
        except Exception:
            ok = False
        results.append(ok)
    print(json.dumps({"results": results}))


main()
