"""The run's checks that its engine tells the truth, beyond each completion and each push: an engine
that keeps returning impossible completions, and behaviour log-probs that contradict the trainer's
own over a whole batch, stop the run.

Invariant: `EngineGuard.after_step` runs after every train step and before its push
(`loop._train_step`). (1) Engine faults: every sampled rollout of the step joins a window of the
last `engine.fault_window`; when the rollouts masked because the engine's answer was refused
(kind "engine", engine/validate.py) reach `engine.fault_stop_share` of that window, EngineFault
stops the run (fewer are masked and counted, `pipe_engine_faults`). (2) The train-inference
mismatch the trainer measured on the batch (`mismatch_abs_mean`: mean |trainer log-prob -
behaviour log-prob| over the loss tokens, before the update; docs/trainer.md): above
`trainer.mismatch.alarm_abs_mean` a logged alarm, above `trainer.mismatch.stop_abs_mean`
EngineFault, naming the batch's figure and the sync probe's last figure, before the step's
weights are pushed or checkpointed. The probe checks one fixed request per push; this checks every
token trained on, so an engine that answers the probe from the pushed weights and its rollouts from
others (measured: mean |d| 2.6 to 6.2) is stopped at the first step it serves.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.configs.engine import EngineConfig
from posttrain.configs.trainer import MismatchConfig
from posttrain.engine.probe import SyncProbe
from posttrain.errors import EngineFault


class EngineGuard:
    """Engine faults over a window of rollouts, and the mismatch of every batch (module docstring)."""

    def __init__(self, cfg: EngineConfig, mismatch: MismatchConfig, probe: SyncProbe | None = None) -> None:
        self.mismatch, self.probe = mismatch, probe
        self.window: deque[bool] = deque(maxlen=cfg.fault_window)
        self.stop_at = max(1, math.ceil(cfg.fault_stop_share * cfg.fault_window))
        self.share = cfg.fault_stop_share
        self.alarms = 0
        """Mismatch alarms raised so far."""
        self._example = ""

    def after_step(self, groups: Sequence[Sequence[Any]], stats: Any, log: Callable[[str], object] = print) -> None:
        """After a train step on the step's sampled `groups` (rollouts), with the trainer's `stats`
        (None: nothing trained): EngineFault when either check stops the run; an alarm is `log`ged."""
        self._faults(groups)
        if stats is not None and stats.n_tokens > 0:
            self._mismatch(stats, log)

    def _faults(self, groups: Sequence[Sequence[Any]]) -> None:
        for r in (r for g in groups for r in g):
            lie = r.error_kind == "engine"
            self.window.append(lie)
            self._example = (r.error or "") if lie else self._example
        count = sum(self.window)
        if count >= self.stop_at:
            raise EngineFault(
                f"the engine's answers were refused for {count} of the last {len(self.window)} sampled "
                f"completions (engine.fault_stop_share {self.share:g} of engine.fault_window "
                f"{self.window.maxlen}), e.g. {self._example}; an engine that keeps returning what no model "
                "can produce is not sampling the policy: stopping"
            )

    def _mismatch(self, stats: Any, log: Callable[[str], object]) -> None:
        gap, cfg = float(stats.mismatch_abs_mean), self.mismatch
        if cfg.stop_abs_mean is not None and not gap <= cfg.stop_abs_mean:  # NaN stops too
            raise EngineFault(
                f"train-inference mismatch: the step's batch has mean |trainer - engine| log-prob {gap:.3g} "
                f"(max {stats.mismatch_abs_max:.3g}, {stats.mismatch_outside:.0%} of {stats.n_tokens} tokens "
                f"outside the ratio bound), above trainer.mismatch.stop_abs_mean {cfg.stop_abs_mean:g}, while "
                f"{self._probe_figure()}: the engine's rollouts do not come from the weights the trainer holds "
                "(an engine that answers the probe from the pushed weights and samples from others); stopping "
                "before this step's weights are pushed or saved"
            )
        if cfg.alarm_abs_mean is not None and gap > cfg.alarm_abs_mean:
            self.alarms += 1
            log(
                f"alarm: train-inference mismatch at step {stats.step}: mean |trainer - engine| log-prob "
                f"{gap:.3g} above trainer.mismatch.alarm_abs_mean {cfg.alarm_abs_mean:g} (stop at "
                f"{cfg.stop_abs_mean}); {self._probe_figure()}"
            )

    def _probe_figure(self) -> str:
        results = [r for r in (self.probe.results if self.probe is not None else ()) if r.attempt >= 1]
        if not results:
            return "no sync probe ran (engine.verify_sync off, or an in-process engine)"
        r = results[-1]
        verdict = "passed" if r.ok else "failed"
        return (
            f"the sync probe {verdict} at the last push with max |engine - trainer| {r.max_diff:.3g} "
            f"(tolerance {r.tolerance:g}, engine version {r.version})"
        )
