"""Rollouts and trainer rows meet by rollout id, never by position: the trace holds the
advantage the loss used (scored empty completions too), a reordered batch changes nothing,
and checkpoints are named by the loop step."""

from __future__ import annotations

import json

import pytest
from test_loop_e2e import _cfg, _params

from posttrain.trace import TraceStore
from posttrain.types import Completion, Message, SamplingParams, Score, Task, TaskMeta


def _rollout(gid: str, i: int, reward: float | None, tokens: tuple[int, ...], logp: tuple[float, ...]):
    from posttrain.rollout import Rollout, rollout_id

    task = Task(f"add-{gid}", "add", (Message("user", "1+1="),), "2", TaskMeta("train", 1, "test", "v1"))
    completion = Completion((5, 6, 7), tokens, "2" if tokens else "", logp, "stop")
    if reward is None:
        return Rollout(task, completion, gid, None, "verifier", "RuntimeError: verifier crashed", id=rollout_id(gid, i))
    return Rollout(task, completion, gid, Score(reward), id=rollout_id(gid, i))


def test_trace_advantage_is_the_one_the_loss_used_for_a_scored_empty_completion(tmp_path, micro_base):
    import torch

    from posttrain.configs.trainer import TrainerConfig
    from posttrain.domains.registry import verifier_label
    from posttrain.model.arch import load_model
    from posttrain.trace.rows import rollout_record
    from posttrain.trainer.batch import batch_of
    from posttrain.trainer.trainer import Trainer

    trainer = Trainer(load_model(micro_base)[0], TrainerConfig(lr=1e-4))
    seen, step = {}, trainer._micro_step  # rollout id -> the advantage the loss was given

    def spy(rows, advantage_b, totals, weight=1.0):
        seen.update(zip((r.rollout_id for r in rows), advantage_b.tolist()))
        return step(rows, advantage_b, totals, weight)

    trainer._micro_step = spy
    group = [
        _rollout("1:0", 0, 1.0, (8, 9), (-2.0, -2.0)),
        _rollout("1:0", 1, 0.0, (10, 11), (-2.0, -2.0)),
        _rollout("1:0", 2, 0.0, (), ()),  # a scored empty completion: in the baseline, in no loss
        _rollout("1:0", 3, None, (8,), (-2.0,)),  # an infra error: neither
    ]
    trace = TraceStore(tmp_path / "trace.db")
    params = SamplingParams(max_tokens=4, temperature=1.0, n=4)
    trace.write_rollouts([rollout_record(r, params, verifier_label) for r in group])
    stats = trainer.step(batch_of([group], 1.0))
    trace.mark_consumed(1, stats.rollouts)
    got = {r.id: trace.get(r.id) for r in group}
    good, bad, empty, infra = (r.id for r in group)
    assert [got[r.id]["id"] for r in group] == ["1:0/0", "1:0/1", "1:0/2", "1:0/3"]  # the ids they were born with
    assert seen.keys() == {good, bad}
    assert got[good]["advantage"] == seen[good] and got[bad]["advantage"] == seen[bad]
    # the loss's advantages count the empty completion (group rewards 1, 0, 0), not only the rows with tokens
    want = trainer.loss.advantages(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), torch.zeros(3, dtype=torch.long))
    assert [seen[good], seen[bad], got[empty]["advantage"]] == want.to(torch.float32).tolist()
    alone = trainer.loss.advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.zeros(2, dtype=torch.long))
    assert seen[good] != pytest.approx(float(alone[0]), abs=1e-3)
    assert got[empty]["advantage"] == stats.rollouts[empty].advantage < 0
    assert got[empty]["train_step"] == 1 and got[empty]["ratio"] is None
    assert got[infra]["train_step"] is None and got[infra]["advantage"] is None


@pytest.mark.heavy  # trains the run twice over (about 15-30 s)
def test_fixed_seed_run_links_by_id_and_a_reordered_batch_changes_nothing(
    tmp_path, micro_base, monkeypatch, parity_domain
):
    import posttrain.loop as loop
    from posttrain.loop import train
    from posttrain.trainer.trainer import Trainer

    recorded: dict[str, object] = {}
    step = Trainer.step

    def spy(self, batch):
        stats = step(self, batch)
        recorded.update(stats.rollouts)
        return stats

    monkeypatch.setattr(Trainer, "step", spy)
    plain = train(_cfg(tmp_path, micro_base, "plain", "run.steps=3", parity_domain), log=lambda *_: None)
    rows = TraceStore(plain.run_dir / "trace.db").recent(1000)
    consumed = [r for r in rows if r["train_step"] is not None]
    assert recorded and {r["id"] for r in consumed} == set(recorded)
    for r in consumed:  # the trace holds the trainer's figures, by rollout id
        link = recorded[r["id"]]
        assert (r["advantage"], r["ratio"], r["clipped"]) == (link.advantage, link.ratio, link.clipped)

    batch = loop.batch_of  # the same groups, handed to the trainer in the reverse order, each reversed
    monkeypatch.setattr(loop, "batch_of", lambda gs, t, *more: batch([g[::-1] for g in gs[::-1]], t, *more))
    reordered = train(_cfg(tmp_path, micro_base, "reordered", "run.steps=3", parity_domain), log=lambda *_: None)
    a, b = _params(plain.run_dir), _params(reordered.run_dir)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-6, k

    def links(run_dir):
        out = TraceStore(run_dir / "trace.db").recent(1000)
        return sorted(
            (
                r["group_id"],
                r["completion"],
                r["reward"],
                r["train_step"],
                r["ratio"] is None,
                r["advantage"] or 0.0,
                r["ratio"] or 0.0,
            )
            for r in out
        )

    la, lb = links(plain.run_dir), links(reordered.run_dir)
    assert [x[:5] for x in la] == [x[:5] for x in lb]  # same rollouts, rewards, consuming steps, loss rows
    assert [x[5] for x in lb] == pytest.approx([x[5] for x in la], abs=1e-6)  # advantages
    assert [x[6] for x in lb] == pytest.approx([x[6] for x in la], abs=1e-5)  # ratios
    assert any(x[4] is False for x in la) and any(x[5] != 0 for x in la)  # the run trained


