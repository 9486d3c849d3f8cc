"""The canary controller: follows the registry and rolls a regressing canary back.

Invariant: a canary is rolled back only after `bad_checks_to_rollback`
consecutive checks each found a regression (error rate, latency per token,
or held-out probe accuracy against the stable version), and the rollback is
written to the registry before traffic moves, so a restarted server does
not resurrect it. Rolling back changes routing only: requests already on
the canary finish there (or fail over to stable).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.configs.serve import CanaryConfig
from posttrain.serve.registry import ModelRegistry, VersionInfo
from posttrain.serve.router import Router, Window
from posttrain.serve.tiers import Deployment

log = logging.getLogger("posttrain.serve")


@dataclass(frozen=True)
class CheckResult:
    """One canary check: the regressions found and what was done."""

    canary: str | None
    reasons: tuple[str, ...] = ()
    bad_streak: int = 0
    action: str = "none"


def regressions(canary: Window, stable: Window, cfg: CanaryConfig) -> list[str]:
    """Why the canary's window is worse than stable's (empty: it is not)."""
    out = []
    if canary.requests >= cfg.min_requests:
        if canary.error_rate > stable.error_rate + cfg.max_error_rate_delta:
            out.append(f"error rate {canary.error_rate:.2f} vs stable {stable.error_rate:.2f}")
        c, s = canary.mean_seconds_per_token, stable.mean_seconds_per_token
        if c and s and c > s * cfg.max_latency_ratio:
            out.append(f"latency {c * 1000:.1f} ms/token vs stable {s * 1000:.1f}")
    return out


def probe_accuracy(dep: Deployment, cfg: CanaryConfig) -> float:
    """Greedy held-out accuracy of a deployment's standard engine on the probe slice (blocking)."""
    from posttrain.evaluate import evaluate

    with dep.locks["standard"]:
        table = evaluate(dep.engines["standard"], {d: 1 for d in cfg.probe_domains}, cfg.probe_tasks)
    return table.mean_accuracy


class CanaryController:
    """Periodic checks; `load` builds a Deployment for a registry version."""

    def __init__(
        self,
        router: Router,
        cfg: CanaryConfig,
        registry: ModelRegistry | None,
        load: Callable[[VersionInfo], Deployment],
    ) -> None:
        self.router, self.cfg, self.registry, self.load = router, cfg, registry, load
        self.bad_streak = 0
        self._seen_state: Any = None
        self.history: list[CheckResult] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.cfg.check_interval_s)
            except TimeoutError:
                try:
                    await self.check()
                except Exception:  # noqa: BLE001 - a failed check must not stop serving
                    log.exception("canary check failed")

    async def sync(self) -> None:
        """Load versions the registry names and route as it says."""
        if self.registry is None:
            return
        st = self.registry.state()
        if (st.stable, st.canary, st.canary_share) == self._seen_state:
            return
        if st.stable and st.stable not in self.router.deployments:
            self.router.add(await asyncio.to_thread(self.load, self.registry.version(st.stable)))
        if st.canary and st.canary not in self.router.deployments:
            try:
                self.router.add(await asyncio.to_thread(self.load, self.registry.version(st.canary)))
            except Exception as exc:  # noqa: BLE001 - a canary that cannot load is rolled back, not served
                self.registry.rollback(f"automatic: canary failed to load: {type(exc).__name__}: {exc}")
                self.router.metrics.rollbacks.inc(version=st.canary, reason="automatic")
                self._seen_state = None
                return await self.sync()
        if st.canary != self.router.canary:
            self.bad_streak = 0
        self.router.set_routes(st.stable, st.canary, st.canary_share)
        self.router.retire_unused()
        self._seen_state = (st.stable, st.canary, st.canary_share)

    async def check(self) -> CheckResult:
        await self.sync()
        windows = self.router.take_windows()
        canary, stable = self.router.canary, self.router.stable
        if canary is None or stable is None:
            return self._done(CheckResult(None))
        reasons = regressions(windows.get(canary, Window()), windows.get(stable, Window()), self.cfg)
        reasons += await self._probe(canary, stable)
        self.bad_streak = self.bad_streak + 1 if reasons else 0
        if self.bad_streak >= self.cfg.bad_checks_to_rollback:
            await self.rollback(f"automatic: {'; '.join(reasons)}")
            return self._done(CheckResult(canary, tuple(reasons), self.bad_streak, "rollback"))
        return self._done(CheckResult(canary, tuple(reasons), self.bad_streak))

    async def rollback(self, reason: str) -> None:
        canary = self.router.canary
        if canary is None:
            return
        if self.registry is not None:
            self.registry.rollback(reason)
            self._seen_state = None
        self.router.set_routes(self.router.stable, None, 0.0)
        self.router.metrics.rollbacks.inc(version=canary, reason=reason.split(":")[0])
        self.bad_streak = 0
        log.warning("rolled back canary %s: %s", canary, reason)

    async def _probe(self, canary: str, stable: str) -> list[str]:
        if not self.cfg.probe_domains or not self.cfg.probe_tasks:
            return []
        deps = self.router.deployments
        try:
            c_acc = await asyncio.to_thread(probe_accuracy, deps[canary], self.cfg)
        except Exception as exc:  # noqa: BLE001 - a canary that cannot even be probed has regressed
            return [f"quality probe failed: {type(exc).__name__}: {exc}"]
        s_acc = await asyncio.to_thread(probe_accuracy, deps[stable], self.cfg)
        if c_acc < s_acc - self.cfg.max_quality_drop:
            return [f"probe accuracy {c_acc:.3f} vs stable {s_acc:.3f}"]
        return []

    def _done(self, res: CheckResult) -> CheckResult:
        self.history.append(res)
        del self.history[:-100]
        return res
