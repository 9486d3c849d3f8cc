"""trainer.replay at loop level: past groups re-enter later steps' losses (with the ratio to the
behaviour log-probs they were sampled with), the metrics and the trace say so, the draw accounting
stays exact (a replay is no new draw), and a resumed run replays what the uninterrupted run did."""

from __future__ import annotations

import json

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore

REPLAY = [
    "trainer.replay.enabled=true",
    "trainer.replay.admit=mixed",
    "trainer.replay.share=0.5",
    "trainer.replay.max_age=2",
]


def _cfg(tmp_path, base, name, *extra):
    return load_config(None, [*tiny(), f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}", *extra])


def _params(run_dir):
    from safetensors.torch import load_file

    from posttrain.trainer.checkpoint import latest_checkpoint

    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def _replays(run_dir):
    """(step, group, sampled step, age, {rollout id: link}) of every replayed group, from the trace."""
    return [(e["step"], g["group_id"], g["sampled_step"], g["age"], g["rollouts"]) for e, g in _events(run_dir)]


def _events(run_dir):
    """(event, group) of every replayed group, from the trace."""
    store = TraceStore(run_dir / "trace.db")
    return [(e, g) for e in store.events("replay") for g in json.loads(e["data"])["groups"]]


def _check_replay_bound(run_dir, max_age):
    """Every replayed group, from the trace alone: the weights that generated it (the oldest
    model_version among its trained rollouts) are at most max_age versions behind the weights the
    replay trained it at (the engine_version the step's metrics row had before its push); the
    event names the step that drew it and the version gap as they are. Returns how many."""
    store = TraceStore(run_dir / "trace.db")
    records = store.recent(100_000)
    before = {}  # loop step -> the trainer's version when the step trained
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    for prev, row in zip([None, *rows], rows, strict=False):
        before[row["step"]] = 0 if prev is None else prev["engine_version"]
    n = 0
    for e, g in _events(run_dir):
        own = [r for r in records if r["group_id"] == g["group_id"] and r["train_step"] is not None]
        made = min(r["model_version"] for r in own)
        trainer = before[e["step"]]
        assert trainer - made <= max_age, (e["step"], g, made, trainer)
        assert (g["version"], g["trainer_version"], g["age"]) == (made, trainer, trainer - made), g
        draw = store.draw_of_group(g["group_id"])
        assert draw is not None and g["sampled_step"] == draw["step"] and g["trained_step"] == own[0]["train_step"]
        n += 1
    return n


def test_replayed_groups_enter_later_losses_and_the_accounting_stays_exact(tmp_path, micro_base, parity_domain):
    from posttrain.loop import train

    result = train(_cfg(tmp_path, micro_base, "replay", "run.steps=4", parity_domain, *REPLAY), log=lambda *_: None)
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert rows[0]["replay_groups"] == 0 and rows[0]["replay_buffer"] > 0  # nothing to replay yet; the step admitted
    later = [r for r in rows[1:] if r["replay_groups"]]
    assert later, "no step replayed a group"
    for r in later:
        assert r["replay_groups"] <= 2 and 0 < r["replay_share"] < 1
        assert 1 <= r["replay_age_mean"] <= r["replay_age_max"] <= 2
    replays = _replays(result.run_dir)
    assert sum(r["replay_groups"] for r in rows) == len(replays)
    store = TraceStore(result.run_dir / "trace.db")
    ratios = []
    assert _check_replay_bound(result.run_dir, 2) == len(replays)
    for step, group, sampled, age, links in replays:
        assert sampled < step and 1 <= age <= 2
        own = [r for r in store.recent(1000) if r["group_id"] == group]
        assert own and {r["train_step"] for r in own} == {sampled}  # the link to the step that sampled it stays
        assert set(links) <= {r["id"] for r in own} and all(link["ratio"] is not None for link in links.values())
        ratios += [link["ratio"] for link in links.values()]
    # the ratio is to the behaviour log-probs of an older policy: after an update it is no longer 1
    assert any(abs(x - 1.0) > 1e-7 for x in ratios), ratios
    acc = store.accounting()
    assert acc.exact, acc.describe()
    assert acc.drawn == 4 * 4 and acc.replayed == len(replays) and "replayed" in acc.describe()
    from posttrain.report import write_report

    page = write_report(result.run_dir).read_text()  # the report's replay section: share and age
    assert f"<td>{len(replays)} / " in page and "age, mean / max (weight versions)" in page


@pytest.mark.heavy
def test_resume_replays_what_the_uninterrupted_run_replays(tmp_path, micro_base, parity_domain):
    from posttrain.loop import train
    from posttrain.trainer.checkpoint import checkpoint_path

    quiet = lambda *_: None  # noqa: E731
    opts = ("run.checkpoint_every=2", parity_domain, *REPLAY)
    full = train(_cfg(tmp_path, micro_base, "full", "run.steps=4", *opts), log=quiet)
    part = train(_cfg(tmp_path, micro_base, "part", "run.steps=2", *opts), log=quiet)
    state = json.loads((checkpoint_path(part.run_dir, 2) / "loop_state.json").read_text())
    assert state["replay"]["entries"], "the checkpoint holds no buffered group: the comparison would be vacuous"
    cfg_path = part.run_dir / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("steps: 2", "steps: 4"))
    resumed = train(None, resume=part.run_dir, log=quiet)
    assert [r[:4] for r in _replays(full.run_dir)] == [r[:4] for r in _replays(resumed.run_dir)]
    assert any(step > 2 for step, *_ in _replays(resumed.run_dir))  # replays after the resume, from the saved buffer
    a, b = _params(full.run_dir), _params(resumed.run_dir)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert TraceStore(resumed.run_dir / "trace.db").accounting().exact


