"""The loss-spike guard: decides whether a step's update may be applied.

Invariant: only accepted steps enter the running medians, so a run of bad
steps can never raise the bar it is judged against; a non-finite loss or
grad norm is rejected from the first step, spikes once `min_history` steps
were accepted.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from posttrain.configs.trainer import GuardConfig


class SpikeGuard:
    """Running medians of |loss| and grad norm over the last `window` accepted steps."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self._losses: deque[float] = deque(maxlen=config.window)
        self._grad_norms: deque[float] = deque(maxlen=config.window)

    def verdict(self, loss: float, grad_norm: float) -> str:
        """Why the step must not be applied, or "" when it may."""
        if not math.isfinite(loss):
            return f"non-finite loss ({loss})"
        if not math.isfinite(grad_norm):
            return f"non-finite grad norm ({grad_norm})"
        if len(self._losses) < self.config.min_history:
            return ""
        factor = self.config.spike_factor
        loss_bar = factor * max(statistics.median(self._losses), self.config.loss_floor)
        if abs(loss) > loss_bar:
            return f"loss spike: |loss| {abs(loss):.4g} > {loss_bar:.4g}"
        norm_bar = factor * statistics.median(self._grad_norms)
        if grad_norm > norm_bar:
            return f"grad-norm spike: {grad_norm:.4g} > {norm_bar:.4g}"
        return ""

    def accept(self, loss: float, grad_norm: float) -> None:
        self._losses.append(abs(loss))
        self._grad_norms.append(grad_norm)

    def state_dict(self) -> dict[str, Any]:
        return {"losses": list(self._losses), "grad_norms": list(self._grad_norms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._losses = deque((float(x) for x in state["losses"]), maxlen=self.config.window)
        self._grad_norms = deque((float(x) for x in state["grad_norms"]), maxlen=self.config.window)
