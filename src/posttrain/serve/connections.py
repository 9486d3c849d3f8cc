"""Bounds on the connections a client may hold open, under the HTTP parser.

Invariant: the server holds at most `max_connections` connections, and one client address at
most `max_connections_per_client`; a connection that would pass either bound is let in by
closing the oldest *stalled* connection (of that client for its own bound, of the client with
the most connections for the total): one that is not serving an admitted request (its headers
or body still arriving, or idle between requests). A connection serving an admitted request is
never closed for this; when none is stalled the new connection is closed at once. A request's
headers must all arrive within `header_timeout_s` of its first byte (of the connection's opening
for the first request), or the connection is closed. So clients that hold half-sent headers or
trickle bodies cannot exhaust the file descriptors, and /health and a normal request always get
a connection. What is blamed on whom: the client that stalls loses its own stalled connection
(logged, counted as `posttrain_connections_closed_total{reason}`); the server never refuses a
new connection while a stalled one can go.

`guarded_protocol(limits, counter)` is uvicorn's h11 protocol with these bounds, passed as
`uvicorn.run(..., http=...)` (commands/serve.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from posttrain.configs.serve import LimitsConfig
from posttrain.serve.limits import ADMITTED

log = logging.getLogger("posttrain.serve")


class ConnectionGuard:
    """The open connections, by client address, in the order they opened."""

    def __init__(self, limits: LimitsConfig, closed: Any = None) -> None:
        self.limits = limits
        self.by_client: dict[str, list[GuardedH11Protocol]] = {}
        self.total = 0
        self.closed = closed
        """A metrics Counter of closed connections, by reason (None: not counted)."""

    def opened(self, conn: GuardedH11Protocol) -> bool:
        """Register `conn`, making room by closing stalled connections; False: no room (close it)."""
        mine = self.by_client.setdefault(conn.client_key, [])
        if len(mine) >= self.limits.max_connections_per_client and not self._evict(mine, "per_client"):
            self._count("per_client_full")
            return False
        if self.total >= self.limits.max_connections:
            crowded = sorted(self.by_client.values(), key=len, reverse=True)
            if not any(self._evict(c, "total") for c in crowded):
                self._count("total_full")
                return False
        mine.append(conn)
        self.total += 1
        return True

    def lost(self, conn: GuardedH11Protocol) -> None:
        mine = self.by_client.get(conn.client_key, [])
        if conn in mine:
            mine.remove(conn)
            self.total -= 1
        if not mine:
            self.by_client.pop(conn.client_key, None)

    def _evict(self, conns: list[GuardedH11Protocol], reason: str) -> bool:
        """Close the oldest stalled connection of `conns`; False when none is stalled."""
        for conn in conns:
            if conn.stalled():
                conns.remove(conn)
                self.total -= 1
                conn.drop(f"evicted_{reason}")
                return True
        return False

    def _count(self, reason: str) -> None:
        if self.closed is not None:
            self.closed.inc(reason=reason)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with the guard's connection bounds and a header deadline."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.client_key = self.client[0] if self.client else "?"
        self._header_timer: asyncio.TimerHandle | None = None
        self._registered = self.guard.opened(self)
        if not self._registered:
            log.warning("connection from %s closed: its connections are at the bound", self.client_key)
            self.transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if getattr(self, "_registered", False):
            self._registered = False
            self.guard.lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of a new request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the request line and headers are in

    def stalled(self) -> bool:
        """Not serving an admitted request: headers or body still arriving, or idle."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        return not cycle.scope.get(ADMITTED, False)

    def drop(self, reason: str) -> None:
        """Close this connection (a stalled one making room, or one past its header deadline)."""
        self._registered = False
        self._disarm()
        self.guard._count(reason)
        log.warning("connection from %s closed: %s", self.client_key, reason)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.guard.limits.header_timeout_s, self._header_late)

    def _disarm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        self._header_timer = None

    def _header_late(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._registered:
                self.guard.lost(self)
            self.drop("header_timeout")


def guarded_protocol(limits: LimitsConfig, closed: Any = None) -> type[GuardedH11Protocol]:
    """A protocol class for uvicorn with one guard over all its connections. `max_connections` is
    lowered to what the process's file-descriptor limit leaves after a reserve of 64 (the model's
    files, logs, the trace), so the bound holds before the kernel's does."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft - 64 < limits.max_connections:
        limits = limits.model_copy(update={"max_connections": max(8, soft - 64)})
    return type("GuardedH11", (GuardedH11Protocol,), {"guard": ConnectionGuard(limits, closed)})
