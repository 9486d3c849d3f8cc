"""Exactly once, in the trace: every task the pool hands out is a draw with one fate, trained or
dropped with its reason; `accounting` computes it from the trace alone and catches a lost draw,
a prompt trained twice, a trained group nobody drew, a second fate, and what a resume rolls back."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest

from posttrain.pipeline.draws import DrawLedger
from posttrain.trace import DrawRecord, RolloutRecord, TraceStore, draw_id
from posttrain.types import Message, Task, TaskMeta

LINK = SimpleNamespace(advantage=0.5, ratio=1.0, clipped=0.0)


def _task(i: int) -> Task:
    return Task(f"add:{i}", "add", (Message("user", f"{i}+1="),), str(i + 1), TaskMeta("train", 1, "test", "v1"))


def _rollouts(gid: str, n: int = 2) -> list[RolloutRecord]:
    return [
        RolloutRecord(
            task_id="add:0", domain="add", split="train", difficulty=1, taskset_version="v", group_id=gid,
            model_version=0, sampling={}, prompt="p", completion="c", completion_tokens=1, finish_reason="stop",
            reward=float(i % 2), passed=bool(i % 2), parts={}, reason="", verifier="x", timings={}, id=f"{gid}/{i}",
        )
        for i in range(n)
    ]  # fmt: skip


def _step(store: TraceStore, ledger: DrawLedger, step: int, fates: list[str]) -> list[str]:
    """One loop step of len(fates) draws, each made a group, the groups traced, their fates decided
    ("trained" links the group's rollouts to the step) and flushed, as the loop does."""
    ids = ledger.drawn([_task(10 * step + k) for k in range(len(fates))], step)
    links = {}
    for k, (draw, fate) in enumerate(zip(ids, fates)):
        gid = f"{step}:{k}"
        ledger.bind(draw, gid)
        store.write_rollouts(_rollouts(gid))
        if fate == "trained":
            ledger.trained(draw, step)
            links.update(dict.fromkeys((r.id for r in _rollouts(gid)), LINK))
        else:
            ledger.dropped(draw, fate, step)
    store.mark_consumed(step, links)
    ledger.flush(store)
    return ids


def test_every_draw_is_counted_once_with_its_fate(tmp_path):
    store, ledger = TraceStore(tmp_path / "trace.db"), DrawLedger()
    assert _step(store, ledger, 1, ["trained", "filtered", "trained"]) == ["d1.0", "d1.1", "d1.2"]
    _step(store, ledger, 2, ["masked", "trained", "stale: 2 versions behind"])
    got = store.accounting()
    assert (got.drawn, got.trained, dict(got.dropped)) == (6, 3, {"filtered": 1, "masked": 1, "stale": 1})
    assert got.exact and not got.lost and "exactly once: yes" in got.describe()
    rows = store._db.execute("SELECT id, task_id, group_id, fate, reason, fate_step FROM draws ORDER BY rowid")
    assert [tuple(r) for r in rows][-1] == ("d2.2", "add:22", "2:2", "dropped", "stale: 2 versions behind", 2)


def test_accounting_catches_a_lost_draw_a_prompt_trained_twice_and_a_trained_group_nobody_drew(tmp_path):
    store, ledger = TraceStore(tmp_path / "trace.db"), DrawLedger()
    _step(store, ledger, 1, ["trained", "filtered"])
    ledger.drawn([_task(99)], 2)  # drawn, never given a fate
    ledger.flush(store)
    got = store.accounting()
    assert got.lost == ("d2.0",) and not got.exact
    store._db.execute("UPDATE rollouts SET train_step=3 WHERE id='1:0/1'")  # one of the group's rows, again later
    assert store.accounting().trained_twice == ("d1.0",)
    store._db.execute("UPDATE rollouts SET train_step=NULL WHERE id='1:0/1'")
    store.write_rollouts(_rollouts("7:0"))
    store.mark_consumed(7, {"7:0/0": LINK})
    assert store.accounting().trained_undrawn == ("7:0",)
    store._db.execute("UPDATE rollouts SET train_step=1 WHERE group_id='1:1'")  # a filtered group's rows trained
    assert any("d1.1 dropped (filtered)" in c for c in store.accounting().contradictions)


def test_a_second_fate_is_refused_and_nothing_of_the_call_is_written(tmp_path):
    store, ledger = TraceStore(tmp_path / "trace.db"), DrawLedger()
    [draw] = _step(store, ledger, 1, ["trained"])
    again = [DrawRecord("d9.0", 9, "t", "add"), DrawRecord(draw, 1, "add:10", "add", "1:0", "dropped", "stale", 2)]
    with pytest.raises(ValueError, match="d1.0: fate 'dropped' at step 2.*one fate"):
        store.record_draws(again)
    assert store.accounting().drawn == 1  # d9.0 went with the refused call
    with pytest.raises(ValueError, match="not open"):
        ledger.dropped(draw, "stale", 2)
    with pytest.raises(ValueError, match="drop reason 'bored'"):
        ledger.dropped(ledger.drawn([_task(1)], 3)[0], "bored", 3)
    with pytest.raises(Exception, match="draw 'd8.0' is not in the trace"):
        store.record_dropped(3, {"d8.0": "stale"})


def test_roll_back_deletes_draws_after_the_mark_and_clears_fates_decided_after_the_step(tmp_path):
    """What a resume does: the draws recorded after the checkpoint's mark go, a draw recorded
    before it whose fate came later is open again (the off-policy mode's next batch), and the
    resumed run, which draws the same tasks, records them under the same ids."""
    store, ledger = TraceStore(tmp_path / "trace.db"), DrawLedger()
    _step(store, ledger, 1, ["trained"])
    ahead = ledger.drawn([_task(5)], 1)  # drawn at step 1 for step 2, in flight at the checkpoint
    ledger.flush(store)
    mark = store.mark()
    assert mark["draws"] == 2
    ledger.bind(ahead[0], "2:0")
    ledger.dropped(ahead[0], "stale", 2)
    _step(store, ledger, 2, ["trained"])
    store.roll_back(mark, 1)
    assert store.pending_draws() == ["d1.1"]
    assert [r[0] for r in store._db.execute("SELECT id FROM draws ORDER BY rowid")] == ["d1.0", "d1.1"]
    store.record_dropped(1, {"d1.1": "interrupted"})
    _step(store, DrawLedger(), 2, ["trained"])  # the resumed run's step 2: the same id
    got = store.accounting()
    assert got.exact and got.drawn == 3 and dict(got.dropped) == {"interrupted": 1}
    assert draw_id(2, 0) in [r[0] for r in store._db.execute("SELECT id FROM draws")]


def test_a_version_3_trace_gains_the_draws_table(tmp_path):
    from posttrain.trace import _SCHEMA, SCHEMA_VERSION

    path = tmp_path / "v3.db"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA.split("CREATE TABLE IF NOT EXISTS draws")[0])
    db.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    db.commit()
    db.close()
    store = TraceStore(path)
    version = store._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION == 4 and store.accounting().drawn == 0


