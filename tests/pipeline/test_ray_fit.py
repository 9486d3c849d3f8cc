"""Ray's declarations against the machine (issue 35 item 11), without starting Ray: the default
config's actors fit any local cluster (their CPU declarations scaled to it), a CPU demand the user
wrote that cannot fit is still the clear error, and the local cluster's custom resources are a
config field reachable from the command line (`pipeline.ray_resources`, given to `ray.init`)."""

from __future__ import annotations

import pytest

from posttrain.configs import load_config
from posttrain.errors import ConfigError
from posttrain.pipeline.ray import actor_options, check_fits, declared, fit_defaults

STAGES = ("generate", "execute", "verify")


def _need(cfg) -> float:
    per = actor_options(cfg)
    return sum(declared(per[s])["CPU"] * cfg.workers(s) for s in STAGES)


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 6, 7, 8, 64])
@pytest.mark.parametrize("workers", [[], ["pipeline.execute_workers=16", "pipeline.verify_workers=8"]])
def test_the_default_declarations_fit_any_local_cluster(cpus, workers):
    """Property: for any machine size and any worker counts left to the CPU defaults, the fitted
    declarations fit (before: 7 CPUs declared by default, refused under 7 cores)."""
    cfg = load_config(None, ["runtime=ray", *workers]).pipeline
    total = {"CPU": float(cpus)}
    fitted = fit_defaults(cfg, total)
    check_fits(fitted, total)  # raises on the old defaults whenever cpus < the declared total
    assert _need(fitted) <= cpus + 1e-9
    assert all(getattr(fitted, f) > 0 for f in ("generate_cpus", "execute_cpus", "verify_cpus"))
    if _need(cfg) <= cpus:
        assert fitted == cfg  # a machine that holds the defaults keeps them


def test_a_cpu_demand_the_user_wrote_is_kept_and_refused_clearly():
    cfg = load_config(None, ["runtime=ray", "pipeline.execute_cpus=4"]).pipeline
    fitted = fit_defaults(cfg, {"CPU": 2.0})
    assert fitted.execute_cpus == 4.0
    with pytest.raises(ConfigError, match="the actors declare .*CPU.* but the local cluster has"):
        check_fits(fitted, {"CPU": 2.0})


def test_custom_resources_of_the_local_cluster_come_from_the_config():
    cfg = load_config(
        None,
        ["runtime=ray", "pipeline.ray_resources={sandbox_slot: 4}", "pipeline.execute_resources={sandbox_slot: 1}"],
    ).pipeline
    assert cfg.ray_resources == {"sandbox_slot": 4.0}
    total = {"CPU": 2.0, **cfg.ray_resources}  # what ray.init(resources=...) gives the local cluster
    check_fits(fit_defaults(cfg, total), total)  # 4 execution actors, 4 slots
    with pytest.raises(ConfigError, match="sandbox_slot"):
        check_fits(fit_defaults(cfg, {"CPU": 2.0}), {"CPU": 2.0})  # without the field: no slot
    with pytest.raises(ConfigError, match="pipeline.ray_resources"):
        load_config(None, ["pipeline.ray_resources={CPU: 4}"])


@pytest.mark.ray
def test_train_starts_its_own_cluster_with_the_defaults_and_custom_resources(micro_base, tmp_path):
    """`posttrain train` with runtime ray, the default CPU declarations (7 CPUs on a machine that may
    have 2) and execution actors that declare a custom resource the cluster gets from
    pipeline.ray_resources: the run starts its own local cluster and trains (before: refused)."""
    import ray

    from posttrain.loop import train
    from posttrain.trace import TraceStore

    assert not ray.is_initialized()
    overrides = [
        "runtime=ray",
        "pipeline.ray_resources={sandbox_slot: 4}",
        "pipeline.execute_resources={sandbox_slot: 1}",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens=4",
        "eval.tasks_per_domain=2",
        "eval.max_tokens=4",
        "run.threads=1",
        "run.progress=false",
        "monitor.report=false",
        "run.steps=1",
        "tasks.domains={add: {difficulty: 1}}",
        f"model.path={micro_base}",
        f"run.out_dir={tmp_path}",
        "run.name=fit",
    ]
    try:
        # 4 execution actors x 1 sandbox_slot: without the cluster's 4 slots check_fits refuses the run
        result = train(load_config(None, overrides), log=lambda *_: None)
    finally:
        ray.shutdown()  # the run shuts the cluster it started; this is for a run that failed
    assert len(TraceStore(result.run_dir / "trace.db").recent(100)) == 2 * 2
