"""The training monitor: per-domain signals each step, alarms with actions, probes, audits.

Invariant: every alarm that fires is written three times, as a trace event,
a metrics row of kind "alarm" and a log line, and fires once per episode
(it re-arms only after its condition has cleared). Its action is applied
before the next step draws tasks: log does nothing more, lower_weight scales
the domain's sampling weight, stop sets `stop_reason` (the loop ends the
run after the current step). A domain whose live verifier accepts a
declared cheat is never trained on again (probe action exclude), or the run
refuses to start / stops (probe action stop). Weight changes are part of
`state_dict`, so a resumed run draws the same tasks as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from posttrain.errors import VerifierError
from posttrain.monitor.alarms import EVAL_DETECTORS, STEP_DETECTORS, Detector, History, Hit
from posttrain.monitor.loggers import build_loggers, flatten
from posttrain.monitor.probes import audit_of, probe_domain
from posttrain.monitor.signals import DomainSignals, Link, step_signals


class Monitor:
    """Watches one run. Construct it after the pool, engine and trainer exist."""

    def __init__(
        self,
        cfg: Any,
        run_dir: Path,
        trace: Any,
        metrics: Any,
        pool: Any,
        engine: Any = None,
        trainer: Any = None,
        model_dir: str | Path | None = None,
        log: Callable[[str], Any] = print,
        state: Mapping[str, Any] | None = None,
        start_step: int = 0,
    ) -> None:
        self.cfg = cfg.monitor
        self.temperature = cfg.rollout.temperature
        self._base_weights = {n: pool.weight(n) for n in pool.names}
        self.run_dir, self.trace, self.metrics, self.pool = Path(run_dir), trace, metrics, pool
        self.engine, self.trainer, self.model_dir, self.log = engine, trainer, model_dir, log
        self.history = History()
        self.weights: dict[str, float] = {}
        self.excluded: set[str] = set()
        self.active: set[tuple[str, str | None]] = set()
        self.stop_reason = ""
        self.fired: list[dict[str, Any]] = []
        self._reference: Any = None
        self.loggers = (
            build_loggers(self.cfg.loggers, self.run_dir, cfg.model_dump(mode="json")) if self.cfg.enabled else []
        )
        if state:
            self.load_state_dict(state)
        if start_step:
            self._reload(start_step)
        if self.cfg.enabled and self.cfg.probes.enabled:
            self.probe(start_step, at_start=True)

    # ------------------------------------------------------------ the hooks

    def after_step(
        self,
        step: int,
        groups: Sequence[Sequence[Any]],
        kept: Sequence[Sequence[Any]],
        ids: Mapping[int, str],
        links: Mapping[str, Link],
        stats: Any = None,
        train_row: Mapping[str, Any] | None = None,
    ) -> None:
        """Signals, audits, KL and step alarms of one finished step; periodic probes. `ids`: each
        rollout's trace id by id(rollout); `links`: what the train step did with each, by that id."""
        if not self.cfg.enabled:
            return
        started = time.perf_counter()
        by_obj = {id(r): links[ids[id(r)]] for g in groups for r in g if ids.get(id(r)) in links}
        signals = step_signals(groups, kept, by_obj, self.cfg.diversity.n, self.cfg.diversity.max_chars)
        for domain, s in signals.items():
            self.history.signals.setdefault(domain, []).append((step, s))
        kl = self._kl(step, groups, stats)
        audits = self._audit(step, groups)
        self._check(step, STEP_DETECTORS)
        if self.cfg.probes.enabled and self.cfg.probes.every_steps and step % self.cfg.probes.every_steps == 0:
            self.probe(step)
        row = {
            "domains": {d: asdict(s) for d, s in signals.items()},
            "kl": kl,
            "audit": audits,
            "weights": self.pool.target_shares(),
            "monitor_s": time.perf_counter() - started,
        }
        self.metrics.write("monitor", step, **row)
        self._mirror(step, {"train": dict(train_row or {}), **row})

    def after_eval(self, step: int, table: Any) -> None:
        """Record a held-out evaluation of the loop's evaluator; eval alarms. The alarms trust the
        eval verifier's accuracy (the domain's stricter checks included, see evaluate.strict);
        the training verifier's accuracy on the same items is recorded beside it."""
        if not self.cfg.enabled:
            return
        results = table.results.values()
        accs = {r.domain: r.train_accuracy for r in results if getattr(r, "train_accuracy", None) is not None}
        trusted = {r.domain: r.accuracy for r in results if r.accuracy is not None}
        strict = {
            r.domain: r.accuracy for r in results if r.accuracy is not None and "+" in getattr(r, "eval_verifier", "")
        }
        self.history.evals.append((step, trusted))
        counts = dict(table.counts)
        self.history.eval_counts.append(counts)
        self.metrics.write("heldout", step, domains=accs or trusted, strict=strict, trusted=trusted, counts=counts)
        self._mirror(step, {"heldout": trusted})
        self._check(step, EVAL_DETECTORS)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []

    # ------------------------------------------------------------ alarms and actions

    def _check(self, step: int, detectors: Sequence[Detector]) -> None:
        kinds = {d.kind for d in detectors if getattr(self.cfg.alarms, d.kind).enabled}
        hits = [hit for d in detectors if d.kind in kinds for hit in d.check(self.history, self.cfg.alarms)]
        hits = [h for h in hits if h.domain not in self.excluded]
        now = {(h.kind, h.domain) for h in hits}
        self.active = {key for key in self.active if key[0] not in kinds or key in now}
        for hit in hits:
            if (hit.kind, hit.domain) not in self.active:
                self.active.add((hit.kind, hit.domain))
                self._fire(step, hit, getattr(self.cfg.alarms, hit.kind).action)

    def _fire(self, step: int, hit: Hit, action: str) -> None:
        done = self._act(action, hit)
        data = {"alarm": hit.kind, "action": action, "done": done, **hit.data}
        self.trace.add_event("alarm", hit.message, step=step, domain=hit.domain, data=data)
        self.metrics.write(
            "alarm",
            step,
            alarm=hit.kind,
            domain=hit.domain,
            message=hit.message,
            action=action,
            done=done,
            data=dict(hit.data),
        )
        self.fired.append(
            {"step": step, "alarm": hit.kind, "domain": hit.domain, "message": hit.message, "action": action}
        )
        self.log(f"ALARM step {step}: {hit.message} [{done}]")

    def _act(self, action: str, hit: Hit) -> str:
        if action == "stop":
            self.stop_reason = self.stop_reason or hit.message
            return "stopping the run"
        if action == "lower_weight" and hit.domain is not None and hit.domain in self.pool.names:
            factor = self.cfg.alarms.weight_factor
            self._scale_weight(hit.domain, factor)
            return f"weight of {hit.domain} x{factor:g} (now x{self.weights[hit.domain]:.3g})"
        return "logged"

    def _exclude(self, domain: str) -> None:
        """Take `domain` out of the pool's drawable domains (its state is kept, so resume still fits)."""
        self.excluded.add(domain)
        self.pool.names = tuple(n for n in self.pool.names if n != domain)

    def _scale_weight(self, domain: str, factor: float) -> None:
        self.weights[domain] = self.weights.get(domain, 1.0) * factor
        self._apply_weight(domain, self.weights[domain])

    def _apply_weight(self, domain: str, multiplier: float) -> None:
        """Set the pool's weight of `domain` to its configured weight x multiplier."""
        self.pool.set_weight(domain, self._base_weights[domain] * multiplier)

    # ------------------------------------------------------------ probes

    def probe(self, step: int, at_start: bool = False) -> None:
        """Score every live domain's declared cheats; refuse the domains whose verifier accepts one."""
        from posttrain.domains.registry import get

        for name in [n for n in self.pool.names if n not in self.excluded]:
            result = probe_domain(get(name), self.pool.eval_difficulty(name), self.cfg.probes.tasks)
            if result is None:
                if at_start:
                    self.metrics.write("probe", step, domain=name, declared=False, ok=None, cheats=0, accepted=0)
                continue
            data = {
                "verifier": result.verifier,
                "cheats": result.cheats,
                "accepted": len(result.accepted),
                "infra_errors": result.infra_errors,
                "examples": [asdict(a) for a in result.accepted[:3]],
            }
            self.metrics.write("probe", step, domain=name, declared=True, ok=result.ok, **data)
            self.trace.add_event("probe", result.message(), step=step, domain=name, data=data)
            if not result.ok:
                self._refuse(step, name, result.message(), data, at_start)

    def _refuse(self, step: int, domain: str, message: str, data: dict[str, Any], at_start: bool) -> None:
        action = self.cfg.probes.action
        if action == "exclude":
            self._exclude(domain)
        left = [n for n in self.pool.names if n not in self.excluded]
        stop = action == "stop" or not left
        done = "refused to train on it" + ("; no domain left" if not left else "")
        self.trace.add_event(
            "alarm",
            message,
            step=step,
            domain=domain,
            data={"alarm": "probe_failure", "action": action, "done": done, **data},
        )
        self.metrics.write(
            "alarm", step, alarm="probe_failure", domain=domain, message=message, action=action, done=done, data=data
        )
        self.fired.append(
            {"step": step, "alarm": "probe_failure", "domain": domain, "message": message, "action": action}
        )
        self.log(f"ALARM step {step}: {message} [{done}]")
        if stop and at_start:
            raise VerifierError(
                message
                + (" (no domain left to train on)" if not left else "")
                + "; set monitor.probes.enabled=false to train anyway"
            )
        if stop:
            self.stop_reason = self.stop_reason or message

    # ------------------------------------------------------------ audits of top-reward rollouts

    def _audit(self, step: int, groups: Sequence[Sequence[Any]]) -> dict[str, dict[str, int]]:
        if not self.cfg.audit.enabled:
            return {}
        from posttrain.domains.registry import get

        by_domain: dict[str, list[Any]] = {}
        for g in groups:
            for r in g:
                if r.reward is not None and r.reward > 0:
                    by_domain.setdefault(r.task.domain, []).append(r)
        out = {}
        for name, rollouts in sorted(by_domain.items()):
            fn = audit_of(get(name))
            if fn is None:
                continue
            top = sorted(rollouts, key=lambda r: -r.reward)[: self.cfg.audit.per_step]
            failed, errors, examples = 0, 0, []
            for r in top:
                try:
                    ok = fn(r.task, r.completion.text)
                except Exception:  # an audit that cannot decide is an infra error, not a failure
                    errors += 1
                    continue
                if not ok:
                    failed += 1
                    examples.append(r.completion.text[:80])
            audited = len(top) - errors
            self.history.audits.setdefault(name, []).append((step, audited, failed))
            out[name] = {"audited": audited, "failed": failed, "errors": errors, "examples": examples[:3]}
        return out

    # ------------------------------------------------------------ KL to the initial model

    def _kl(self, step: int, groups: Sequence[Sequence[Any]], stats: Any) -> dict[str, float]:
        if stats is not None and getattr(self.trainer, "ref_model", None) is not None and stats.n_tokens:
            self.history.kl.setdefault("all", []).append((step, float(stats.kl)))
        every = self.cfg.kl.every_steps
        if not every or step % every or self.model_dir is None and getattr(self.trainer, "ref_model", None) is None:
            return {}
        from posttrain.monitor.kl import kl_to_reference

        per_domain = kl_to_reference(self.reference(), groups, self.temperature, self.cfg.kl.rows)
        for domain, value in per_domain.items():
            self.history.kl.setdefault(domain, []).append((step, value))
        return per_domain

    def reference(self) -> Any:
        """The frozen initial model: the trainer's reference when it has one, else loaded once."""
        if self._reference is None:
            ref = getattr(self.trainer, "ref_model", None)
            if ref is None:
                from posttrain.model.arch import load_model

                device = next(self.trainer.model.parameters()).device if self.trainer is not None else "cpu"
                ref = load_model(self.model_dir, device=str(device))[0]
            self._reference = ref
        return self._reference

    # ------------------------------------------------------------ loggers, state and resume

    def _mirror(self, step: int, values: Mapping[str, Any]) -> None:
        if self.loggers:
            scalars = flatten("", values, {})
            for logger in self.loggers:
                logger.log(step, scalars)

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": dict(self.weights),
            "excluded": sorted(self.excluded),
            "active": [list(k) for k in sorted(self.active, key=str)],
            "stop_reason": self.stop_reason,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for domain in state.get("excluded", ()):
            if domain in self.pool.names:
                self._exclude(domain)
        self.active = {(k, d) for k, d in state.get("active", ())}
        # stop_reason is not restored: resuming a stopped run means continuing it
        for domain, multiplier in state.get("weights", {}).items():
            if domain in self.pool.names:
                self.weights[domain] = float(multiplier)
                self._apply_weight(domain, float(multiplier))

    def _reload(self, upto: int) -> None:
        """Rebuild the history from metrics.jsonl rows up to `upto` (the resumed step)."""
        from posttrain.rundir import read_metrics

        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for row in read_metrics(self.run_dir / "metrics.jsonl"):
            if row["kind"] in ("monitor", "heldout") and row["step"] <= upto:
                rows[(row["kind"], row["step"])] = row  # a rerun step: the last row wins
        for (kind, step), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if kind == "heldout":
                self.history.evals.append((step, dict(row["trusted"])))
                self.history.eval_counts.append(dict(row.get("counts", {})))
                continue
            for domain, values in row["domains"].items():
                self.history.signals.setdefault(domain, []).append((step, DomainSignals(**values)))
            for domain, value in row.get("kl", {}).items():
                self.history.kl.setdefault(domain, []).append((step, value))
            for domain, a in row.get("audit", {}).items():
                self.history.audits.setdefault(domain, []).append((step, a["audited"], a["failed"]))
