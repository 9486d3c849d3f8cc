"""Latency of a warm one-shot fork-server run, before and after the runner per request.

Before: the worker forked every task tree from itself, so its freed memory
(earlier requests and results) was inherited by later tasks. After: the
worker is a clean template that forks one runner per request, and the
runner reads the request, forks the task tree, answers and exits.

Each side runs in its own subprocess, from its own source tree: "before" is
`git archive REV src` of the commit before the change (default below),
"after" is this checkout's src. The sides alternate for `--rounds` rounds
(the machine is shared: alternation spreads its load over both). In each
round: one worker, 20 warm-up runs, then `--n` sequential runs of each
kind, timed one by one in the caller:
  python   python_main "print(1)" (runs in the forked, warm interpreter)
  argv     argv ("true",) (the task execs a binary)
  session  a session step, argv ("true",) (the session opened once per round)
Reported per kind: median and 90th percentile of the wall per run across
all rounds, and CPU per run (this process, the worker and everything it
reaped: the runners and task trees); peak RSS (VmHWM) of the warm worker
and, after, of the largest runner; peak RSS of the measuring process.

    sudo .venv/bin/python bench/sandbox_latency.py [--n 300] [--rounds 3] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

BEFORE = "a44aebb"  # the last commit whose worker forked task trees from itself
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def measure(n: int) -> dict:
    """One round on the posttrain found on sys.path: walls in ms per kind, CPU, RSS."""
    from posttrain import sandbox as sb

    lim = sb.Limits(wall_s=10, cpu_s=10)
    kinds = {
        "python": sb.ExecRequest(files={"m.py": "print(1)\n"}, python_main="m.py", limits=lim),
        "argv": sb.ExecRequest(argv=("true",), limits=lim),
    }
    out: dict = {"wall_ms": {}, "cpu_ms": {}}
    with sb.Pool(sb.SandboxConfig(workers=1)) as pool:
        for _ in range(20):
            pool.run(kinds["python"])
        for name, req in kinds.items():
            out["wall_ms"][name], out["cpu_ms"][name] = _timed(pool, lambda req=req: pool.run(req), n)
        with pool.session({"a.txt": "a"}) as s:
            step = sb.ExecRequest(argv=("true",), limits=lim)
            out["wall_ms"]["session"], out["cpu_ms"]["session"] = _timed(pool, lambda: s.run(step), n)
        info = pool.worker_info()[0]
    out["worker_peak_rss_kb"] = info["peak_rss_kb"]
    out["runner_peak_rss_kb"] = info.get("runner_peak_rss_kb")
    out["self_peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


def _timed(pool, call, n: int) -> tuple[list[float], float]:
    walls = []
    cpu0 = _own_cpu() + pool.cpu_seconds()
    for _ in range(n):
        t0 = time.perf_counter()
        res = call()
        walls.append(1000 * (time.perf_counter() - t0))
        if not res.ok:
            raise SystemExit(f"a benchmark run failed: {res.status} {res.error} {res.stderr[-200:]!r}")
    cpu = _own_cpu() + pool.cpu_seconds() - cpu0
    return walls, 1000 * cpu / n


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def export(rev: str, into: str) -> str:
    """`src/` of commit `rev`, unpacked under `into`."""
    tar = subprocess.run(["git", "-C", REPO, "archive", rev, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=tar, check=True)
    return os.path.join(into, "src")


def one_round(src: str, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--measure", str(n)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"measurement from {src} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(rounds: list[dict]) -> dict:
    kinds = rounds[0]["wall_ms"]
    out = {}
    for k in kinds:
        walls = sorted(w for r in rounds for w in r["wall_ms"][k])
        out[k] = {
            "median": statistics.median(walls),
            "p90": walls[int(0.9 * (len(walls) - 1))],
            "cpu": statistics.median(r["cpu_ms"][k] for r in rounds),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default=BEFORE, help="the commit measured as 'before'")
    ap.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # one round, in the subprocess
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-before-") as tmp:
        os.chmod(tmp, 0o755)
        sides = {"before": export(args.before, tmp), "after": os.path.join(REPO, "src")}
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, src in sides.items():
                runs[side].append(one_round(src, args.n))
    stats = {side: summary(r) for side, r in runs.items()}
    print(
        f"warm one-shot runs on one fork-server worker: {args.rounds} rounds x {args.n} runs per kind, sides "
        f"alternating; before = {args.before}, after = this checkout; {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(f"{'kind':8s} {'side':7s} {'median ms':>10s} {'p90 ms':>8s} {'CPU ms/run':>11s}")
    for kind in stats["after"]:
        for side in sides:
            s = stats[side][kind]
            print(f"{kind:8s} {side:7s} {s['median']:10.2f} {s['p90']:8.2f} {s['cpu']:11.2f}")
        b, a = stats["before"][kind], stats["after"][kind]
        d = {key: a[key] - b[key] for key in a}
        print(f"{kind:8s} {'cost':7s} {d['median']:+10.2f} {d['p90']:+8.2f} {d['cpu']:+11.2f}")
    for side in sides:
        worker = max(r["worker_peak_rss_kb"] for r in runs[side]) / 1024
        runner = [r["runner_peak_rss_kb"] for r in runs[side] if r["runner_peak_rss_kb"]]
        extra = f", largest runner {max(runner) / 1024:.1f} MiB" if runner else ""
        own = max(r["self_peak_rss_kb"] for r in runs[side]) / 1024
        print(f"peak RSS {side}: warm worker (VmHWM) {worker:.1f} MiB{extra}; measuring process {own:.1f} MiB")


if __name__ == "__main__":
    main()
