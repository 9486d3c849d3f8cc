"""posttrain.pipeline: the rollout pipeline, its schedulers and the group lifecycle.

Invariant: every admitted group leaves exactly once, scored or masked with a typed infra
error (never scored 0), whichever scheduler ran it.

    async with Pipeline(cfg, EmbeddedWorkers(engine), params, scheduler) as pipe:
        results = await pipe.run_groups(tasks)   # one step's tasks, in order (multi-turn: envs.driver)
    pipe.stats().flat()   # queue depths, throughput, latency percentiles, idle share

Every scheduler (the staged pipeline; the inline `Play` that training's direct path, evaluation
and `play` share) drives each group through one lifecycle, `GroupRun` (pipeline/group.py).
pipeline.mode async streams instead (`Continuous`, pipeline/continuous.py: `Pipeline.submit`
and `Pipeline.drain` under a staleness bound).
"""

_LAZY = {
    "Pipeline": "core",
    "PipelineStats": "core",
    "GroupResult": "group",
    "GroupRun": "group",
    "RetryPolicy": "group",
    "Play": "play",
    "play": "play",
    "Scheduler": "scheduler",
    "AdaptiveCap": "scheduler",
    "EmbeddedWorkers": "workers",
    "Workers": "workers",
    "Verdict": "workers",
    "verify_group": "workers",
    "StepRollouts": "step",
    "make_workers": "step",
    "Continuous": "continuous",
}
__all__ = [*_LAZY]


def __getattr__(name: str):
    """Heavy parts load on first use, so importing the package stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"posttrain.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(name)
