"""What several bench scripts share. Imported by its folder name (a bench script runs with bench/
first on sys.path); no side effects on import: no environment variables, no torch."""

from __future__ import annotations


def quiet_run(steps: int, out: str) -> list[str]:
    """Overrides of a demo loop run that only trains: a small held-out set, no periodic evaluation,
    pass@k, above-level set, checkpoint, report or progress bar; the run dir under `out`."""
    return [
        f"run.steps={steps}",
        "eval.tasks_per_domain=10",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        "run.checkpoint_every=0",
        "monitor.report=false",
        "run.progress=false",
        f"run.out_dir={out}",
    ]