def test_a_run_accounts_for_every_draw_and_the_command_prints_it(tmp_path, micro_base, parity_domain, monkeypatch):
    """A real run: every draw of the pool (the first round's and the replacements dynamic sampling
    drew) has its fate (filtered at step 2, the guard's skipped update at step 3); the groups that
    trained are the draws marked trained; the trace's rollout
    ids are the ids the rollouts were born with; `posttrain trace accounting` prints it, exit 0."""
    from test_loop_e2e import _cfg

    import posttrain.loop as loop
    import posttrain.pipeline.draws as draws
    from posttrain.loop import train
    from posttrain.rollout import informative
    from posttrain.trainer.guard import SpikeGuard

    # step 2's groups all look uninformative to the loop: they are dropped as filtered, not lost
    looks = lambda g: not g[0].group_id.startswith("2:") and informative(g)  # noqa: E731
    monkeypatch.setattr(loop, "informative", looks)
    monkeypatch.setattr(draws, "informative", looks)  # the ledger's fates (pipeline/draws.py)
    calls, verdict = [], SpikeGuard.verdict  # the guard's second verdict (step 3's; step 2 coasts) is a spike

    def spike(self, loss, grad_norm):
        calls.append(loss)
        return "test spike" if len(calls) == 2 else verdict(self, loss, grad_norm)

    monkeypatch.setattr(SpikeGuard, "verdict", spike)
    result = train(_cfg(tmp_path, micro_base, "acc", "run.steps=3", parity_domain), log=lambda *_: None)
    store = TraceStore.read_only(result.run_dir / "trace.db")
    got = store.accounting()
    draws = [dict(r) for r in store._db.execute("SELECT * FROM draws ORDER BY rowid")]
    trained_groups = {r[0] for r in store._db.execute("SELECT DISTINCT group_id FROM rollouts WHERE train_step>0")}
    ids = [r[0] for r in store._db.execute("SELECT id FROM rollouts ORDER BY rowid")]
    from posttrain.trace.explain import explain

    said = explain(store, ids[0])  # step 1's first rollout: its draw, trained at step 1
    store.close()
    assert "draw d1.0 (drawn at step 1): trained at step 1" in said or "draw d1.0 (drawn at step 1): dropped" in said
    assert got.exact and got.trained > 0 and got.dropped.get("filtered", 0) >= 4, got.describe()
    assert got.drawn == len(draws) >= 3 * 4  # 4 prompts a step, and the replacements
    for step in (1, 2, 3):  # each step's draws numbered from 0, in draw order
        mine = [d["id"] for d in draws if d["step"] == step]
        assert mine == [f"d{step}.{k}" for k in range(len(mine))]
    guarded = {d["group_id"] for d in draws if d["reason"].startswith("guard")}
    assert guarded <= trained_groups  # the guard's step links its rows and applies nothing
    assert {d["group_id"] for d in draws if d["fate"] == "trained"} == trained_groups - guarded
    assert all(d["fate_step"] == 2 and d["reason"] == "filtered" for d in draws if d["step"] == 2)
    step3 = [d for d in draws if d["step"] == 3 and d["reason"] != "filtered"]
    assert step3 and all(d["reason"] == "guard: skipped (test spike)" for d in step3), step3  # linked, not trained
    assert all(rid.split("/")[0] in {d["group_id"] for d in draws} for rid in ids)
    assert all(rid.split("/")[1].isdigit() for rid in ids) and len(set(ids)) == len(ids)
    out = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "trace", "accounting", str(result.run_dir)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert f"drawn      {got.drawn}" in out.stdout and "exactly once: yes" in out.stdout