@pytest.mark.heavy
def test_checkpoints_are_named_by_loop_step_and_resume_takes_the_latest(
    tmp_path, micro_base, monkeypatch, parity_domain
):
    import posttrain.loop as loop
    import posttrain.pipeline.draws as draws
    from posttrain.loop import train
    from posttrain.rollout import informative

    # step 2 keeps no group and (as when every rollout of a step is an infra error) gives the trainer
    # no batch, so the trainer is not called: its count falls behind the loop's
    looks = lambda g: not g[0].group_id.startswith("2:") and informative(g)  # noqa: E731
    monkeypatch.setattr(loop, "informative", looks)
    monkeypatch.setattr(draws, "informative", looks)  # the ledger's fates (pipeline/draws.py)
    batch = loop.batch_of
    monkeypatch.setattr(loop, "batch_of", lambda groups, *a: batch(groups, *a) if groups else None)
    extra = ("run.steps=4", "run.checkpoint_every=1", "trainer.keep_checkpoints=10", parity_domain)
    first = train(_cfg(tmp_path, micro_base, "ckpt", *extra), log=lambda *_: None)
    root = first.run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [f"step_{s:08d}" for s in (1, 2, 3, 4)]
    states = {s: json.loads((root / f"step_{s:08d}" / "loop_state.json").read_text()) for s in (1, 2, 3, 4)}
    assert all(json.loads((root / f"step_{s:08d}" / "meta.json").read_text())["step"] == s for s in states)
    assert [states[s]["step"] for s in (1, 2, 3, 4)] == [1, 2, 3, 4]
    updates = [states[s]["trainer"]["steps"] for s in (1, 2, 3, 4)]
    assert updates[0] == 1 and updates[1] == 1 and updates[3] == 3  # no update at step 2: the counts differ
    cfg_path = first.run_dir / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("steps: 4", "steps: 5"))
    said: list[str] = []
    resumed = train(None, resume=first.run_dir, log=said.append)
    assert any(s.startswith("resumed") and s.endswith("at step 4") for s in said)
    assert resumed.steps == 5 and (root / "step_00000005").is_dir()


@pytest.mark.heavy
def test_a_step_whose_groups_are_all_filtered_coasts_and_resumes_exactly(
    tmp_path, micro_base, monkeypatch, parity_domain
):
    """With trainer.coast (the default), a loop step that keeps no group still reaches the
    trainer (a batch of no rows, only counts) and takes Adam's zero-gradient step: the weights
    move between the checkpoints around it, the step is logged as coasted, and a run resumed
    right after it ends with the uninterrupted run's weights."""
    import posttrain.loop as loop
    import posttrain.pipeline.draws as draws
    from posttrain.loop import train
    from posttrain.rollout import informative

    looks = lambda g: not g[0].group_id.startswith("3:") and informative(g)  # noqa: E731
    monkeypatch.setattr(loop, "informative", looks)
    monkeypatch.setattr(draws, "informative", looks)  # the ledger's fates (pipeline/draws.py)
    extra = ("run.checkpoint_every=1", "trainer.keep_checkpoints=10", parity_domain)
    full = train(_cfg(tmp_path, micro_base, "full", "run.steps=4", *extra), log=lambda *_: None)
    rows = [json.loads(line) for line in (full.run_dir / "metrics.jsonl").read_text().splitlines()]
    outcome = {r["step"]: r.get("outcome") for r in rows if r.get("kind") == "train"}
    assert outcome[3] == "coasted" and outcome[2] == "applied"
    root = full.run_dir / "checkpoints"
    state = json.loads((root / "step_00000003" / "loop_state.json").read_text())
    assert state["trainer"]["steps"] == 3
    from safetensors.torch import load_file

    w2, w3 = (load_file(str(root / f"step_0000000{s}" / "model.safetensors")) for s in (2, 3))
    assert any((w2[k] != w3[k]).any() for k in w2), "the coasted step did not move the weights"
    part = train(_cfg(tmp_path, micro_base, "part", "run.steps=3", *extra), log=lambda *_: None)
    cfg_path = part.run_dir / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("steps: 3", "steps: 4"))
    resumed = train(None, resume=part.run_dir, log=lambda *_: None)
    a, b = _params(full.run_dir), _params(resumed.run_dir)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
