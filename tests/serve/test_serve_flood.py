"""Flood test: `posttrain serve` in its own process on loopback, attacked from several clients
at once with oversized, huge-prompt and deeply nested requests while normal clients send
ordinary completions and a poller hits /health. Health answers every time, the server's
memory stays within a stated bound, every normal request succeeds, every bad one gets its
own OpenAI-shaped 4xx, and weight updates without the admin token, with a wrong one, or
from a client outside the allowlist are refused while the served weights stay unchanged."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from serve_helpers import save_model

from serve_process import posttrain_serve

TOKEN = "flood-test-admin-token"
RSS_BOUND_MIB = 300
"""Largest growth of the server's resident memory over its warmed-up baseline."""
HEALTH_TIMEOUT_S = 10.0
"""A liveness bound: every /health poll must answer within it (not a latency target)."""


@contextlib.contextmanager
def _serve(model_dir: Path) -> Iterator[tuple[str, int]]:
    """`posttrain serve` as a subprocess with the admin token, admin calls from 127.0.0.1 only."""
    env = {"POSTTRAIN_ADMIN_TOKEN": TOKEN}
    with posttrain_serve(model_dir, "admin.allow_clients=[127.0.0.1/32]", env=env) as (url, proc):
        yield url, proc.pid


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode()


