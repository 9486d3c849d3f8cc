"""The `run` config section: steps, seed, run directory, threads, checkpoints.

Invariant: torch-free; every field is bounded.
"""

from __future__ import annotations

from pydantic import Field

from posttrain.configs.section import Section


class RunConfig(Section):
    """The run itself."""

    steps: int = Field(60, ge=0, le=10_000_000)
    """Training steps."""
    seed: int = 0
    """Seed of sampling, task order and training."""
    out_dir: str = "runs"
    """Parent folder of run directories."""
    name: str | None = None
    """Run directory name (default: a timestamp)."""
    threads: int = Field(2, ge=1, le=512)
    """torch CPU threads."""
    checkpoint_every: int = Field(20, ge=0)
    """Save a checkpoint every N steps (0: only at the end)."""
    progress: bool = True
    """Show a progress bar with live per-domain reward (on stderr; when that is not a terminal, plain
    lines, at most one every 30 s, instead of carriage-return frames: posttrain/progress.py)."""
    cpu_budget_s: float | None = Field(None, gt=0)
    """Stop after the step at which training has spent this many seconds of CPU time (this
    process, every thread; counted from the first step, so the held-out evaluation before
    training is not; a resumed run continues the count), then run the final evaluation and
    checkpoint as at a normal end. None: run all `steps`. See monitor/budget.py."""
