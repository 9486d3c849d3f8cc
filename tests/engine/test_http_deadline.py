"""Every engine, judge and reward-model HTTP call ends within its timeout (engine/http.py), even
against a server that trickles its answer a byte at a time, each byte well within the read timeout."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from posttrain.engine import http
from posttrain.engine.openai import OpenAIEngine
from posttrain.errors import GenerationError
from posttrain.types import Message

BYTE_GAP_S = 0.02
"""Seconds between two bytes of the trickled answer: far below every timeout used here."""
TIMEOUT_S = 0.3
"""The calls' timeout: the whole answer takes ~3 s to trickle (150 bytes), ten times longer."""

_BODY = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 60}}]}).encode()
_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


def _trickle(conn: socket.socket, stop: threading.Event) -> None:
    with conn:
        try:
            _read_request(conn)
            for i in range(len(_ANSWER)):
                if stop.wait(BYTE_GAP_S):
                    return
                conn.sendall(_ANSWER[i : i + 1])
        except OSError:
            return  # the client gave up and closed


@pytest.fixture
def trickler() -> Iterator[str]:
    """A raw-socket HTTP server on 127.0.0.1 that answers every request correctly, one byte every
    BYTE_GAP_S seconds; its base URL."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_trickle, args=(conn, stop), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join()
    srv.close()


def test_the_client_timeout_bounds_the_whole_call_against_a_trickling_server(trickler):
    with http.client(TIMEOUT_S) as c, pytest.raises(httpx.TimeoutException):
        c.post(trickler + "/v1/chat/completions", json={})
    with http.client(30.0) as c, pytest.raises(httpx.TimeoutException):  # a call's own timeout, the same
        c.post(trickler + "/v1/chat/completions", json={}, timeout=TIMEOUT_S)


def test_a_judge_call_to_a_trickling_server_is_an_infra_error_within_its_timeout(trickler):
    """The judge's path (OpenAIEngine.chat, byo/models.py): a GenerationError after its retries,
    never an answer the server took ten times the timeout to give."""
    engine = OpenAIEngine(trickler + "/v1", "judge", None, timeout_s=TIMEOUT_S, retries=0)
    try:
        with pytest.raises(GenerationError, match="Timeout"):
            engine.chat([Message("user", "grade this")])
    finally:
        engine.close()


def test_a_server_that_answers_in_time_is_unchanged():
    """The deadline clips socket operations; an answer within it arrives whole (a real local server)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            _read_request(conn)
            conn.sendall(_ANSWER)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    with http.client(5.0) as c:
        got = c.post(f"http://127.0.0.1:{srv.getsockname()[1]}/x", json={})
    thread.join()
    srv.close()
    assert got.status_code == 200 and got.json()["choices"][0]["message"]["content"] == "x" * 60