def test_accounting_counts_replays_and_flags_a_replay_of_a_group_never_trained(tmp_path):
    from posttrain.pipeline.draws import DrawLedger
    from posttrain.trace import RolloutRecord
    from posttrain.types import Message, Task, TaskMeta

    store, ledger = TraceStore(tmp_path / "trace.db"), DrawLedger()
    tasks = [Task(f"add:{i}", "add", (Message("user", "1+1="),), "2", TaskMeta("train", 1, "t", "v")) for i in (0, 1)]
    trained, filtered = ledger.drawn(tasks, 1)
    for draw, gid in ((trained, "1:0"), (filtered, "1:1")):
        ledger.bind(draw, gid)
        store.write_rollouts(
            [
                RolloutRecord(
                    task_id="add:0", domain="add", split="train", difficulty=1, taskset_version="v", group_id=gid,
                    model_version=0, sampling={}, prompt="p", completion="c", completion_tokens=1,
                    finish_reason="stop", reward=float(i), passed=bool(i), parts={}, reason="", verifier="x",
                    timings={}, id=f"{gid}/{i}",
                )
                for i in range(2)
            ]
        )  # fmt: skip
    ledger.trained(trained, 1)
    ledger.dropped(filtered, "filtered", 1)
    link = type("L", (), {"advantage": 1.0, "ratio": 1.0, "clipped": 0.0})
    store.mark_consumed(1, {"1:0/0": link, "1:0/1": link})
    ledger.flush(store)
    store.add_event("replay", "1 group", step=3, data={"groups": [{"group_id": "1:0"}]})
    acc = store.accounting()
    assert acc.exact and acc.replayed == 1 and acc.drawn == 2 and acc.trained == 1
    store.add_event("replay", "1 group", step=4, data={"groups": [{"group_id": "1:1"}]})  # its draw was dropped
    acc = store.accounting()
    assert not acc.exact and any("1:1 replayed at step 4 but its draw is dropped" in c for c in acc.contradictions)


@pytest.mark.slow
def test_replay_in_async_mode_keeps_the_accounting_exact(tmp_path, micro_base, parity_domain):
    """pipeline.mode async with replay: stale fresh groups and replayed ones share a step's batch;
    every draw still has one fate and every replay refers to a draw trained before it."""
    from posttrain.loop import train

    opts = (
        "run.steps=6",
        "pipeline.mode=async",
        "pipeline.max_staleness=1",
        parity_domain,
        *REPLAY,
        "trainer.replay.max_age=1",
    )
    result = train(_cfg(tmp_path, micro_base, "async", *opts), log=lambda *_: None)
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert sum(r["replay_groups"] for r in rows) > 0
    # groups trained a version late still replay at most max_age versions after their weights
    assert _check_replay_bound(result.run_dir, 1) == sum(r["replay_groups"] for r in rows)
    acc = TraceStore(result.run_dir / "trace.db").accounting()
    assert acc.exact and acc.replayed == sum(r["replay_groups"] for r in rows), acc.describe()
