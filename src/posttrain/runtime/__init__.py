"""posttrain.runtime: where rollout workers run.

Invariant: a runtime only changes where the pipeline's worker calls execute,
never what they compute: with the same seeds, `runtime: ray` yields the same
rollouts as the embedded runtime (tests/pipeline/test_pipeline_ray.py).
Ray is imported only when `runtime: ray` is chosen.
"""
