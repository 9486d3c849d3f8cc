"""`posttrain train` with `engine.speculation: suffix`: the acceptance figures in every step's
metrics row (that speculative rollouts are the plain ones is tests/engine/test_engine_spec.py's)."""

from __future__ import annotations

import json

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore


@pytest.mark.heavy  # a whole run: about 15 s on a busy 2-core machine
def test_a_speculative_run_logs_its_acceptance_every_step(tmp_path, micro_base):
    from posttrain.loop import train

    overrides = [*tiny(), f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=spec", "run.steps=2"]
    overrides += ["eval.tasks_per_domain=2", "rollout.max_tokens=12", "engine.speculation.kind=suffix"]
    run_dir = train(load_config(None, overrides), log=lambda *_: None).run_dir
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["engine_spec_proposed"] > 0 and "engine_spec_accepted_d1" in r for r in rows)
    assert all(1.0 <= r["engine_spec_accepted_len"] <= 9.0 and 0 <= r["engine_spec_acceptance"] <= 1 for r in rows)
    assert all(0 <= r["engine_spec_acceptance_d1"] <= 1 for r in rows)
    # per domain: the step's drafts of each domain, from the samples' own counts (Completion.spec)
    for r in rows:
        by_domain = r["spec_acceptance_by_domain"]
        assert (
            by_domain and set(by_domain) <= set(r["reward_by_domain"]) and all(0 <= v <= 1 for v in by_domain.values())
        )
        assert all(v >= 1.0 for v in r["spec_accepted_len_by_domain"].values())
    traced = [t["timings"] for t in TraceStore(run_dir / "trace.db").recent(10_000) if "spec_drafts" in t["timings"]]
    assert traced and all(0 <= t["spec_accepted"] <= t["spec_proposed"] for t in traced)  # each rollout's own, traced


@pytest.mark.heavy  # a whole run: about 15 s on a busy 2-core machine
def test_a_run_with_the_draft_head_drafts_with_it_and_checkpoints_it(tmp_path, micro_base):
    from posttrain.loop import train
    from posttrain.model.draft_head import META, WEIGHTS
    from posttrain.trainer.checkpoint import latest_checkpoint
    from posttrain.trainer.trainer import DRAFT_OPTIMIZER

    overrides = [*tiny(), f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=head", "run.steps=2"]
    overrides += ["eval.tasks_per_domain=2", "rollout.max_tokens=12", "engine.speculation.kind=head"]
    overrides += ["trainer.draft_head.enabled=true"]
    run_dir = train(load_config(None, overrides), log=lambda *_: None).run_dir
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["engine_spec_proposed"] > 0 and "engine_spec_accepted_d1" in r for r in rows)
    assert all(len(r["draft_acc"]) >= 1 and all(0 <= a <= 1 for a in r["draft_acc"]) for r in rows if r["n_sequences"])
    # the push probe, on by default with a head, after each step's push (the micro base's greedy answers end
    # at their first token, so it drafts nothing here: tests/engine/test_engine_spec_head.py measures it)
    assert all(r["engine_probe_spec_s"] > 0 and r["engine_probe_spec_drafting"] >= 0 for r in rows)
    told = TraceStore(run_dir / "trace.db").events("spec_probe")  # and each probe is a trace event
    assert [json.loads(e["data"])["push"] for e in told] == [1.0, 2.0]  # the pushes after steps 1 and 2
    assert all(json.loads(e["data"])["stopped"] == 0.0 for e in told)
    ckpt = latest_checkpoint(run_dir)
    assert all((ckpt / name).is_file() for name in (WEIGHTS, META, DRAFT_OPTIMIZER))


@pytest.mark.heavy  # two whole runs: about 30 s on a busy 2-core machine
def test_with_auto_off_off_a_run_with_the_head_repeats_exactly(tmp_path, micro_base):
    """docs/engines.md "Auto-off": with the governor off no choice follows the clock, so the same
    seed gives the same run: every metrics row equal but its timings, the same held-out table."""
    import re

    from posttrain.loop import train

    def run(name: str) -> tuple[list[dict], dict]:
        overrides = [*tiny(), f"model.path={micro_base}", f"run.out_dir={tmp_path}", f"run.name={name}"]
        overrides += ["run.steps=3", "eval.tasks_per_domain=4", "rollout.max_tokens=12"]
        overrides += ["engine.speculation.kind=head", "trainer.draft_head.enabled=true"]
        overrides += ["engine.speculation.auto_off=false"]
        run_dir = train(load_config(None, overrides), log=lambda *_: None).run_dir
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return rows, json.loads((run_dir / "eval.json").read_text())

    timing = re.compile(r"(_s$|_ms$|time|wall|rss|cpu|per_s|seconds|idle|share|lag|wait|latency)")
    (a, eval_a), (b, eval_b) = run("one"), run("two")
    assert len(a) == len(b) and any(r.get("engine_spec_proposed") for r in a)  # it drafted
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not timing.search(k)} == {
            k: v for k, v in y.items() if not timing.search(k)
        }
    assert eval_a["after"]["mean_accuracy"] == eval_b["after"]["mean_accuracy"]


def test_a_run_on_the_vllm_engine_with_speculation_is_refused_before_any_work(tmp_path, micro_base):
    """Rollouts sample, and vLLM reports log-probs that are not the policy's for tokens it drafts
    when sampling: `posttrain train` says so before it loads the model or starts a server."""
    from posttrain.errors import ConfigError
    from posttrain.loop import train

    overrides = [*tiny(), f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=vspec", "run.steps=1"]
    overrides += ["engine.kind=vllm", "engine.speculation.kind=suffix"]
    with pytest.raises(ConfigError, match="vLLM 0.32 reports log-probs"):
        train(load_config(None, overrides), log=lambda *_: None)
    assert not list(tmp_path.rglob("server.log"))  # no vLLM server was started
