"""Flood benchmark: /health latency, normal-client latency and server memory while
several clients send oversized, huge-prompt and deeply nested requests to
`posttrain serve` (a separate process on loopback).

Prints, for one run: every /health poll's latency (p50, p99, max) and failures,
the normal clients' chat latency and failures, each bad request's outcome
(status: count), and the server's resident memory (warmed-up baseline, sampled
peak, VmHWM). `--src DIR` runs the server from another checkout's `src/`
(e.g. `git archive` of an older commit) for a before/after figure.

.venv/bin/python bench/serving_flood.py --bad-clients 4 --rounds 2
.venv/bin/python bench/serving_flood.py --src /tmp/old/src --bad-clients 4 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

M = "posttrain"
BAD = {
    "body 4 MiB": ("/v1/completions", lambda: json.dumps({"model": M, "prompt": "a" * (4 << 20)}).encode()),
    "200k chars": ("/v1/completions", lambda: json.dumps({"model": M, "prompt": "a" * 200_000}).encode()),
    "150k ids": ("/v1/completions", lambda: json.dumps({"model": M, "prompt": [7] * 150_000}).encode()),
    "10k messages": (
        "/v1/chat/completions",
        lambda: json.dumps({"model": M, "messages": [{"role": "user", "content": "x"}] * 10_000}).encode(),
    ),
    "depth 200k": (
        "/v1/completions",
        lambda: b'{"model": "posttrain", "prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(model_dir: Path, src: str | None) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "POSTTRAIN_ADMIN_TOKEN": "bench"}
    if src:
        env["PYTHONPATH"] = src
    code = "import sys; from posttrain.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "serve", "--model", str(model_dir), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--set", "canary.probe_domains=[]"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def status_mib(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: a random micro model)")
    ap.add_argument("--src", help="PYTHONPATH for the server (another checkout's src/)")
    ap.add_argument("--bad-clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--normal-clients", type=int, default=2)
    ap.add_argument("--normal-requests", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    args = ap.parse_args()
    if args.model:
        model_dir = Path(args.model)
    else:
        from posttrain.model.arch import random_model

        model_dir = Path(tempfile.mkdtemp()) / "m"
        model, tok = random_model("micro", 0)
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    health: list[float] = []
    health_fail: list[str] = []
    normal: list[float] = []
    normal_fail: list[str] = []
    outcomes: Counter[str] = Counter()
    rss: list[float] = []
    with serve(model_dir, args.src) as (url, pid):
        chat = {"model": M, "messages": [{"role": "user", "content": "rev ab="}], "max_tokens": 4}
        for _ in range(3):
            httpx.post(url + "/v1/chat/completions", json=chat, timeout=60)
        baseline = status_mib(pid, "VmRSS")
        done = threading.Event()

        def poll() -> None:
            with httpx.Client(timeout=args.timeout) as c:
                while not done.is_set():
                    t0 = time.monotonic()
                    try:
                        status = str(c.get(url + "/health").status_code)
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    if status == "200":
                        health.append(time.monotonic() - t0)
                    else:
                        health_fail.append(status)
                    rss.append(status_mib(pid, "VmRSS"))
                    time.sleep(0.1)

        def bad() -> None:
            with httpx.Client(timeout=args.timeout) as c:
                for _ in range(args.rounds):
                    for name, (path, body) in BAD.items():
                        try:
                            r = c.post(url + path, content=body(), headers={"content-type": "application/json"})
                            outcomes[f"{name}: {r.status_code}"] += 1
                        except httpx.HTTPError as exc:
                            outcomes[f"{name}: {type(exc).__name__}"] += 1

        def good() -> None:
            with httpx.Client(timeout=args.timeout) as c:
                for _ in range(args.normal_requests):
                    t0 = time.monotonic()
                    try:
                        status = str(c.post(url + "/v1/chat/completions", json=chat).status_code)
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    if status == "200":
                        normal.append(time.monotonic() - t0)
                    else:
                        normal_fail.append(status)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.bad_clients + args.normal_clients) as pool:
            jobs = [pool.submit(bad) for _ in range(args.bad_clients)]
            jobs += [pool.submit(good) for _ in range(args.normal_clients)]
            for j in jobs:
                j.result()
        wall = time.monotonic() - t0
        done.set()
        poller.join()
        hwm = status_mib(pid, "VmHWM")
    print(f"server: {'src ' + args.src if args.src else 'this checkout'}; flood {wall:.1f} s wall")
    print(
        f"/health: {len(health)} ok, {len(health_fail)} failed; latency p50 {pct(health, 0.5) * 1000:.0f} ms, "
        f"p99 {pct(health, 0.99) * 1000:.0f} ms, max {max(health, default=float('nan')) * 1000:.0f} ms"
    )
    print(
        f"normal chat: {len(normal)} ok, {len(normal_fail)} failed {Counter(normal_fail)}; latency p50 "
        f"{pct(normal, 0.5) * 1000:.0f} ms, max {max(normal, default=float('nan')) * 1000:.0f} ms"
    )
    print("bad requests: " + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())))
    print(
        f"server RSS: baseline {baseline:.0f} MiB, sampled peak {max(rss, default=baseline):.0f} MiB "
        f"(+{max(rss, default=baseline) - baseline:.0f}), VmHWM {hwm:.0f} MiB"
    )
    print(f"bench client peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
