"""Leak scans: nothing a judge keeps hidden is readable from inside the sandbox.

Property tests, run for EVERY code task and EVERY terminal template: a
"solution" (or a model command) that is a scanner dumps every readable
mapping of its own process and of every other process it can read
(/proc/PID/maps + mem, plus environ, cmdline and fd/0), and every file under
/task, /tmp and /dev/shm; the host searches the dump for each hidden value
in the encodings a judge would use (JSON in both spacings, repr, the raw
string, the test with its input, the checker's stdin), with whitespace
removed on both sides. The scanner keeps the ASCII text runs (6+ bytes) of
what it reads, so a dump stays small; a hidden value that is only in memory
as non-ASCII text is not looked for. A needle counts only when it is hidden: not in what
the model is given (prompt, inputs, initial files, the scanner, the driver)
and not ambient (absent from the same scan on a fresh pool that never ran a
task). Controls show each scan finds a leak where there is one. The static
files bound into every sandbox (/usr, /etc, the venv, ...) are searched once
with grep (slow test), with a control that binds the task data.

Worker memory (the last section): for generated requests carrying markers
(source, stdin, files, argv, env, stdout, stderr, collected files), the
same scanner, run later on the same warm worker as a one-shot or as a
session step, finds no earlier request's marker (a session may hold its own
steps), nor one of a group-mate running on another worker; and the warm
worker's own memory, read from the host, never holds one (each request is
read and served by a fresh runner forked from it). Each scan must find its
own request's marker (the control that it reads request bytes in memory).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
import zlib

import pytest

from posttrain import sandbox
from posttrain.configs.sandbox import SandboxConfig
from posttrain.domains import code as C
from posttrain.domains import terminal as T
from posttrain.domains.base import stable_rng
from posttrain.domains.registry import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")
OUT = "/task/.leakscan"
WS = b" \t\n\r\x0b\x0c"
MIN_NEEDLE = 6

SCANNER = r"""
import os, re, sys, zlib

OUT = "/task/.leakscan"
TEXT = re.compile(rb"[\x20-\x7e\t\n\r]{6,}")  # every needle is ASCII text of 6 or more bytes


def _regions(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return
    with mem:
        for line in maps:
            parts = line.split()
            path = parts[5] if len(parts) > 5 else ""
            if parts[1][0] != "r" or path in ("[vvar]", "[vsyscall]"):
                continue
            if parts[1][1] != "w" and path.startswith("/") and os.path.isfile(path) and os.access(path, os.R_OK):
                continue  # a read-only map of a readable file: the file walk covers it
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            try:
                mem.seek(lo)
                yield mem.read(hi - lo)
            except (OSError, ValueError, OverflowError):
                pass


def _files():
    # the interpreter's own tree is a read-only bind of the host's venv (under /tmp when the
    # checkout is, as in a CI clone): no request can write there, and reading it all would
    # overflow the scan's output limit
    shared = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    for root in ("/task", "/tmp", "/dev/shm"):
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if os.path.realpath(os.path.join(d, x)) not in shared]
            for n in names:
                path = os.path.join(d, n)
                if path.startswith(OUT):
                    continue
                try:
                    with open(path, "rb") as fh:
                        yield fh.read(64 << 20)
                except OSError:
                    pass


