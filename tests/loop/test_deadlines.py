"""Episode deadlines from `tasks.domains.X.max_seconds`, observed in `posttrain.loop.train`
(issue 26, item 5): a multi-turn episode whose own time (its environment steps, its share of
generation) passes the domain's seconds ends there, as truncated, and is scored; an execute step
whose runs together pass them ends with a "timeout" run, scored. Neither is masked as infra: the
model's turns and the code they ran made the episode long."""

from __future__ import annotations

import os
import time

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.trace import TraceStore
from posttrain.types import Score

STEP_S = 0.3
"""What one environment step costs: the slow code each action runs (a real wait)."""


def _register(monkeypatch, name, **attrs):
    from posttrain.domains import registry
    from posttrain.domains.base import ProceduralDomain

    gen = {"generate": lambda self, rng, difficulty: (f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=", "0")}
    dom = type(name, (ProceduralDomain,), {"name": name, "category": "test", **gen, **attrs})()
    monkeypatch.setitem(registry._REGISTRY, name, dom)
    return dom


class _Slow:
    """An environment whose every step takes STEP_S and never ends the episode."""

    def reset(self, task):
        return "go"

    def step(self, action):
        time.sleep(STEP_S)
        return "more", False

    def close(self):
        pass


class _Any:
    name, version = "any", "1"

    def score(self, task, episode):
        return Score(float(len(episode.completion) % 2))


def _train(tmp_path, base, domains, *extra):
    from posttrain.loop import train

    run = [*tiny(domains), "rollout.prompts_per_step=2", "rollout.group_size=2", "run.steps=1", "eval.samples=0"]
    run += ["monitor.report=false"]
    cfg = load_config(
        None, [*run, "eval.tasks_per_domain=2", *extra, f"model.path={base}", f"run.out_dir={tmp_path}", "run.name=d"]
    )
    result = train(cfg, log=lambda *_: None)
    return TraceStore(result.run_dir / "trace.db").recent(100)


def test_a_multi_turn_episode_past_its_seconds_ends_truncated_and_scored(tmp_path, micro_base, monkeypatch):
    dom = _register(monkeypatch, "slowtool", environment=lambda self: _Slow)
    dom.verifier = _Any()
    # 40 tokens a turn: the micro model's actions end on their own, so only the deadline ends an episode
    domains = "{slowtool: {difficulty: 1, max_turns: 20, max_seconds: 0.5, max_tokens: 40}}"
    rows = _train(tmp_path, micro_base, domains, "rollout.max_tokens=40")
    assert len(rows) == 4
    for r in rows:
        turns = len(r["turns"])
        assert r["reward"] is not None and r["error_kind"] is None, "a deadline is the model's: scored, not masked"
        assert r["finish_reason"] == "length" and r["timings"]["timed_out"] == 1.0
        # 0.5 s of 0.3 s steps: past it after the second step on a quiet machine; on a loaded one the
        # episode's share of generation alone can pass it after the first: either way long before 20
        assert 1 <= turns < 20, turns
        assert turns <= r["timings"]["episode_s"] / STEP_S + 1, (turns, r["timings"]["episode_s"])
        assert r["timings"]["episode_s"] >= 0.5


@pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")
def test_an_execute_step_past_its_seconds_ends_with_a_timeout_run_scored(tmp_path, micro_base, monkeypatch):
    from posttrain.sandbox import ExecRequest

    class Result:
        def __init__(self, statuses):
            self.statuses = statuses

        def summary(self):
            return {"statuses": self.statuses}

    class TwelveRuns(_Any):
        """Each completion's execute step: twelve programs of 0.3 s (the model's slow code), 3.6 s
        in all, against 2 s per step; each alone is well within it (the old per-run cap)."""

        def execute(self, task, completion, run):
            req = ExecRequest(files={"m.py": f"import time\ntime.sleep({STEP_S})\n"}, python_main="m.py")
            return Result([run(req).status for _ in range(12)])

        def score(self, task, episode):
            return Score(float(all(s == "ok" for s in episode.exec_result.statuses)))

    dom = _register(monkeypatch, "slowexec")
    dom.verifier = TwelveRuns()
    rows = _train(tmp_path, micro_base, "{slowexec: {difficulty: 1, max_seconds: 2.0}}")
    assert len(rows) == 4
    for r in rows:
        assert r["reward"] == 0.0 and r["error_kind"] is None, "slow code is the model's: scored 0, not masked"
        statuses = r["exec_result"]["statuses"]
        first = statuses.index("timeout")  # ValueError: the step ran past its seconds
        assert first >= 1 and set(statuses[:first]) == {"ok"} and set(statuses[first:]) == {"timeout"}, statuses
