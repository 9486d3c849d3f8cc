"""The training monitor: per-domain signals each step, alarms, probes, audits; it observes, the loop acts.

Invariant: every alarm that fires is written three times, as a trace event,
a metrics row of kind "alarm" and a log line, and fires once per episode
(it re-arms only after its condition has cleared). The monitor never
changes the run: each hook returns the actions its alarms ask for
(monitor/actions.py: lower a weight, exclude a domain, stop, raise a
domain's entropy bonus or diversity reward within monitor.countermeasures'
bounds), and the loop applies them through the task pool's API (or the
run's countermeasures) before the next step draws tasks. A domain whose live verifier accepts a declared cheat is never
trained on again (probe action exclude), or the run refuses to start /
stops (probe action stop). The actions issued are part of `state_dict`, and
`start` returns them again on resume, so a resumed run draws the same
tasks as an uninterrupted one. Held-out figures come from the loop's own
evaluations (`after_eval`); the monitor generates nothing itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from posttrain.configs.monitor import MonitorConfig
from posttrain.errors import VerifierError, capture
from posttrain.monitor.actions import (
    Action,
    ExcludeDomain,
    LowerWeight,
    RaiseDiversityReward,
    RaiseEntropyBonus,
    Stop,
)
from posttrain.monitor.alarms import EVAL_DETECTORS, STEP_DETECTORS, Detector, History, Hit
from posttrain.monitor.loggers import build_loggers, flatten
from posttrain.monitor.probes import probe_domain
from posttrain.monitor.signals import DomainSignals, Link, step_signals

if TYPE_CHECKING:
    from torch import nn

    from posttrain.configs import Config
    from posttrain.evaluate import EvalTable
    from posttrain.metrics_log import MetricsLog
    from posttrain.monitor.judges import JudgeCheck
    from posttrain.rollout import Rollout
    from posttrain.trace import TraceStore

Log = Callable[[str], object]
Reference = Callable[[], "nn.Module"]
"""The frozen initial model, loaded on first call (the loop passes the trainer's
reference model when it has one, else a copy of the base loaded once)."""


class PoolView(Protocol):
    """What the monitor reads of the task pool (it never writes to it)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    def eval_difficulty(self, name: str) -> int: ...

    def target_shares(self) -> dict[str, float]: ...


class TrainerStats(Protocol):
    """What the monitor reads of a train step's statistics."""

    kl: float
    n_tokens: int


@dataclass(frozen=True)
class RunContext:
    """What the monitor needs to know of the run it watches."""

    run_dir: Path
    temperature: float
    """The rollout sampling temperature (KL is measured at it)."""
    trainer_kl: bool = False
    """The trainer's loss has a KL term: its per-step KL is recorded as the `all` series."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The whole run config as JSON data, for the W&B and TensorBoard mirrors."""

    @classmethod
    def of(cls, cfg: Config, run_dir: Path) -> RunContext:
        return cls(Path(run_dir), cfg.rollout.temperature, cfg.trainer.kl_coef > 0, cfg.model_dump(mode="json"))


