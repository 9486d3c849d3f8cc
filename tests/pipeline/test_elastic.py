"""The elastic controller's decisions (hysteresis, bounds, cooldown) on a fake clock and fake
loads, and the pipeline.elastic config's checks: no Ray."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from posttrain.configs import Config
from posttrain.configs.pipeline import ElasticConfig, PipelineConfig
from posttrain.pipeline.elastic import ElasticController, StageLoad

CFG = ElasticConfig(
    enabled=True,
    execute={"min": 1, "max": 3},
    verify={"min": 1, "max": 2},
    hold_periods=2,
    cooldown_s=5.0,
    grow_backlog=1.0,
    shrink_idle=0.5,
)

BUSY = StageLoad(workers=1, waiting=3, idle_share=0.0)
IDLE = StageLoad(workers=1, waiting=0, idle_share=0.9)


def _run(ctrl, looks):
    """Feed (time, {stage: load}) looks; the changes as (time, stage, before, after)."""
    return [(c.at, c.stage, c.before, c.after) for t, loads in looks for c in ctrl.decide(t, loads)]


def test_a_backlog_grows_the_stage_only_after_it_held_for_hold_periods():
    ctrl = ElasticController(CFG)
    assert _run(ctrl, [(0.0, {"execute": BUSY})]) == []  # one look is not enough
    assert _run(ctrl, [(1.0, {"execute": BUSY})]) == [(1.0, "execute", 1, 2)]


def test_a_condition_that_breaks_resets_the_streak():
    ctrl = ElasticController(CFG)
    calm = StageLoad(workers=1, waiting=0, idle_share=0.2)  # neither grows nor shrinks
    looks = [(0.0, {"execute": BUSY}), (1.0, {"execute": calm}), (2.0, {"execute": BUSY})]
    assert _run(ctrl, looks) == []
    assert _run(ctrl, [(3.0, {"execute": BUSY})]) == [(3.0, "execute", 1, 2)]


def test_cooldown_holds_the_next_change_back():
    ctrl = ElasticController(CFG)
    busy2 = StageLoad(workers=2, waiting=4, idle_share=0.0)
    got = _run(ctrl, [(0.0, {"execute": BUSY}), (1.0, {"execute": BUSY})])
    got += _run(ctrl, [(t, {"execute": busy2}) for t in (2.0, 3.0, 4.0, 5.0)])  # held, but cooling down
    assert got == [(1.0, "execute", 1, 2)]
    assert _run(ctrl, [(6.0, {"execute": busy2})]) == [(6.0, "execute", 2, 3)]


def test_bounds_are_never_passed():
    ctrl = ElasticController(CFG.model_copy(update={"cooldown_s": 0.0, "hold_periods": 1}))
    top = StageLoad(workers=3, waiting=9, idle_share=0.0)
    bottom = StageLoad(workers=1, waiting=0, idle_share=1.0)
    assert _run(ctrl, [(float(t), {"execute": top, "verify": bottom}) for t in range(5)]) == []
    # a pool outside its bounds (an actor lost for good) goes back inside at once, whatever the streaks
    assert _run(ctrl, [(9.0, {"execute": StageLoad(0, 0, 1.0)})]) == [(9.0, "execute", 0, 1)]


def test_idle_shrinks_and_shrinks_come_before_grows():
    ctrl = ElasticController(CFG.model_copy(update={"hold_periods": 1}))
    idle2 = StageLoad(workers=2, waiting=0, idle_share=0.8)
    got = _run(ctrl, [(0.0, {"execute": BUSY, "verify": idle2})])
    assert got == [(0.0, "verify", 2, 1), (0.0, "execute", 1, 2)]  # what verify frees, execute may take
    waiting = StageLoad(workers=2, waiting=2, idle_share=0.8)  # idle share high but a backlog: no shrink
    assert _run(ctrl, [(10.0, {"verify": waiting}), (20.0, {"verify": waiting})]) == []


def test_an_undone_grow_may_retry_without_the_cooldown():
    ctrl = ElasticController(CFG.model_copy(update={"hold_periods": 1}))
    (change,) = ctrl.decide(0.0, {"execute": BUSY})
    ctrl.undo(change)  # the cluster had no room
    assert _run(ctrl, [(1.0, {"execute": BUSY})]) == [(1.0, "execute", 1, 2)]


def test_elastic_config_checks():
    with pytest.raises(ValidationError, match="within"):
        PipelineConfig(execute_workers=4, elastic={"enabled": True, "execute": {"min": 1, "max": 2}})
    with pytest.raises(ValidationError, match="min"):
        ElasticConfig(execute={"min": 3, "max": 2})
    with pytest.raises(ValidationError, match="CPU/GPU"):
        PipelineConfig(execute_resources={"CPU": 1.0})
    with pytest.raises(ValidationError, match="runtime=ray"):
        Config(pipeline={"elastic": {"enabled": True}})
    cfg = PipelineConfig(execute_workers=1, elastic={"enabled": True, "execute": {"min": 1, "max": 3}})
    assert cfg.calls("execute") == 3 and cfg.workers("execute") == 1
    assert PipelineConfig(execute_workers=2).calls("execute") == 2  # off: the fixed count


def test_report_shows_the_pool_counts_where_they_moved(tmp_path):
    from posttrain.report import html as report_html
    from posttrain.report.data import RunData

    def row(step, execute, changes):
        return {
            "step": step,
            "pool_generate_workers": 1,
            "pool_execute_workers": execute,
            "pool_verify_workers": 1,
            "pool_changes": changes,
            "pool_grown": min(changes, 2),
            "pool_shrunk": max(0, changes - 2),
            "pool_blocked": 0,
        }

    train = [row(1, 1, 0), row(2, 1, 0), row(3, 3, 2), row(4, 3, 2), row(5, 1, 4)]
    data = RunData(tmp_path, "", train, [], [], [], [], [], None)
    assert [(r["step"], r["pool_execute_workers"]) for r in data.pools()] == [(1, 1), (3, 3), (5, 1)]
    table = report_html._pool_table(data)
    assert table.count("<tr>") == 4 and "<tr><td>3</td><td>1</td><td>3</td><td>1</td>" in table  # header + 3 rows
    empty = RunData(tmp_path, "", [{"step": 1}], [], [], [], [], [], None)
    assert "no Ray stage pools" in report_html._pool_table(empty)


class _FakeRay:
    """Records kills (the pool's only Ray call)."""

    def __init__(self):
        self.killed = []

    def kill(self, actor, no_restart=True):
        assert no_restart
        self.killed.append(actor)


def test_a_pool_drains_a_busy_actor_before_it_kills_it_and_calls_wait_for_a_free_one():
    from posttrain.pipeline.ray import StagePool

    ray = _FakeRay()
    made = iter(range(100))
    now = [0.0]

    async def go():
        pool = StagePool("execute", lambda: f"actor{next(made)}", 2, {"CPU": 0.5, "sandbox_slot": 1.0}, ray)
        assert pool.held() == {"CPU": 1.0, "sandbox_slot": 2.0}
        a = await pool.acquire(lambda: now[0])
        b = await pool.acquire(lambda: now[0])
        waiter = asyncio.ensure_future(pool.acquire(lambda: now[0]))
        await asyncio.sleep(0)
        assert not waiter.done()  # both actors busy: the third call waits
        now[0] = 1.0
        load = pool.load(now[0])
        assert (load.workers, load.waiting, load.idle_share) == (2, 1.0, 0.0)
        pool.shrink()  # every actor busy: the last one is drained, not killed
        assert ray.killed == [] and len(pool.slots) == 1 and pool.held()["sandbox_slot"] == 2.0
        pool.release(b, now[0])  # its call ended: now it goes
        assert ray.killed == ["actor1"] and pool.held()["sandbox_slot"] == 1.0
        await asyncio.sleep(0)
        assert not waiter.done()  # the drained actor took no new call
        pool.release(a, now[0])
        got = await waiter
        assert got.actor == "actor0"
        actor = pool.grow()
        assert actor == "actor2" and pool.actors == ["actor0", "actor2"]
        pool.shrink()  # an idle actor goes at once
        assert ray.killed == ["actor1", "actor2"]
        pool.release(got, 2.0)
        now[0] = 3.0
        assert pool.load(now[0]).idle_share == 0.5  # busy from 1.0 to 2.0, idle from 2.0 to 3.0
        pool.close()
        assert ray.killed == ["actor1", "actor2", "actor0"] and pool.actors == []

    asyncio.run(go())


def test_custom_resources_are_declared_and_checked_like_cpus():
    from posttrain.errors import ConfigError
    from posttrain.pipeline.ray import actor_options, check_fits, declared

    cfg = PipelineConfig(
        generate_workers=1,
        execute_workers=2,
        verify_workers=1,
        execute_cpus=0.25,
        execute_resources={"sandbox_slot": 1},
    )
    opts = actor_options(cfg)
    assert opts["execute"]["resources"] == {"sandbox_slot": 1.0} and "resources" not in opts["verify"]
    assert declared(opts["execute"]) == {"CPU": 0.25, "GPU": 0.0, "sandbox_slot": 1.0}
    check_fits(cfg, {"CPU": 4.0, "sandbox_slot": 2.0})  # 2 execution actors, 2 slots: fits
    with pytest.raises(ConfigError, match="sandbox_slot"):
        check_fits(cfg, {"CPU": 4.0, "sandbox_slot": 1.0})
    with pytest.raises(ConfigError, match="sandbox_slot"):
        check_fits(cfg, {"CPU": 4.0})  # a cluster that never declared the resource
