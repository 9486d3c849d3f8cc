"""The router: a request's model name and service tier to a deployment's batcher.

Invariant: routed traffic goes to the canary with probability `share` and to
the stable version otherwise; a canary request that fails before any token
reached the client is served again by the stable version (a failover), so a
broken canary costs latency, never a failed request. Every outcome is
counted in the version's window, which the canary controller reads and resets.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.errors import ConfigError
from posttrain.serve.metrics import ServeMetrics
from posttrain.serve.protocol import TIER_ALIASES, ApiError, Served, Tier
from posttrain.serve.tiers import Deployment, TokenSink, check_request
from posttrain.types import Completion, GenerationRequest

Render = Callable[[Callable[[Deployment], GenerationRequest], Deployment], Awaitable[GenerationRequest]]
"""Runs a request's renderer (its tokenizing) for a deployment, e.g. in a worker thread."""

_NAME = re.compile(r"^(?P<base>[^@:]+)(?:@(?P<version>[^:]+))?(?::(?P<tier>[a-z]+))?$")


@dataclass
class Window:
    """Outcomes of one version since the last canary check."""

    requests: int = 0
    errors: int = 0
    seconds_per_token: float = 0.0
    timed: int = 0

    def add(self, ok: bool, seconds: float, tokens: int) -> None:
        self.requests += 1
        self.errors += 0 if ok else 1
        if ok and tokens:
            self.seconds_per_token += seconds / tokens
            self.timed += 1

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def mean_seconds_per_token(self) -> float:
        return self.seconds_per_token / self.timed if self.timed else 0.0


class Router:
    """Holds the deployments and sends each request to one of them."""

    def __init__(
        self,
        metrics: ServeMetrics,
        served_name: str,
        seed: int | None = None,
        overflow_queue: int = 0,
        render: Render | None = None,
    ) -> None:
        self.metrics, self.served_name, self.overflow_queue = metrics, served_name, overflow_queue
        self.render: Render = render or _render_inline
        self.deployments: dict[str, Deployment] = {}
        self.stable: str | None = None
        self.canary: str | None = None
        self.share = 0.0
        self.windows: dict[str, Window] = {}
        self.inflight: dict[str, int] = {}
        self.rng = random.Random(seed)
        self.spawn: Callable[[Coroutine[Any, Any, Any]], Any] | None = None
        self.stops: dict[str, asyncio.Event] = {}

    # -- deployments ------------------------------------------------------
    def add(self, dep: Deployment) -> None:
        """Register a deployment and start its batchers (needs `spawn`)."""
        if self.spawn is None:
            raise RuntimeError("Router.add before the server started (no task group)")
        stop = asyncio.Event()
        self.deployments[dep.name], self.stops[dep.name] = dep, stop
        self.windows.setdefault(dep.name, Window())
        self.inflight.setdefault(dep.name, 0)
        for b in dep.batchers.values():
            self.spawn(b.run(stop))

    def retire_unused(self) -> list[str]:
        """Stop deployments that are neither stable nor canary and have nothing in flight."""
        gone = [n for n in self.deployments if n not in (self.stable, self.canary) and not self.inflight.get(n)]
        for n in gone:
            self.stops.pop(n).set()
            del self.deployments[n]
        return gone

    def set_routes(self, stable: str | None, canary: str | None, share: float) -> None:
        self.stable, self.canary, self.share = stable, canary, share if canary else 0.0
        self.metrics.canary_share.set(self.share)

    def take_windows(self) -> dict[str, Window]:
        out, self.windows = self.windows, {n: Window() for n in self.deployments}
        return out

    # -- routing ----------------------------------------------------------
    def resolve(self, model: str, service_tier: str | None) -> tuple[str | None, Tier]:
        """(explicit version or None, tier) from a model name and service_tier."""
        m = _NAME.match(model)
        if not m or m["base"] != self.served_name:
            raise ApiError(
                404,
                f"model {model!r} does not exist; this server serves {self.served_name!r} "
                f"(suffix ':fast' or ':standard', or '@vN' for a version)",
                param="model",
                code="model_not_found",
            )
        if m["version"] and m["version"] not in self.deployments:
            raise ApiError(
                404,
                f"version {m['version']!r} is not loaded; loaded: {', '.join(self.deployments)}",
                param="model",
                code="model_not_found",
            )
        if m["tier"] and m["tier"] not in ("fast", "standard"):
            raise ApiError(
                400, f"model suffix ':{m['tier']}' is not a tier (use ':fast' or ':standard')", param="model"
            )
        tier = m["tier"] or TIER_ALIASES.get(service_tier or "standard", "standard")
        return m["version"], tier  # type: ignore[return-value]

    def choose(self, explicit: str | None) -> Deployment:
        if explicit:
            return self.deployments[explicit]
        if self.stable is None or self.stable not in self.deployments:
            raise ApiError(503, "no model version is loaded", "server_error", code="unavailable")
        if self.canary in self.deployments and self.rng.random() < self.share:
            return self.deployments[self.canary]  # type: ignore[index]
        return self.deployments[self.stable]

    async def generate(
        self,
        build: Callable[[Deployment], GenerationRequest],
        tier: Tier,
        explicit: str | None,
        sink: TokenSink | None = None,
        where: list[Served] | None = None,
    ) -> tuple[list[Completion], Served]:
        """The completions of one request and who served them, failing over from the canary.
        `build` renders the request for a deployment's tokenizer; `where` receives who is serving
        before the first token is produced."""
        dep = self.choose(explicit)
        was_canary = dep.name == self.canary  # decided now: a rollback may clear self.canary mid-request
        sent = [False]

        def guarded(s: int, ids: Sequence[int]) -> None:
            sent[0] = True
            sink(s, ids)  # type: ignore[misc]

        try:
            return await self._on(dep, build, tier, guarded if sink else None, where)
        except (ConfigError, ApiError):
            raise
        except Exception:
            if explicit or not was_canary or sent[0] or self.stable not in self.deployments:
                raise
            self.metrics.failovers.inc(version=dep.name, tier=tier)
            return await self._on(self.deployments[self.stable], build, tier, sink, where)  # type: ignore[index]

    async def _on(
        self,
        dep: Deployment,
        build: Callable[[Deployment], GenerationRequest],
        tier: Tier,
        sink: TokenSink | None,
        where: list[Served] | None,
    ) -> tuple[list[Completion], Served]:
        req = await self.render(build, dep)
        if tier == "fast" and self.overflow_queue and dep.batchers["fast"].queue.qsize() >= self.overflow_queue:
            tier = "standard"  # the fast tier is backed up: the batched tier gives the same output sooner
            self.metrics.overflows.inc(version=dep.name)
        if where is not None:
            where[:] = [Served(dep.name, tier, dep.weights)]
        try:
            check_request(req, dep.vocab, dep.max_positions)
        except ConfigError as exc:
            raise ApiError(400, str(exc), param="prompt") from None
        t0 = time.monotonic()
        self.inflight[dep.name] = self.inflight.get(dep.name, 0) + 1
        ok, tokens = False, 0
        try:
            comps = await dep.batchers[tier].submit(req, sink)
            ok, tokens = True, sum(len(c.token_ids) for c in comps)
            return comps, Served(dep.name, tier, dep.weights)
        finally:
            self.inflight[dep.name] -= 1
            self.windows.setdefault(dep.name, Window()).add(ok, time.monotonic() - t0, tokens)


async def _render_inline(build: Callable[[Deployment], GenerationRequest], dep: Deployment) -> GenerationRequest:
    return build(dep)
