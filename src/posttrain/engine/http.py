"""HTTP clients whose timeout bounds the whole call: every engine, judge and reward-model request.

Invariant: a request sent through a `client()` with timeout T (the client's, or the call's own
`timeout=`) returns or raises within T seconds of its start, whatever the server does. httpx's
timeouts bound each socket operation (the connect, each read, each write), so a server that
trickles its answer a byte at a time within the read timeout holds an httpx call as long as it
likes (measured before this module: a 2 s timeout held for over 45 s). Here every socket
operation's timeout is clipped to what is left of the call's deadline (its start + the largest
of its connect, read, write and pool timeouts), the response body's reads included, and an
operation that would start past the deadline raises httpx.ReadTimeout (a ServerUnavailable at
`openai.post_json`, retried, then an infra error). A client that reaches its server through an
environment proxy (`HTTP_PROXY`) is not bounded this way: `client()` ignores those variables
(`trust_env=False`); engines, judges and reward models are named by URL in the config.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("posttrain_http_deadline", default=math.inf)
"""time.monotonic() by which the call running in this context must end (inf: none)."""


def client(timeout_s: float, max_connections: int = 16, uds: str | None = None, **kw: Any) -> httpx.Client:
    """An httpx.Client whose every call ends within its timeout (`timeout_s` unless the call gives
    its own); `uds`: reach the server over that Unix domain socket instead of TCP."""
    transport = DeadlineTransport(limits=httpx.Limits(max_connections=max_connections), uds=uds)
    return httpx.Client(timeout=timeout_s, transport=transport, trust_env=False, **kw)


def _clip(timeout: float | None) -> float:
    """`timeout` cut to what is left of this context's deadline; httpx.ReadTimeout when none is left."""
    left = _DEADLINE.get() - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the call's total deadline passed")
    return left if timeout is None else min(timeout, left)


@contextlib.contextmanager
def _until(deadline: float) -> Iterator[None]:
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


class _Stream(httpcore.NetworkStream):
    """A socket stream whose every operation's timeout is `_clip`ped."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clip(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clip(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _clip(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's sync backend with `_Stream` sockets."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, _clip(timeout), local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _clip(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    """A response body whose reads keep the call's deadline."""

    def __init__(self, inner: httpx.SyncByteStream, deadline: float) -> None:
        self._inner, self._deadline = inner, deadline

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        while True:
            with _until(self._deadline):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        self._inner.close()


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport (no proxy) over `_Backend`: each request's socket operations share one deadline."""

    def __init__(self, limits: httpx.Limits, uds: str | None = None) -> None:
        super().__init__(limits=limits, uds=uds, trust_env=False)
        self._pool = httpcore.ConnectionPool(  # the pool super() made, with the clipping backend
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            uds=uds,
            network_backend=_Backend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        limits = [float(t) for t in (request.extensions.get("timeout") or {}).values() if t is not None]
        deadline = time.monotonic() + max(limits) if limits else math.inf
        with _until(deadline):
            response = super().handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _Body(response.stream, deadline)
        return response