def scan():
    import ctypes

    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE = 1: a forked solver inherits 0 (unreadable /proc/self)
    z = zlib.compressobj(1)
    pids = ["self"] + sorted(p for p in os.listdir("/proc") if p.isdigit())
    with open(OUT + ".part", "wb") as out:
        for pid in pids:
            for name in ("environ", "cmdline", "fd/0"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as fh:
                        out.write(z.compress(fh.read(1 << 22) + b"\0"))
                except OSError:
                    pass
            for chunk in _regions(pid):
                out.write(z.compress(b"\0".join(TEXT.findall(chunk)) + b"\0"))
        for data in _files():
            out.write(z.compress(b"\0".join(TEXT.findall(data)) + b"\0"))
        out.write(z.flush())
    os.rename(OUT + ".part", OUT)
"""
CODE_SCANNER = SCANNER + "\nif not os.path.exists(OUT):\n    scan()\n\n\ndef ENTRY(*args):\n    return None\n"
SCAN_LIMITS = {"output_bytes": 96 << 20, "disk_bytes": 256 << 20, "file_bytes": 200 << 20}


def strip(data: bytes | str) -> bytes:
    return (data.encode() if isinstance(data, str) else data).translate(None, WS)


def encodings(value) -> set[bytes]:
    forms = {
        json.dumps(value),
        json.dumps(value, separators=(",", ":")),
        json.dumps(value, ensure_ascii=False),
        repr(value),
    }
    if isinstance(value, str):
        forms.add(value)
    return {strip(f) for f in forms}


def hidden(needles: set[bytes], visible: bytes, ambient: bytes) -> set[bytes]:
    return {n for n in needles if len(n) >= MIN_NEEDLE and n not in visible and n not in ambient}


def dump_of(result) -> bytes:
    sandbox.raise_for_infra(result)
    assert ".leakscan" in result.files, (result.status, result.stderr[-500:])
    data = zlib.decompress(result.files[".leakscan"])
    assert len(data) > 1 << 20, f"the scan read only {len(data)} bytes"  # it did read process memory
    return strip(data)


@pytest.fixture(scope="module")
def pool():
    """A fresh pool; its first run is the ambient control (nothing has run on it yet)."""
    with sandbox.Pool(SandboxConfig(workers=1)) as p:
        req = sandbox.ExecRequest(
            files={"scan.py": SCANNER + "\nscan()\n"},
            python_main="scan.py",
            collect=(".leakscan",),
            limits=sandbox.Limits(wall_s=60, cpu_s=60, **SCAN_LIMITS),
        )
        p.ambient_py = dump_of(p.run(req))
        sh = T.step_request(
            f"cat > .scan.py <<'EOF'\n{SCANNER}\nscan()\nEOF\npython3 -I .scan.py",
            collect=(".leakscan",),
            limits=sandbox.Limits(wall_s=60, cpu_s=60, **SCAN_LIMITS),
        )
        with p.session({}) as s:
            p.ambient_sh = dump_of(s.run(sh))
        yield p


# ---------------------------------------------------------------- code


def code_tasks():
    d = get("code")
    return [
        d.sample(i, split, level)
        for split in ("train", "eval")
        for level in (1, 2, 3)
        for i in range(len(d._pool(split, level)))
    ]


def code_needles(ref: C.CodeReference) -> set[bytes]:
    key = "calls" if ref.kind == "class" else "args"
    out: set[bytes] = set()
    for t in json.loads(ref.tests_json):
        out |= (
            encodings(t["expected"])
            | encodings(t)
            | encodings([t[key], t["expected"]])
            | encodings({"expected": t["expected"]})
        )
    return out


def code_visible(task) -> bytes:
    ref = task.reference
    return (
        strip(
            task.prompt[-1].content + json.dumps(ref.inputs()) + repr(ref.inputs()) + CODE_SCANNER + C.driver_source()
        )
        + b"\0"
    )


def scan_code_task(pool, task, runner=None) -> tuple[set[bytes], set[bytes]]:
    """(hidden needles of the task, those found in its solver's scan)."""
    ref = dataclasses.replace(task.reference, timeout_s=30.0)
    req = C.build_request(ref, CODE_SCANNER.replace("ENTRY", ref.name))
    req = dataclasses.replace(req, collect=(".leakscan",), limits=dataclasses.replace(req.limits, **SCAN_LIMITS))
    dump = dump_of((runner or pool.run)(req))
    needles = hidden(code_needles(task.reference), code_visible(task), pool.ambient_py)
    return needles, {n for n in needles if n in dump}


def sweep_code(pool, tasks) -> None:
    leaks, checked = {}, 0
    for task in tasks:
        needles, found = scan_code_task(pool, task)
        assert needles, f"{task.reference.name}: no hidden needle to look for"
        checked += len(needles)
        if found:
            leaks[task.reference.name] = sorted(found)[:3]
    assert not leaks, leaks
    assert checked > 8 * len(tasks)


def test_no_expected_value_is_readable_by_a_code_solution(pool):
    """Every eighth task (all levels, a class task among them); all 61 in the slow test below."""
    tasks = code_tasks()
    picked = tasks[::8] + [next(t for t in tasks if t.reference.kind == "class")]
    assert {t.meta.difficulty for t in picked} == {1, 2, 3}
    sweep_code(pool, picked)


@pytest.mark.slow
def test_no_expected_value_is_readable_by_any_code_solution(pool):
    tasks = code_tasks()
    assert len(tasks) >= 60
    sweep_code(pool, tasks)


def test_the_code_scan_finds_expected_values_in_a_leaky_request(pool):
    """Control: a request that carries the tests (as the judge before this one
    did, on stdin) is caught by the same scan."""
    task = next(t for t in code_tasks() if t.meta.difficulty == 3)

    def leaky(req):
        spec = json.loads(req.stdin) | {"tests": json.loads(task.reference.tests_json)}
        return pool.run(dataclasses.replace(req, stdin=json.dumps(spec).encode()))

    needles, found = scan_code_task(pool, task, runner=leaky)
    assert len(found) >= len(task.reference.inputs()), found  # each test's pairing, at least


# ---------------------------------------------------------------- terminal


def terminal_tasks():
    d = get("terminal")
    out = []
    for name in sorted(T.templates().TEMPLATES):
        inst = T.templates().TEMPLATES[name](stable_rng("leaks", name))
        out.append(d._make(0, "train", inst["level"], name, inst["prompt"], inst))
    return out


def terminal_needles(ref: T.TerminalReference) -> set[bytes]:
    checks, runs = json.loads(ref.checks_json), json.loads(ref.runs_json)
    out = encodings(checks) | encodings({"checks": checks}) | encodings(runs)
    for c in checks:
        out |= encodings(c)
        for field in ("text", "pattern", "target", "value", "all", "none"):
            if field in c:
                out |= encodings(c[field])
        if "lines" in c:
            out |= encodings(c["lines"]) | encodings("\n".join(c["lines"]))
    for r in runs:
        out |= encodings(r) | encodings(r["stdout"])
    return out


def scan_terminal_task(pool, task, files=None) -> tuple[set[bytes], set[bytes]]:
    ref = task.reference
    cmd = f"cat > .scan.py <<'EOF'\n{SCANNER}\nscan()\nEOF\npython3 -I .scan.py"
    with pool.session(dict(ref.files) if files is None else files, domain="terminal") as s:
        dump = dump_of(
            s.run(
                T.step_request(cmd, collect=(".leakscan",), limits=dataclasses.replace(T._step_limits(), **SCAN_LIMITS))
            )
        )
    visible = strip(task.prompt[-1].content + "".join(f"{k}\0{v}\0" for k, v in ref.files) + SCANNER + cmd) + b"\0"
    needles = hidden(terminal_needles(ref), visible, pool.ambient_sh)
    return needles, {n for n in needles if n in dump}


def sweep_terminal(pool, tasks) -> None:
    from posttrain.types import Episode

    d = get("terminal")
    leaks, checked = {}, 0
    for task in tasks:
        assert d.score(task, Episode(d.gold(task))).value == 1.0  # its checker has just run on this very worker
        needles, found = scan_terminal_task(pool, task)
        checked += len(needles)
        if found:
            leaks[task.reference.template] = sorted(found)[:3]
    assert not leaks, leaks
    assert checked > 2 * len(tasks)


def test_no_hidden_check_is_readable_while_the_models_commands_run(pool):
    """Every fourth template (all of them in the slow test below): the task is
    scored first, then a model command scans everything it can read."""
    sweep_terminal(pool, terminal_tasks()[::4])


@pytest.mark.slow
def test_no_hidden_check_of_any_template_is_readable_while_the_models_commands_run(pool):
    tasks = terminal_tasks()
    assert len(tasks) >= 20
    sweep_terminal(pool, tasks)


def test_the_terminal_scan_finds_checks_planted_in_the_session(pool):
    """Control: checks left in a session file are found by the same scan."""
    task = next(t for t in terminal_tasks() if t.reference.template == "fix_port")
    files = dict(task.reference.files) | {
        "notes/checks.json": json.dumps({"checks": json.loads(task.reference.checks_json)})
    }
    needles, found = scan_terminal_task(pool, task, files)
    assert needles and found


# ---------------------------------------------------------------- the static files bound into every sandbox


def grep_needles() -> tuple[dict[str, tuple[str, str]], dict[str, int]]:
    """Single-line literal needles (grep -F), each with the (task, test) it
    belongs to; and the number of tests (checks) of each task."""
    out: dict[str, tuple[str, str]] = {}
    sizes: dict[str, int] = {}
    for task in code_tasks():
        sizes[f"code/{task.reference.name}"] = len(task.reference.inputs())
        for i, t in enumerate(json.loads(task.reference.tests_json)):
            v = t["expected"]
            forms = {json.dumps(v), json.dumps(v, separators=(",", ":")), repr(v), f'"expected": {json.dumps(v)}'}
            forms |= {v} if isinstance(v, str) else set()
            for f in forms:
                if len(f) >= 10 and "\n" not in f:
                    out.setdefault(f, (f"code/{task.reference.name}", str(i)))
    for task in terminal_tasks():
        sizes[f"terminal/{task.reference.template}"] = len(json.loads(task.reference.checks_json))
        for i, c in enumerate(json.loads(task.reference.checks_json)):
            for f in (json.dumps(c), json.dumps(c, separators=(",", ":"))):
                out.setdefault(f, (f"terminal/{task.reference.template}", str(i)))
    return out, sizes


def walk(p) -> dict[str, set[str]]:
    """Files (readable, < 4 MiB, outside /proc /sys /dev /task) holding needles of
    most tests of one task (at least 3 and 60%; a value or two of a task, such as
    a small permutation, turns up in unrelated files): {path: {task, ...}}."""
    needles, sizes = grep_needles()
    cmd = (
        "find / \\( -path /proc -o -path /sys -o -path /dev -o -path /task \\) -prune -o -type f -size -4M -readable "
        "-print0 "
        "| xargs -0 -r grep -F -o -a -H -f /task/needles.txt | sort -u > /task/hits; true"
    )
    req = sandbox.ExecRequest(
        argv=("bash", "-c", cmd),
        files={"needles.txt": "\n".join(needles) + "\n"},
        collect=("hits",),
        limits=sandbox.Limits(wall_s=300, cpu_s=300, output_bytes=64 << 20, disk_bytes=128 << 20, file_bytes=64 << 20),
    )
    res = sandbox.raise_for_infra(p.run(req))
    tests_by_file: dict[tuple[str, str], set[str]] = {}
    for line in res.files.get("hits", b"").decode("utf-8", "replace").splitlines():
        path, _, needle = line.partition(":")
        if needle in needles:
            task, test = needles[needle]
            tests_by_file.setdefault((path, task), set()).add(test)
    out: dict[str, set[str]] = {}
    for (path, task), tests in tests_by_file.items():
        if len(tests) >= max(3, 0.6 * sizes[task]):
            out.setdefault(path, set()).add(task)
    return out


@pytest.mark.slow
def test_no_readable_file_holds_hidden_task_data():
    with sandbox.Pool(SandboxConfig(workers=1)) as p:
        assert walk(p) == {}


@pytest.mark.slow
def test_the_file_walk_finds_task_data_where_it_is_bound(tmp_path):
    """Control: a copy of the code domain's data bound read-only into the
    sandbox (as a careless install or a data copy would leave it) is flagged."""
    import shutil

    leaked = tmp_path / "leaked"
    leaked.mkdir()
    shutil.copy(os.path.join(C.DATA, "tasks.json"), leaked / "tasks.json")
    with sandbox.Pool(SandboxConfig(workers=1, ro_binds=(str(leaked),))) as p:
        flagged = walk(p)
    assert str(leaked / "tasks.json") in flagged


# ---------------------------------------------------------------- worker memory: one request, then the next


MARKER_KINDS = ("source", "stdin", "file", "argv", "env", "stdout", "stderr", "collected")


def marker(rng: random.Random, kind: str) -> str:
    """A fresh ASCII marker (never ambient, never in a scanner request)."""
    return f"mk{kind}{rng.getrandbits(96):024x}"


def marked_request(rng: random.Random, kind: str) -> tuple[sandbox.ExecRequest, set[str]]:
    """A request that carries (or, for the outputs, makes) one fresh marker of
    `kind`, and every marker it holds. The output markers are built at run
    time from their reversal, which is a source marker of the same request."""
    m = marker(rng, kind)
    lim = sandbox.Limits(wall_s=20, cpu_s=20)
    py = {
        "source": ({"main.py": f"value = {m!r}\n"}, b"", {}),
        "stdin": ({"main.py": "import sys\ndata = sys.stdin.read()\n"}, m.encode(), {}),
        "file": ({"main.py": "data = open('data/in.txt').read()\n", "data/in.txt": m}, b"", {}),
        "env": ({"main.py": "import os\nvalue = os.environ['VALUE']\n"}, b"", {"VALUE": m}),
        "stdout": ({"main.py": f"print({m[::-1]!r}[::-1])\n"}, b"", {}),
        "stderr": ({"main.py": f"import sys\nprint({m[::-1]!r}[::-1], file=sys.stderr)\n"}, b"", {}),
        "collected": ({"main.py": f"open('out.txt', 'w').write({m[::-1]!r}[::-1])\n"}, b"", {}),
    }
    if kind == "argv":
        return sandbox.ExecRequest(argv=("sh", "-c", f": {m}; echo done"), limits=lim), {m}
    files, stdin, env = py[kind]
    collect = ("out.txt",) if kind == "collected" else ()
    req = sandbox.ExecRequest(files=files, python_main="main.py", stdin=stdin, env=env, collect=collect, limits=lim)
    return req, {m, m[::-1]}


def scan_request(own: str) -> sandbox.ExecRequest:
    """The scanner as a warm `python_main` task (it inherits the memory of the
    process it is forked from); `own` is a marker in its own stdin, which the
    scan must find (a control: the scan reads request bytes in memory)."""
    return sandbox.ExecRequest(
        files={"scan.py": SCANNER + "\nimport sys\nheld = sys.stdin.read()\nscan()\n"},
        python_main="scan.py",
        stdin=own.encode(),
        collect=(".leakscan",),
        limits=sandbox.Limits(wall_s=60, cpu_s=60, **SCAN_LIMITS),
    )


def found_markers(result, markers: set[str], own: str) -> set[str]:
    """Markers of earlier requests in one scan's dump (its own marker must be there)."""
    dump = dump_of(result)
    assert strip(own) in dump, "control: the scan did not find its own request's stdin in memory"
    return {m for m in markers if strip(m) in dump}


def run_marked(runner, rng: random.Random, n: int) -> set[str]:
    out: set[str] = set()
    for _ in range(n):
        req, held = marked_request(rng, rng.choice(MARKER_KINDS))
        res = sandbox.raise_for_infra(runner(req))
        assert res.ok, (res.status, res.stderr[-300:])
        out |= held
    return out


def memory_pool(backend: str, workers: int = 1) -> sandbox.Pool:
    missing = sandbox.probe().missing(backend)
    if missing:
        pytest.skip(f"{backend} unavailable: {missing}")
    return sandbox.Pool(SandboxConfig(backend=backend, workers=workers))


def assert_unseen(result, markers: set[str], own: str) -> None:
    leaked = found_markers(result, markers, own)
    assert not leaked, f"{len(leaked)} of {len(markers)} earlier markers found: {sorted(leaked)[:4]}"


@pytest.mark.parametrize(("backend", "seed"), [("forkserver", 0), ("forkserver", 1), ("forkserver", 2), ("bwrap", 0)])
def test_no_request_finds_an_earlier_requests_bytes_in_its_memory(backend, seed):
    """Property: for a generated mix of requests carrying markers (source,
    stdin, files, argv, env, stdout, stderr, collected files) served by one
    warm worker, a later one-shot or session step finds no earlier marker in
    any memory it can read (its own process, every other process it can see)
    or under /task, /tmp and /dev/shm. A session may see its own earlier
    steps (one episode's state), never an earlier one-shot's or another
    session's."""
    rng = random.Random(seed)
    with memory_pool(backend) as p:
        oneshots = run_marked(p.run, rng, 6)
        own = marker(rng, "own")
        assert_unseen(p.run(scan_request(own)), oneshots, own)

        opened = marker(rng, "opened")
        with p.session({"notes.txt": opened}) as s:
            steps = run_marked(s.run, rng, 3)
            own = marker(rng, "own")
            assert_unseen(s.run(scan_request(own)), oneshots, own)
        first_session = steps | {opened}

        oneshots |= run_marked(p.run, rng, 3)
        with p.session({}) as s:
            own = marker(rng, "own")
            assert_unseen(s.run(scan_request(own)), oneshots | first_session, own)
        own = marker(rng, "own")
        assert_unseen(p.run(scan_request(own)), oneshots | first_session, own)


def test_a_request_running_on_another_worker_is_not_readable():
    """A group-mate running at the same time on the pool's other worker
    (holding its marker in memory and in its files) is not found."""
    import concurrent.futures

    rng = random.Random(7)
    m = marker(rng, "concurrent")
    mate = sandbox.ExecRequest(
        files={
            "main.py": f"import time\nvalue = {m[::-1]!r}[::-1]\nopen('/tmp/held', 'w').write(value)\ntime.sleep(4)\n"
        },
        python_main="main.py",
        limits=sandbox.Limits(wall_s=20, cpu_s=20),
    )
    with memory_pool("forkserver", workers=2) as p, concurrent.futures.ThreadPoolExecutor(1) as ex:
        running = ex.submit(p.run, mate)
        for _ in range(400):  # until a worker has forked the group-mate's runner
            if any(_children(pid) for pid in p.worker_pids()):
                break
            time.sleep(0.01)
        time.sleep(0.5)  # and its task holds the marker
        own = marker(rng, "own")
        assert_unseen(p.run(scan_request(own)), {m, m[::-1]}, own)
        assert running.result().ok


def _children(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return ""


def process_text(pid: int) -> bytes:
    """Every readable mapping of process `pid`, read from the host (as root)."""
    out = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps.read().splitlines():
            parts = line.split()
            if parts[1][0] != "r" or (len(parts) > 5 and parts[5] in ("[vvar]", "[vsyscall]")):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            try:
                mem.seek(lo)
                out.append(mem.read(hi - lo))
            except (OSError, ValueError, OverflowError):
                pass
    return b"\0".join(out)


def test_the_worker_itself_never_holds_a_request_or_a_result():
    """By construction, not by scrubbing: after requests of every marker kind
    and a session (files, steps, snapshot, restore), the warm worker's whole
    memory, read from the host, holds none of their markers, so nothing a
    later request forks from ever held them. Control: the same read of this
    test's own process finds them."""
    rng = random.Random(11)
    with memory_pool("forkserver") as p:
        held = set()
        for kind in MARKER_KINDS:
            req, markers = marked_request(rng, kind)
            assert sandbox.raise_for_infra(p.run(req)).ok
            held |= markers
        opened = marker(rng, "opened")
        with p.session({"notes.txt": opened}) as s:
            held |= {opened} | run_marked(s.run, rng, 3)
            s.restore(s.snapshot())
        worker = p.worker_pids()[0]
        text = process_text(worker)  # read once: each read copies the whole address space
        found = {m for m in held if m.encode() in text}
        assert not found, sorted(found)[:4]
        own = process_text(os.getpid())
        assert all(m.encode() in own for m in held)  # control: the read finds them
