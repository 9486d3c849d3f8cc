"""Connection bounds (issue 35 item 6), with real sockets against `posttrain serve` in its own
process: clients that trickle their bodies or hold half-sent headers, far more of them than the
server's in-flight slots and than the file descriptors it may open, while /health and a normal chat
request must still get through. Before: the trickling bodies held every in-flight slot (each chat got
429) and the half-sent headers exhausted the descriptors (/health stopped answering)."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from serve_helpers import save_model

from serve_process import posttrain_serve

LIVENESS_S = 30.0
"""A liveness bound on one /health or chat call under attack (not a latency target)."""
FD_LIMIT = 160
"""The server process's file-descriptor limit in this test (its guard leaves 64 of them free)."""


@contextlib.contextmanager
def _serve_with_fd_limit(model_dir, *sets: str) -> Iterator[str]:
    """`posttrain serve` started with RLIMIT_NOFILE at FD_LIMIT (inherited from this process,
    whose own limit is restored at once)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, hard))
    try:
        cm = posttrain_serve(model_dir, *sets)
        url, _ = cm.__enter__()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    """One server for the module: one in-flight slot, bodies and headers given long deadlines
    except the header deadline's own test (5 s), so what frees the server is its bounds."""
    path = save_model(tmp_path_factory.mktemp("conn") / "m", "micro", seed=1)
    sets = ("limits.max_inflight=1", "limits.body_timeout_s=600", "limits.header_timeout_s=5")
    with _serve_with_fd_limit(path, *sets) as base:
        yield base


def _open(url: str, head: bytes, n: int) -> list[socket.socket]:
    """`n` connections that each sent `head` and then nothing more (those the server refuses or
    closes at once are kept too: the client does not know)."""
    host = urlparse(url)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host.hostname, host.port), timeout=10)
        with contextlib.suppress(OSError):
            s.sendall(head)
        socks.append(s)
    return socks


TRICKLE = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b'content-length: 4000\r\n\r\n{"model": '
)
"""A chat request whose body has begun and stays unfinished (within the body deadline)."""
HALF_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: "
"""A request whose headers never end."""


def _chat(url: str) -> httpx.Response:
    body = {"model": "posttrain", "messages": [{"role": "user", "content": "rev ab="}], "max_tokens": 3}
    with httpx.Client(timeout=LIVENESS_S) as client:
        return client.post(url + "/v1/chat/completions", json=body)


def test_trickling_bodies_and_half_sent_headers_never_lock_out_health_or_a_normal_chat(url):
    """Property: whatever mix of stalled clients is connected (more trickling bodies than
    max_inflight, more half-sent headers than the descriptors the server may open), each fresh
    /health and each normal chat is answered 200; no chat gets 429 for slots held by unfinished
    bodies."""
    held: list[socket.socket] = []
    try:
        for head, n in ((TRICKLE, 12), (HALF_HEADERS, 2 * FD_LIMIT), (TRICKLE, 12)):
            held += _open(url, head, n)  # 12 > max_inflight 1; 2 x FD_LIMIT > the descriptors
            health = httpx.get(url + "/health", timeout=LIVENESS_S)
            assert health.status_code == 200, health.text
            chat = _chat(url)
            assert chat.status_code == 200, chat.text
            assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        closed = httpx.get(url + "/metrics", timeout=LIVENESS_S).text
        assert 'posttrain_connections_closed_total{reason="evicted_per_client"}' in closed, closed[-800:]
    finally:
        for s in held:
            s.close()


def test_headers_past_their_deadline_close_the_connection(url):
    """A client that opens a connection and never finishes its headers is closed after
    header_timeout_s (the server closes it: the client reads end-of-stream)."""
    (s,) = _open(url, HALF_HEADERS, 1)
    with s:
        s.settimeout(LIVENESS_S)
        assert s.recv(1024) == b""  # closed by the server, not by this timeout
    assert 'reason="header_timeout"' in httpx.get(url + "/metrics", timeout=LIVENESS_S).text


def test_a_body_that_arrives_takes_a_slot_only_then(url):
    """With max_inflight 1, a request whose body is still arriving holds no slot: a normal chat is
    served meanwhile; once the slow body is complete it is served too."""
    body = json.dumps({"model": "posttrain", "messages": [{"role": "user", "content": "ab="}], "max_tokens": 2})
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
    )
    (slow,) = _open(url, head + body[:5].encode(), 1)
    with slow:
        assert _chat(url).status_code == 200
        slow.sendall(body[5:].encode())
        slow.settimeout(LIVENESS_S)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += slow.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
