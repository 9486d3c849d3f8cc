"""Sandbox throughput and CPU per task, side by side in one run.

Part 1: 200 solution-plus-unittest programs (the `code` domain's reference
solutions with their hidden tests as a unittest suite) at concurrency 2 on:
  warm   the fork-server pool (default backend; tests run in the forked, warm child)
  bwrap  one-shot bubblewrap (a new interpreter per program)
  plain  a plain subprocess, no isolation (a new interpreter per program)
Part 2: `code` domain tasks judged end to end (sandbox call + comparison),
every task's reference solution in turn, at the same concurrency:
  new judge, warm pool      the domain's judge: inputs in, outputs out, host compares
  old judge, warm pool      the judge before it (bench/legacy_code_harness.py; its
                            request held the expected values: kept here only)
  new judge, one-shot bwrap the domain's judge on bubblewrap
CPU per task counts this process and every process it started (workers and
their task trees included). Also: peak RSS of a warm worker (VmHWM) after
each warm run, and of this process.

    .venv/bin/python bench/sandbox.py [--n 200] [--code-n 244] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from posttrain import sandbox as sb
from posttrain.domains import code as C
from posttrain.domains.code import load_tasks

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_code_harness.py")

PROGRAM = """{solution}

import json, unittest

CASES = json.loads({cases!r})


class Hidden(unittest.TestCase):
    def test_cases(self):
        for case in CASES:
            with self.subTest(case=case):
                if {is_class}:
                    obj, got = None, []
                    for method, args in case["calls"]:
                        if method == "__init__":
                            obj = {name}(*args)
                            got.append(None)
                        else:
                            got.append(getattr(obj, method)(*args))
                else:
                    got = {name}(*case["args"])
                self.assertEqual(json.loads(json.dumps(got)), case["expected"])


if __name__ == "__main__":
    unittest.main(argv=["hidden"], verbosity=0, exit=True)
