"""tasks.branch in the loop: derived tasks from the micro model's own failed first turns are drawn and
trained as groups of their own, reported apart, and a resume from a checkpoint whose queue is not
empty continues exactly as the uninterrupted run."""

from __future__ import annotations

import json

import pytest
import torch
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.domains.base import Budget, ProceduralDomain
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore
from posttrain.trainer.checkpoint import latest_checkpoint
from posttrain.types import Score, StepResult


class _OddEnv:
    """Each action is judged by its length: odd passes (and ends the episode), even is a failure."""

    def reset(self, task):
        return ""

    def step(self, action):
        odd = len(action) % 2
        return StepResult("odd: done" if odd else "even: answer again", bool(odd), {"process": float(odd)})

    def close(self):
        pass


class _OddVerifier:
    name, version = "odd_last", "1"

    def score(self, task, episode):
        odd = len(episode.completion) % 2
        return Score(float(odd), passed=bool(odd), reason="" if odd else "even")


class _OddLoop(ProceduralDomain):
    name, category, budget = "odd_loop", "test", Budget(turns=2, tokens=6)
    verifier = _OddVerifier()

    def generate(self, rng, difficulty):
        return f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=", "0"

    def environment(self):
        return _OddEnv

    def branch_at(self, task, turns):
        return int(len(turns) > 1 and turns[0].parts.get("process", 0.0) < 1.0)


@pytest.fixture
def odd_loop(monkeypatch):
    from posttrain.domains import registry

    monkeypatch.setitem(registry._REGISTRY, "odd_loop", _OddLoop())
    return "{odd_loop: {difficulty: 1}}"


def _cfg(tmp_path, base, name, domains, *extra):
    over = [*tiny(domains), "tasks.branch={share: 0.5}", "run.checkpoint_every=2", *extra]
    return load_config(None, [*over, f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}"])


@pytest.mark.heavy  # trains the run twice over (about 15-35 s)
def test_derived_groups_train_and_resume_exactly(tmp_path, micro_base, odd_loop):
    from safetensors.torch import load_file

    from posttrain.loop import train

    quiet = {"log": lambda *_: None}
    full = train(_cfg(tmp_path, micro_base, "full", odd_loop, "run.steps=4"), **quiet)
    part = train(_cfg(tmp_path, micro_base, "part", odd_loop, "run.steps=2"), **quiet)
    # the checkpoint the resume starts from holds derived tasks still queued
    state = json.loads((latest_checkpoint(part.run_dir) / "loop_state.json").read_text())
    assert state["pool"]["branch"]["queue"], "the queue was empty: the resume would not test it"
    resumed = train(_cfg(tmp_path, micro_base, "part", odd_loop, "run.steps=4"), resume=part.run_dir, **quiet)
    rows = TraceStore(full.run_dir / "trace.db").recent(1000)
    derived = [r for r in rows if "+b" in r["task_id"]]
    assert derived and all(int(r["group_id"].split(":")[0]) > 1 for r in derived)  # drawn after a failure was seen
    # the derived prompt holds the model's own first turn and its observation
    assert all("even: answer again" in r["prompt"] for r in derived)
    train_rows = read_metrics(full.run_dir / "metrics.jsonl", "train")
    assert any(m.get("groups_branch") for m in train_rows) and any("reward_by_domain_branch" in m for m in train_rows)
    assert all(m.get("branch_derived", 0) >= 1 for m in train_rows)
    # exact resume: the same tasks, samples and weights
    other = TraceStore(resumed.run_dir / "trace.db").recent(1000)
    pairs = lambda rs: sorted((r["task_id"], r["completion"]) for r in rs)  # noqa: E731
    assert pairs(rows) == pairs(other)
    a = load_file(str(latest_checkpoint(full.run_dir) / "model.safetensors"))
    b = load_file(str(latest_checkpoint(resumed.run_dir) / "model.safetensors"))
    start = load_file(f"{micro_base}/model.safetensors")
    assert any((a[k] != start[k]).any() for k in a), "the run never trained: the comparison would be vacuous"
    # a later turn's generation batch holds the episodes waiting when the engine is called (timing), and
    # the engine's log-probs depend on the batch's shape in the last float32 bits (docs/pipeline.md "What is
    # exact"): the weights agree to rounding, not bit for bit (measured: 7e-9 to 1.2e-6 under load)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-5), (k, float((a[k] - b[k]).abs().max()))


def test_async_mode_draws_and_trains_derived_groups(tmp_path, micro_base, odd_loop):
    """pipeline.mode async: the stream draws derived tasks through the same pool (`take`'s draw) and
    the loop trains them; every draw gets its fate once (the ledger raises otherwise)."""
    from posttrain.loop import train

    extra = ("run.steps=4", "pipeline.mode=async", "pipeline.max_staleness=1")
    cfg = _cfg(tmp_path, micro_base, "async", odd_loop, *extra)
    run = train(cfg, log=lambda *_: None)
    rows = TraceStore(run.run_dir / "trace.db").recent(1000)
    assert any("+b" in r["task_id"] and r["train_step"] is not None for r in rows)
    assert any(m.get("groups_branch") for m in read_metrics(run.run_dir / "metrics.jsonl", "train"))


def test_train_from_turn_two_trains_only_revisions(tmp_path, micro_base, odd_loop):
    """tasks.domains.X.train_from_turn 2 through the loop (a smoke; the masks themselves are tested in
    tests/envs/test_driver.py): episodes passed at turn 1 carry no loss tokens of their own and are
    dropped from the batch without an error, the rest train on their revisions, derived tasks
    (their first action is a revision) train whole; the run trains and ends."""
    from safetensors.torch import load_file

    from posttrain.loop import train

    domains = "{odd_loop: {difficulty: 1, train_from_turn: 2}}"
    run = train(_cfg(tmp_path, micro_base, "rev", domains, "run.steps=2"), log=lambda *_: None)
    rows = TraceStore(run.run_dir / "trace.db").recent(1000)
    assert any(r["train_step"] is not None for r in rows)
    a = load_file(str(latest_checkpoint(run.run_dir) / "model.safetensors"))
    start = load_file(f"{micro_base}/model.safetensors")
    assert any((a[k] != start[k]).any() for k in a), "no revision trained"
