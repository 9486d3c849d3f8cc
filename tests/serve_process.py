"""`posttrain serve` as a subprocess on a free loopback port, for the tests that need a real server
process (its own event loop, memory and address): started as a user would, waited on until /health
answers, stopped when the block ends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def posttrain_serve(
    model_dir: str | Path | None, *sets: str, env: Mapping[str, str] | None = None, policy: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """(base url, process) of `posttrain serve --model model_dir` (or `--policy policy`, a rule-based
    chat model) with `--set` for each of `sets` (canary probes off), one OMP thread, and `env` over this
    process's environment."""
    port = free_port()
    exe = Path(sys.executable).with_name("posttrain")
    what = ["--policy", policy] if policy is not None else ["--model", str(model_dir)]
    cmd = [str(exe), "serve", *what, "--port", str(port), "--set", "canary.probe_domains=[]"]
    for s in sets:
        cmd += ["--set", s]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(proc: subprocess.Popen[str], url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"posttrain serve exited: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("posttrain serve did not become healthy")
        time.sleep(0.3)
