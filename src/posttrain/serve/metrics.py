"""Prometheus counters, gauges and histograms, rendered as text exposition format.

Invariant: every series is keyed by its sorted label pairs; counters only go
up; a histogram's buckets are cumulative and its `_count` equals the `+Inf`
bucket. Thread-safe: engines report from worker threads.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Iterable

Labels = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(kw: dict[str, object]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in kw.items()))


def _fmt(labels: Labels, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = list(labels) + list(extra)
    if not pairs:
        return ""
    body = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in pairs)
    return "{" + body + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__(name, help_text)
        self.values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name}: amount must be >= 0, got {amount}")
        key = _labels(labels)
        with self._lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: object) -> float:
        return self.values.get(_labels(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            return self.header() + [f"{self.name}{_fmt(k)} {v:g}" for k, v in sorted(self.values.items())]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: object) -> None:
        with self._lock:
            self.values[_labels(labels)] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        super().__init__(name, help_text)
        self.buckets = tuple(sorted(buckets))
        self.series: dict[Labels, list[float]] = {}  # per-bucket counts, then sum, then count

    def observe(self, value: float, **labels: object) -> None:
        key = _labels(labels)
        with self._lock:
            row = self.series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            idx = bisect.bisect_left(self.buckets, value)
            if idx < len(self.buckets):
                row[idx] += 1
            row[-2] += value
            row[-1] += 1

    def render(self) -> list[str]:
        lines = self.header()
        with self._lock:
            for key, row in sorted(self.series.items()):
                cum = 0.0
                for bound, n in zip(self.buckets, row):
                    cum += n
                    lines.append(f"{self.name}_bucket{_fmt(key, [('le', f'{bound:g}')])} {cum:g}")
                lines.append(f"{self.name}_bucket{_fmt(key, [('le', '+Inf')])} {row[-1]:g}")
                lines.append(f"{self.name}_sum{_fmt(key)} {row[-2]:g}")
                lines.append(f"{self.name}_count{_fmt(key)} {row[-1]:g}")
        return lines


class RateWindow:
    """Events per second over the last `window_s` seconds (e.g. tokens/s)."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def add(self, amount: float, now: float | None = None) -> None:
        with self._lock:
            self._events.append((now if now is not None else time.monotonic(), amount))

    def rate(self, now: float | None = None) -> float:
        now = now if now is not None else time.monotonic()
        with self._lock:
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()
            return sum(a for _, a in self._events) / self.window_s


class ServeMetrics:
    """Every metric the server exports, labelled by tier and version."""

    def __init__(self) -> None:
        self.requests = Counter(
            "posttrain_requests_total", "Requests served, by endpoint, tier, version and HTTP status."
        )
        self.errors = Counter(
            "posttrain_errors_total", "Failed requests or engine calls, by tier, version and error kind."
        )
        self.failovers = Counter(
            "posttrain_failovers_total", "Canary requests that failed and were served by the stable version."
        )
        self.overflows = Counter(
            "posttrain_fast_overflows_total",
            "Fast-tier requests served by the standard tier because the fast queue was full.",
        )
        self.latency = Histogram("posttrain_request_latency_seconds", "Request latency, by tier and version.")
        self.ttft = Histogram(
            "posttrain_time_to_first_token_seconds", "Time to the first generated token, by tier and version."
        )
        self.tokens = Counter("posttrain_output_tokens_total", "Generated tokens, by tier and version.")
        self.tokens_per_s = Gauge(
            "posttrain_output_tokens_per_second", "Generated tokens per second over the last 30 s."
        )
        self.batch_size = Histogram(
            "posttrain_batch_size", "Requests per engine call, by tier.", (1, 2, 4, 8, 16, 32, 64, 128)
        )
        self.acceptance = Gauge("posttrain_draft_acceptance", "Accepted share of draft tokens, by version and drafter.")
        self.canary_share = Gauge("posttrain_canary_share", "Share of traffic routed to the canary version.")
        self.rollbacks = Counter("posttrain_rollbacks_total", "Canary rollbacks, by version and reason.")
        self.refused = Counter(
            "posttrain_refused_requests_total",
            "Requests refused before any generation (limits, busy, admin credential), by endpoint, status and code.",
        )
        self.connections_closed = Counter(
            "posttrain_connections_closed_total",
            "Connections the server closed for its connection bounds (serve/connections.py), by reason.",
        )
        self.windows: dict[tuple[str, str], RateWindow] = {}

    def add_tokens(self, n: int, tier: str, version: str) -> None:
        self.tokens.inc(n, tier=tier, version=version)
        self.windows.setdefault((tier, version), RateWindow()).add(n)

    def render(self) -> str:
        for (tier, version), win in list(self.windows.items()):
            self.tokens_per_s.set(win.rate(), tier=tier, version=version)
        metrics = [
            self.requests,
            self.errors,
            self.failovers,
            self.overflows,
            self.latency,
            self.ttft,
            self.tokens,
            self.tokens_per_s,
            self.batch_size,
            self.acceptance,
            self.canary_share,
            self.rollbacks,
            self.refused,
            self.connections_closed,
        ]
        return "\n".join(line for m in metrics for line in m.render()) + "\n"