class Monitor:
    """Watches one run. Construct it after the pool exists; call `start` before the first step."""

    def __init__(
        self,
        cfg: MonitorConfig,
        run: RunContext,
        trace: TraceStore,
        metrics: MetricsLog,
        pool: PoolView,
        reference: Reference | None = None,
        log: Log = print,
    ) -> None:
        self.cfg, self.run = cfg, run
        self.trace, self.metrics, self.pool, self.log = trace, metrics, pool, log
        self._reference_of = reference
        self.history = History()
        self.weights: dict[str, float] = {}
        """Per domain: the product of the lower_weight factors issued (1 when none)."""
        self.lowered: dict[str, list[float]] = {}
        """Per domain: the lower_weight factors issued, in order (replayed on resume)."""
        self.excluded: set[str] = set()
        self.raised: dict[str, dict[str, float]] = {}
        """Per domain: the entropy-bonus coefficient and diversity-reward weight raised to (by kind)."""
        self.active: set[tuple[str, str | None]] = set()
        self.fired: list[dict[str, Any]] = []
        self._actions: list[Action] = []
        self.loggers = build_loggers(cfg.loggers, run.run_dir, run.config) if cfg.enabled else []

    # ------------------------------------------------------------ the hooks

    def start(self, step: int = 0, state: Mapping[str, Any] | None = None) -> list[Action]:
        """Before the first step (`step`: the step a resumed run continues from, with its
        checkpoint's monitor `state`): the actions issued before the checkpoint, to be
        applied again, then the start probe's. Raises VerifierError when the probe leaves
        no domain to train on, or finds a hackable verifier with `probes.action: stop`."""
        if state:
            self.load_state_dict(state)
        if step:
            self._reload(step)
        if self.cfg.enabled and self.cfg.probes.enabled:
            self.probe(step, at_start=True, record=not step)  # a resumed run's start wrote its records already
        if self.cfg.enabled and not step:
            self.judge_checks(step)
        return self._take()

    def after_step(
        self,
        step: int,
        groups: Sequence[Sequence[Rollout]],
        kept: Sequence[Sequence[Rollout]],
        links: Mapping[str, Link],
        stats: TrainerStats | None = None,
        train_row: Mapping[str, Any] | None = None,
    ) -> list[Action]:
        """Signals, audits, KL and step alarms of one finished step; periodic probes. `links`: what
        the train step did with each rollout, by its id (`Rollout.id`). Returns the actions the
        alarms ask for."""
        if not self.cfg.enabled:
            return []
        started = time.perf_counter()
        signals = step_signals(groups, kept, links, self.cfg.diversity.n, self.cfg.diversity.max_chars)
        for domain, s in signals.items():
            self.history.signals.setdefault(domain, []).append((step, s))
        kl = self._kl(step, groups, stats)
        audits = self._audit(step, groups)
        shares = self.pool.target_shares()  # the shares this step drew with, before its actions
        self._check(step, STEP_DETECTORS)
        if self.cfg.probes.enabled and self.cfg.probes.every_steps and step % self.cfg.probes.every_steps == 0:
            self.probe(step)
        row = {
            "domains": {d: s.as_dict() for d, s in signals.items()},
            "kl": kl,
            "audit": audits,
            "weights": shares,
            "monitor_s": time.perf_counter() - started,
        }
        self.metrics.write("monitor", step, **row)
        self._mirror(step, {"train": dict(train_row or {}), **row})
        return self._take()

    def after_eval(self, step: int, table: EvalTable) -> list[Action]:
        """Record a held-out evaluation of the loop's evaluator; eval alarms. The alarms trust the
        eval verifier's accuracy (the domain's stricter checks included, see evaluate.strict);
        the training verifier's accuracy on the same items is recorded beside it. A domain whose
        items were all infra errors has no accuracy: it is left out, never counted as 0."""
        if not self.cfg.enabled:
            return []
        results = table.results.values()
        accs = {r.domain: r.train_accuracy for r in results if r.train_accuracy is not None}
        trusted = {r.domain: r.accuracy for r in results if r.accuracy is not None}
        strict = {r.domain: r.accuracy for r in results if r.accuracy is not None and "+" in r.eval_verifier}
        self.history.evals.append((step, trusted))
        counts = dict(table.counts)
        self.history.eval_counts.append(counts)
        self.metrics.write("heldout", step, domains=accs or trusted, strict=strict, trusted=trusted, counts=counts)
        self._mirror(step, {"heldout": trusted})
        self._check(step, EVAL_DETECTORS)
        return self._take()

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []

    def _take(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

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
        """Queue the action an alarm asks for; what applying it will do, in words."""
        if action == "stop":
            self._actions.append(Stop(hit.message))
            return "stopping the run"
        if action == "lower_weight" and hit.domain is not None and hit.domain in self._live():
            factor = self.cfg.alarms.weight_factor
            self._lower(hit.domain, factor)
            return f"weight of {hit.domain} x{factor:g} (now x{self.weights[hit.domain]:.3g})"
        if action in ("raise_entropy", "raise_diversity", "countermeasures") and hit.domain in self._live():
            kinds = ("entropy", "diversity") if action == "countermeasures" else (action.removeprefix("raise_"),)
            return "; ".join(self._countermeasure(hit.domain, kind) for kind in kinds)
        return "logged"

    def _countermeasure(self, domain: str, kind: str) -> str:
        """Raise the domain's `kind` (entropy or diversity) by its step, within its bound."""
        cm = self.cfg.countermeasures
        step, top = (cm.entropy_step, cm.entropy_max) if kind == "entropy" else (cm.diversity_step, cm.diversity_max)
        before = self.raised.get(domain, {}).get(kind, 0.0)
        value = min(top, before + step)
        label = "entropy bonus" if kind == "entropy" else "diversity reward"
        if value <= before:
            return f"{label} of {domain} already at its bound {top:g}"
        self._raise(domain, kind, value)
        return f"{label} of {domain} raised to {value:g}"

    def _raise(self, domain: str, kind: str, value: float) -> None:
        self.raised.setdefault(domain, {})[kind] = value
        action = RaiseEntropyBonus(domain, value) if kind == "entropy" else RaiseDiversityReward(domain, value)
        self._actions.append(action)

    def _live(self) -> list[str]:
        """The pool's drawable domains less those this monitor has asked to exclude."""
        return [n for n in self.pool.names if n not in self.excluded]

    def _lower(self, domain: str, factor: float) -> None:
        self.weights[domain] = self.weights.get(domain, 1.0) * factor
        self.lowered.setdefault(domain, []).append(factor)
        self._actions.append(LowerWeight(domain, factor))

    def _exclude(self, domain: str, reason: str) -> None:
        self.excluded.add(domain)
        self._actions.append(ExcludeDomain(domain, reason))

    # ------------------------------------------------------------ probes

    def probe(self, step: int, at_start: bool = False, record: bool = True) -> None:
        """Score every live domain's declared cheats; refuse the domains whose verifier accepts one.
        `record=False` (the start of a resumed run): a passing probe writes no metrics row or trace
        event, so the resumed run's records equal the uninterrupted run's; a refusal is written."""
        from posttrain.domains.registry import get

        for name in self._live():
            result = probe_domain(get(name), self.pool.eval_difficulty(name), self.cfg.probes.tasks)
            if result is None:
                if at_start and record:
                    self.metrics.write("probe", step, domain=name, declared=False, ok=None, cheats=0, accepted=0)
                continue
            data = {
                "verifier": result.verifier,
                "cheats": result.cheats,
                "accepted": len(result.accepted),
                "infra_errors": result.infra_errors,
                "examples": [asdict(a) for a in result.accepted[:3]],
            }
            if result.first_error is not None:
                data["first_error"] = asdict(result.first_error)
            if record or not result.ok:
                self.metrics.write("probe", step, domain=name, declared=True, ok=result.ok, **data)
                self.trace.add_event("probe", result.message(), step=step, domain=name, data=data)
            if not result.ok:
                self._refuse(step, name, result.message(), data, at_start)

    def _refuse(self, step: int, domain: str, message: str, data: dict[str, Any], at_start: bool) -> None:
        action = self.cfg.probes.action
        if action == "exclude":
            self._exclude(domain, message)
        left = self._live()
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
            self._actions.append(Stop(message))

    # ------------------------------------------------------------ judges' bias checks

    def judge_checks(self, step: int) -> list[JudgeCheck]:
        """Measure every live judge domain that declares `checks` (monitor/judges.py): a metrics row
        and a trace event `judge_check` and a log line each; a check that fires is the `judge_bias`
        alarm (its action: monitor.alarms.judge_bias.action; `stop` raises VerifierError, so the
        run refuses to start)."""
        from posttrain.domains.registry import get
        from posttrain.monitor.judges import check_judge

        out = []
        for name in self._live():
            result = check_judge(get(name), self.pool.eval_difficulty(name))
            if result is None:
                continue
            out.append(result)
            data = result.to_dict()
            self.metrics.write("judge_check", step, **data)
            self.trace.add_event("judge_check", result.message(), step=step, domain=name, data=data)
            self.log(result.message())
            rule = self.cfg.alarms.judge_bias
            if result.fired and rule.enabled:
                hit = Hit("judge_bias", name, result.message(), data)
                self.active.add((hit.kind, hit.domain))
                self._fire(step, hit, rule.action)
                if rule.action == "stop":  # at run start: refuse to train, as a failed probe does
                    raise VerifierError(result.message() + "; set monitor.alarms.judge_bias.action=log to train anyway")
        return out

    # ------------------------------------------------------------ audits of top-reward rollouts

    def _audit(self, step: int, groups: Sequence[Sequence[Rollout]]) -> dict[str, dict[str, Any]]:
        if not self.cfg.audit.enabled:
            return {}
        from posttrain.domains.registry import get

        by_domain: dict[str, list[Rollout]] = {}
        for g in groups:
            for r in g:
                if r.reward is not None and r.reward > 0:
                    by_domain.setdefault(r.task.domain, []).append(r)
        out = {}
        for name, rollouts in sorted(by_domain.items()):
            domain = get(name)
            if not domain.has_audit:
                continue
            top = sorted(rollouts, key=lambda r: -(r.reward or 0.0))[: self.cfg.audit.per_step]
            failed, examples, errors = 0, [], []
            for r in top:
                try:
                    ok = domain.audit(r.task, r.completion.text)
                except Exception as exc:  # an audit that cannot decide is an infra error, not a failure
                    errors.append(capture(exc, "verifier"))
                    continue
                if not ok:
                    failed += 1
                    examples.append(r.completion.text[:80])
            audited = len(top) - len(errors)
            self.history.audits.setdefault(name, []).append((step, audited, failed))
            out[name] = {"audited": audited, "failed": failed, "errors": len(errors), "examples": examples[:3]}
            if errors:
                out[name]["first_error"] = asdict(errors[0])
        return out

    # ------------------------------------------------------------ KL to the initial model

    def _kl(self, step: int, groups: Sequence[Sequence[Rollout]], stats: TrainerStats | None) -> dict[str, float]:
        if stats is not None and self.run.trainer_kl and stats.n_tokens:
            self.history.kl.setdefault("all", []).append((step, float(stats.kl)))
        every = self.cfg.kl.every_steps
        if not every or step % every or self._reference_of is None:
            return {}
        from posttrain.monitor.kl import kl_to_reference

        per_domain = kl_to_reference(self._reference_of(), groups, self.run.temperature, self.cfg.kl.rows)
        for domain, value in per_domain.items():
            self.history.kl.setdefault(domain, []).append((step, value))
        return per_domain

    # ------------------------------------------------------------ loggers, state and resume

    def _mirror(self, step: int, values: Mapping[str, Any]) -> None:
        if self.loggers:
            scalars = flatten("", values, {})
            for logger in self.loggers:
                logger.log(step, scalars)

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": dict(self.weights),
            "lowered": {d: list(f) for d, f in self.lowered.items()},
            "excluded": sorted(self.excluded),
            "raised": {d: dict(v) for d, v in self.raised.items()},
            "active": [list(k) for k in sorted(self.active, key=str)],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a checkpoint's state back; the exclusions and weight changes it holds are queued
        again as actions (a fresh pool has none of them), in the order they were first issued."""
        for domain in state.get("excluded", ()):
            if domain in self._live():
                self._exclude(domain, "excluded before the checkpoint")
        self.active = {(k, d) for k, d in state.get("active", ())}
        lowered = state.get("lowered") or {d: [m] for d, m in state.get("weights", {}).items()}  # older checkpoints
        for domain, factors in lowered.items():
            if domain in self._live():
                for factor in factors:
                    self._lower(domain, float(factor))
        for domain, values in state.get("raised", {}).items():
            if domain in self._live():
                for kind, value in sorted(values.items()):
                    self._raise(domain, kind, float(value))

    def _reload(self, upto: int) -> None:
        """Rebuild the history from metrics.jsonl rows up to `upto` (the resumed step)."""
        from posttrain.metrics_log import read_metrics

        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for row in read_metrics(self.run.run_dir / "metrics.jsonl"):
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