def _chunks(total: int) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        for _ in range(total // 65536):
            yield b"a" * 65536

    return gen


M = "posttrain"
BAD: list[tuple[str, str, Callable[[], object], int, str]] = [
    # (name, path, body factory, expected status, expected error code)
    ("body 4 MiB", "/v1/completions", lambda: _json({"model": M, "prompt": "a" * (4 << 20)}), 413, "request_too_large"),
    ("chunked 2 MiB", "/v1/completions", _chunks(2 << 20), 413, "request_too_large"),
    ("200k chars", "/v1/completions", lambda: _json({"model": M, "prompt": "a" * 200_000}), 400, "limit_exceeded"),
    ("100k tokens", "/v1/completions", lambda: _json({"model": M, "prompt": "ab" * 50_000}), 400, "limit_exceeded"),
    ("150k ids", "/v1/completions", lambda: _json({"model": M, "prompt": [7] * 150_000}), 400, "limit_exceeded"),
    (
        "chat 100k chars",
        "/v1/chat/completions",
        lambda: _json({"model": M, "messages": [{"role": "user", "content": "b" * 100_000}]}),
        400,
        "limit_exceeded",
    ),
    (
        "10k messages",
        "/v1/chat/completions",
        lambda: _json({"model": M, "messages": [{"role": "user", "content": "x"}] * 10_000}),
        400,
        "limit_exceeded",
    ),
    (
        "depth 200k",
        "/v1/completions",
        lambda: b'{"model": "posttrain", "prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        400,
        "nesting_too_deep",
    ),
    (
        "depth 100k chat",
        "/v1/chat/completions",
        lambda: b'{"model": "posttrain", "messages": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        400,
        "nesting_too_deep",
    ),
    ("n 1000", "/v1/completions", lambda: _json({"model": M, "prompt": "rev ab=", "n": 1000}), 400, "None"),
    ("not json", "/v1/completions", lambda: b'{"model": "posttrain", "prompt": [1, 2,', 400, "None"),
]


@dataclass
class _Log:
    health: list[int | str] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    bad: list[tuple[str, int | str, str]] = field(default_factory=list)
    normal: list[int | str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _bad_client(url: str, rounds: int, log: _Log) -> None:
    with httpx.Client(timeout=60) as client:
        for _ in range(rounds):
            for name, path, body, _, _ in BAD:
                try:
                    r = client.post(url + path, content=body(), headers={"content-type": "application/json"})
                    code = str(r.json()["error"]["code"])
                    outcome: tuple[str, int | str, str] = (name, r.status_code, code)
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                    outcome = (name, f"{type(exc).__name__}: {exc}", "")
                with log.lock:
                    log.bad.append(outcome)


def _normal_client(url: str, requests: int, log: _Log) -> None:
    with httpx.Client(timeout=120) as client:
        for i in range(requests):
            body = {"model": M, "messages": [{"role": "user", "content": f"rev ab{i % 7}="}], "max_tokens": 4}
            try:
                r = client.post(url + "/v1/chat/completions", json=body)
                ok = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
                got: int | str = 200 if ok else f"{r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                got = f"{type(exc).__name__}: {exc}"
            with log.lock:
                log.normal.append(got)


def _poller(url: str, pid: int, done: threading.Event, log: _Log) -> None:
    with httpx.Client(timeout=HEALTH_TIMEOUT_S) as client:
        while not done.is_set():
            try:
                log.health.append(client.get(url + "/health").status_code)
            except httpx.HTTPError as exc:
                log.health.append(f"{type(exc).__name__}: {exc}")
            log.rss.append(_rss_mib(pid))
            time.sleep(0.1)


def _admin_attempts(url: str) -> list[int]:
    """Weight updates a stranger would try: no token, a wrong token, the token from 127.0.0.2."""
    body = {"path": "/tmp"}
    out = [httpx.post(url + "/v1/update_weights", json=body, timeout=30).status_code]
    out.append(
        httpx.post(
            url + "/v1/update_weights", json=body, headers={"Authorization": "Bearer nope"}, timeout=30
        ).status_code
    )
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
    with other:
        out.append(other.post(url + "/v1/update_weights", json=body, headers=_auth()).status_code)
    return out


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _fingerprint(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json={"model": M, "prompt": [4, 5], "max_tokens": 1}, timeout=60)
    return str(r.json()["system_fingerprint"])


@pytest.mark.parametrize(
    ("bad_clients", "rounds", "normal_clients", "normal_requests"),
    [pytest.param(3, 1, 2, 6, id="small"), pytest.param(6, 4, 4, 20, id="large", marks=pytest.mark.slow)],
)
def test_flood_keeps_health_memory_and_weights(tmp_path, bad_clients, rounds, normal_clients, normal_requests):
    model_dir = save_model(tmp_path / "m", "micro", seed=4)
    new_weights = save_model(tmp_path / "m2", "micro", seed=5)
    with _serve(model_dir) as (url, pid):
        for _ in range(3):  # warm up the paths a normal request takes
            assert _fingerprint(url) == "v0-w0"
        baseline = _rss_mib(pid)
        log, done = _Log(), threading.Event()
        poller = threading.Thread(target=_poller, args=(url, pid, done, log), daemon=True)
        poller.start()
        with ThreadPoolExecutor(bad_clients + normal_clients + 1) as pool:
            jobs = [pool.submit(_bad_client, url, rounds, log) for _ in range(bad_clients)]
            jobs += [pool.submit(_normal_client, url, normal_requests, log) for _ in range(normal_clients)]
            admin = pool.submit(_admin_attempts, url)
            for job in jobs:
                job.result(timeout=600)
            refused = admin.result(timeout=60)
        done.set()
        poller.join(timeout=30)
        peak = max([*log.rss, _rss_mib(pid)])

        assert log.health and all(h == 200 for h in log.health), [h for h in log.health if h != 200][:5]
        assert log.normal == [200] * (normal_clients * normal_requests), [n for n in log.normal if n != 200][:5]
        want = {name: (status, code) for name, _, _, status, code in BAD}
        wrong = [(name, got, code) for name, got, code in log.bad if (got, code) != want[name]]
        assert not wrong and len(log.bad) == bad_clients * rounds * len(BAD), wrong[:5]
        assert peak - baseline < RSS_BOUND_MIB, f"RSS {baseline:.0f} -> {peak:.0f} MiB"
        assert refused == [401, 401, 403]
        assert _fingerprint(url) == "v0-w0"  # nothing the strangers sent changed the weights
        r = httpx.post(url + "/v1/update_weights", json={"path": str(new_weights)}, headers=_auth(), timeout=60)
        assert r.status_code == 200 and r.json()["weights"] == 1
        assert _fingerprint(url) == "v0-w1"  # the token holder's update does
        assert httpx.get(url + "/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
