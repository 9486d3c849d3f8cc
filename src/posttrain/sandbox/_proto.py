"""Framing between the pool and its fork-server workers, and inside a task.

Invariant: one frame = 4-byte big-endian length + pickle of plain data
(dicts, lists, bytes, str, numbers). Both ends are trusted posttrain code;
sandboxed code never holds a descriptor of these channels. Stdlib only.
"""

from __future__ import annotations

import os
import pickle
import struct

MAX_FRAME = 1 << 30


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
