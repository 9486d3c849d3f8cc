"""Framing between the pool and its fork-server workers, and inside a task.

Invariant: one frame = 4-byte big-endian length + pickle of plain data
(dicts, lists, bytes, str, numbers). Both ends are trusted posttrain code;
sandboxed code never holds a descriptor of these channels. Stdlib only.

Two kinds of channel: the worker's control channel carries only small
frames (an op name, a session id, a snapshot number, at most
CONTROL_FRAME bytes), and a `fork` frame there carries, as SCM_RIGHTS, one
end of a fresh socket pair: the process the worker forks for it reads the
one request of a FORKED_OPS op from that socket and answers on it. So no
byte of a request (files, stdin, argv, env) or of a result ever enters the
worker itself.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct

MAX_FRAME = 1 << 30
CONTROL_FRAME = 1 << 16
FORKED_OPS = frozenset({"run", "session_open"})  # carry request bytes: served by a fresh forked process


def encode(obj) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack(">I", len(body)) + body


def write_frame(fd: int, obj) -> None:
    data = memoryview(encode(obj))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int):
    (length,) = struct.unpack(">I", _read_exact(fd, 4))
    if length > MAX_FRAME:
        raise EOFError(f"frame of {length} bytes is too large")
    return pickle.loads(_read_exact(fd, length))


def send_fork(sock: socket.socket, channel: socket.socket) -> None:
    """Ask the worker on `sock` to fork a process that serves `channel`'s peer end."""
    socket.send_fds(sock, [encode({"op": "fork"})], [channel.fileno()])


def read_control(sock: socket.socket) -> tuple[dict, list[int]]:
    """One control frame and the descriptors that came with it (a `fork`
    frame carries one). A frame above CONTROL_FRAME bytes is refused unread."""
    head, fds = b"", []
    while len(head) < 4:
        data, got, _, _ = socket.recv_fds(sock, 4 - len(head), 1)
        fds += got
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError("channel closed")
        head += data
    (length,) = struct.unpack(">I", head)
    if length > CONTROL_FRAME:
        for fd in fds:
            os.close(fd)
        raise EOFError(f"control frame of {length} bytes is too large")
    return pickle.loads(_read_exact(sock.fileno(), length)), fds


def split_frames(buf: bytes) -> list:
    """Decode every complete frame in `buf` (used on the status pipe)."""
    out, pos = [], 0
    while pos + 4 <= len(buf):
        (length,) = struct.unpack(">I", buf[pos : pos + 4])
        if pos + 4 + length > len(buf):
            break
        out.append(pickle.loads(buf[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    return out
