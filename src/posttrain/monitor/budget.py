"""The run's CPU budget (`run.cpu_budget_s`): stop after the step at which training has spent it.

Invariant: the clock is this process's CPU time, every thread included
(`time.process_time`: the loop's thread, the engine's, the verifiers'),
counted from the start of the first training step of this process plus
what the run had spent before a resume (its checkpoint carries the count);
so the held-out evaluation before training, model loading and the final
evaluation are outside it, while each step's rollouts, train step,
monitor, periodic evaluation and checkpoint are inside it. Other processes
(sandbox runs, verification processes, Ray actors, an inference server)
are not counted. It only returns a
`Stop` after the step that reaches the budget; the loop applies it like a
monitor's action, so the final evaluation and checkpoint run as at a
normal end.
"""

from __future__ import annotations

import time

from posttrain.monitor.actions import Action, Stop


class CpuBudget:
    """Call `start` just before the first step, `after_step` after each one."""

    def __init__(self, budget_s: float | None, spent_before_s: float = 0.0) -> None:
        self.budget_s = budget_s
        """Seconds of CPU the run may spend training (None: no budget, the clock still counts)."""
        self.spent_before_s = float(spent_before_s)
        self._t0: float | None = None

    def start(self) -> CpuBudget:
        self._t0 = time.process_time()
        return self

    def spent(self) -> float:
        """Training CPU seconds of the run so far (before a resume included)."""
        running = 0.0 if self._t0 is None else time.process_time() - self._t0
        return self.spent_before_s + running

    def after_step(self, step: int) -> list[Action]:
        """A Stop once the budget is spent, else nothing."""
        spent = self.spent()
        if self.budget_s is None or spent < self.budget_s:
            return []
        return [
            Stop(
                f"CPU budget reached: {spent:.1f}s of training CPU by step {step} (run.cpu_budget_s={self.budget_s:g})"
            )
        ]
