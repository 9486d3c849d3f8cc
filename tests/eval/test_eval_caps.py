"""Evaluation runs what the model wrote under the run's execute caps (issue 36): the memory and
wall-time caps of `sandbox.max_memory_mb` / `max_wall_s` and each domain's budget seconds, the
same `DomainExecute` the training pipeline runs, so a held-out figure and a training figure of
one domain are measured under the same limits. The sandbox is faked at its seam (`sandbox.run`,
tested for real in tests/sandbox): only the limits each run asks for are read here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
from pipeline_testlib import ScriptedEngine  # noqa: E402

from posttrain import sandbox  # noqa: E402
from posttrain.configs import load_config  # noqa: E402
from posttrain.domains.registry import get  # noqa: E402
from posttrain.evaluate.run import RunEvaluator  # noqa: E402


class Metrics:
    def write(self, *args, **kwargs) -> None:
        pass


def test_a_heldout_program_runs_under_the_runs_execute_caps(tmp_path, monkeypatch):
    overrides = [
        "tasks.domains={code: {difficulty: 1}}",
        "sandbox.max_wall_s=0.5",
        "sandbox.max_memory_mb=64",
        "eval.tasks_per_domain=2",
        "eval.samples=0",
        "eval.above_tasks=0",
        "eval.transfer_domains={}",
    ]
    cfg = load_config(None, overrides)
    code = get("code")
    assert code.executes
    limits = []

    def run(req, *, domain=None):
        limits.append(req.limits)
        return sandbox.ExecResult("ok", exit_code=0)

    monkeypatch.setattr(sandbox, "run", run)
    engine = ScriptedEngine(lambda context, j: "```python\ndef f(x):\n    return x\n```")
    RunEvaluator(cfg, tmp_path, engine, Metrics(), {"code": 1}, log=lambda *_: None).full(0)
    assert limits, "no held-out program ran"
    assert all(lim.wall_s <= 0.5 and lim.cpu_s <= 0.5 and lim.memory_bytes <= 64 << 20 for lim in limits), limits