"""


def programs(n: int) -> list[str]:
    tasks = [t for t in load_tasks() if t.name != "count_inversions"]  # keep programs comparable in size
    out = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        out.append(
            PROGRAM.format(
                solution=t.solution, cases=json.dumps(list(t.tests)), is_class=t.kind == "class", name=t.name
            )
        )
    return out


class CpuMeter:
    """CPU seconds of this process and all its descendants, reaped or not.

    cgroup v1: this process moves into its own cpuacct cgroup (children
    inherit it; the sandbox moves its workers in memory/pids/cpu only), read
    from cpuacct.usage. Otherwise rusage of self + reaped children, which
    misses processes reaped by someone else (bubblewrap's init)."""

    def __init__(self) -> None:
        self.path = None
        own = {line.split(":")[1]: line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines()}
        base = "/sys/fs/cgroup/cpuacct"
        if "cpuacct" in own and os.path.isdir(base) and os.geteuid() == 0:
            self.path = os.path.join(base + own["cpuacct"].rstrip("/"), f"posttrain-bench-{os.getpid()}")
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
        self.source = "cpuacct cgroup" if self.path else "rusage (self + reaped children)"

    def seconds(self) -> float:
        if self.path:
            with open(os.path.join(self.path, "cpuacct.usage")) as fh:
                return int(fh.read()) / 1e9
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    def close(self) -> None:
        if self.path:
            parent = os.path.dirname(self.path)
            with open(os.path.join(parent, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
            os.rmdir(self.path)


def run_plain(src: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="bench-plain-") as d:
        with open(os.path.join(d, "main.py"), "w") as fh:
            fh.write(src)
        done = subprocess.run([sys.executable, "-E", "-s", "main.py"], cwd=d, capture_output=True, timeout=60)
        return done.returncode == 0


def code_jobs(n: int) -> list[tuple[C.CodeReference, str]]:
    tasks = load_tasks()
    jobs = []
    for i in range(n):
        t = tasks[i % len(tasks)]
        level_timeout = C.TEST_TIMEOUT_S[t.level]
        jobs.append((C.CodeReference(t.name, t.kind, t.mode, json.dumps(list(t.tests)), level_timeout), t.solution))
    return jobs


def new_judge(runner):
    def one(job) -> bool:
        ref, code = job
        return C.judge(ref, C.execute(ref, code, runner)).passed

    return one


def old_judge(runner):
    """The judge before this one: tests with expected values and a nonce on stdin."""
    with open(LEGACY) as fh:
        harness = fh.read()

    def one(job) -> bool:
        ref, code = job
        nonce = os.urandom(16).hex()
        tests = json.loads(ref.tests_json)
        spec = {"nonce": nonce, "tests": tests, "mode": ref.mode, "timeout_s": ref.timeout_s}
        wall = ref.timeout_s * len(tests) + 10.0
        req = sb.ExecRequest(
            files={"harness.py": harness, "solution.py": code},
            python_main="harness.py",
            stdin=json.dumps(spec).encode(),
            env={"HARNESS_TESTS": str(len(tests)), "HARNESS_ENTRY": ref.name, "HARNESS_KIND": ref.kind},
            limits=sb.Limits(
                wall_s=wall, cpu_s=wall, memory_bytes=512 << 20, pids=len(tests) + 16, output_bytes=1 << 20
            ),
        )
        res = runner(req)
        for line in reversed(res.stdout.decode("utf-8", "replace").splitlines()):
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if isinstance(report, dict) and report.get("nonce") == nonce:
                return report["passed"] == report["total"]
        return False

    return one


def measure(label: str, fn, progs: list, concurrency: int, meter: CpuMeter) -> dict:
    cpu0, t0 = meter.seconds(), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        oks = list(ex.map(fn, progs))
    wall = time.perf_counter() - t0
    cpu = meter.seconds() - cpu0
    return {
        "backend": label,
        "ok": sum(oks),
        "n": len(progs),
        "tasks_per_s": len(progs) / wall,
        "cpu_ms_per_task": 1000 * cpu / len(progs),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--code-n", type=int, default=244, help="code tasks judged per backend (the 61 tasks in turn)")
    ap.add_argument("--concurrency", type=int, default=2)
    args = ap.parse_args()
    progs = programs(args.n)
    jobs = code_jobs(args.code_n)
    limits = sb.Limits(wall_s=60, cpu_s=30)

    def req(src: str) -> sb.ExecRequest:
        return sb.ExecRequest(files={"main.py": src}, python_main="main.py", limits=limits)

    rows, code_rows = [], []
    meter = CpuMeter()
    # the sandbox tree is one scheduling entity: weight it like `concurrency` ordinary processes
    with sb.Pool(sb.SandboxConfig(workers=args.concurrency, cpu_weight=100 * args.concurrency)) as warm:
        for src in progs[:4]:
            warm.run(req(src))  # warm-up, not measured
        rows.append(measure("warm fork-server pool", lambda s: warm.run(req(s)).ok, progs, args.concurrency, meter))
        worker_rss = max(info["peak_rss_kb"] for info in warm.worker_info())
        for job in jobs[:4]:
            new_judge(warm.run)(job), old_judge(warm.run)(job)  # warm-up, not measured
        code_rows.append(measure("new judge, warm pool", new_judge(warm.run), jobs, args.concurrency, meter))
        rss_new = max(info["peak_rss_kb"] for info in warm.worker_info())
        code_rows.append(measure("old judge, warm pool", old_judge(warm.run), jobs, args.concurrency, meter))
        rss_old = max(info["peak_rss_kb"] for info in warm.worker_info())
    with sb.Pool(sb.SandboxConfig(backend="bwrap", workers=args.concurrency)) as bw:
        rows.append(measure("one-shot bubblewrap", lambda s: bw.run(req(s)).ok, progs, args.concurrency, meter))
        code_rows.append(measure("new judge, one-shot bwrap", new_judge(bw.run), jobs, args.concurrency, meter))
    rows.append(measure("plain subprocess (no isolation)", run_plain, progs, args.concurrency, meter))
    meter.close()

    print(
        f"{args.n} solution+unittest programs, concurrency {args.concurrency}, {os.cpu_count()} cores; CPU from "
        f"{meter.source}"
    )
    print(f"{'backend':34s} {'ok':>7s} {'tasks/s':>8s} {'CPU ms/task':>12s}")
    for r in rows:
        print(f"{r['backend']:34s} {r['ok']:>3d}/{r['n']:<3d} {r['tasks_per_s']:8.1f} {r['cpu_ms_per_task']:12.1f}")
    warm_r, bw_r, plain_r = rows
    print(f"throughput warm / bwrap: {warm_r['tasks_per_s'] / bw_r['tasks_per_s']:.2f}x (target >= 2)")
    print(f"CPU per task warm / plain: {warm_r['cpu_ms_per_task'] / plain_r['cpu_ms_per_task']:.2f}x (target <= 1.5)")
    print(f"peak RSS of a warm worker (VmHWM): {worker_rss / 1024:.1f} MiB (target < 50)")
    print()
    print(
        f"{args.code_n} code tasks judged end to end (reference solutions, {len(load_tasks())} tasks in turn), "
        f"concurrency {args.concurrency}"
    )
    print(f"{'judge':34s} {'passed':>7s} {'tasks/s':>8s} {'CPU ms/task':>12s}")
    for r in code_rows:
        print(f"{r['backend']:34s} {r['ok']:>3d}/{r['n']:<3d} {r['tasks_per_s']:8.1f} {r['cpu_ms_per_task']:12.1f}")
    new_r, old_r, bwc_r = code_rows
    print(f"code tasks/s new judge / old judge (warm): {new_r['tasks_per_s'] / old_r['tasks_per_s']:.2f}x")
    print(
        f"code tasks/s new judge warm / new judge one-shot bwrap: {new_r['tasks_per_s'] / bwc_r['tasks_per_s']:.2f}x "
        "(target >= 3)"
    )
    print(
        f"peak RSS of a warm worker (VmHWM) after the new judge: {rss_new / 1024:.1f} MiB; after the old judge too: "
        f"{rss_old / 1024:.1f} MiB"
    )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
