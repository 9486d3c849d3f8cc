"""`posttrain train configs/vllm.yaml` (async, its default; set here explicitly) against a real vLLM server
(the `vllm` lane), a short run without a server kill (test_engine_vllm_train.py runs the long one).

Continuous rollouts (docs/pipeline.md "The modes") through the vllm engine: generation runs on
while the trainer trains, each push waits for the requests in flight, reloads, resets the prefix
cache and is verified (engine/probe.py). One short run for the module on the lane's 800-step base
(tests/engine/test_engine_vllm_train.py builds the same one into the model cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.engine.vllm import default_python

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not default_python().exists(), reason="no .venv-vllm (make vllm-venv)"),
]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "vllm.yaml"
STEPS = 8
K = 1


@pytest.fixture(scope="module")
def base_dir(vllm_lane_base) -> Path:
    return vllm_lane_base


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, base_dir) -> Path:
    out = tmp_path_factory.mktemp("async")
    exe = Path(sys.executable).with_name("posttrain")
    cmd = [str(exe), "train", str(CONFIG), f"model.path={base_dir}", f"run.steps={STEPS}"]
    cmd += ["pipeline.mode=async", f"pipeline.max_staleness={K}", "eval.tasks_per_domain=10", "eval.every_steps=0"]
    cmd += ["eval.samples=0", "eval.above_tasks=0", "eval.exposure=false", "eval.contamination=false"]
    cmd += ["run.checkpoint_every=0", "monitor.report=false", "run.progress=false", f"run.out_dir={out}"]
    cmd += ["run.name=async", "engine.timeout_s=60"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return out / "async"


def _train_rows(run: Path) -> list[dict]:
    from posttrain.metrics_log import read_metrics

    return read_metrics(run / "metrics.jsonl", "train")


def test_async_run_on_vllm_keeps_the_staleness_bound_and_verifies_every_push(run_dir):
    rows = _train_rows(run_dir)
    assert len(rows) == STEPS
    assert all(r["pipe_staleness_max"] <= K for r in rows)
    assert any(r["pipe_staleness_max"] == K for r in rows)  # generation did run across weight updates
    assert all(r["sync_verified"] for r in rows if r["outcome"] == "applied")
    assert [r["engine_version"] for r in rows] == sorted(r["engine_version"] for r in rows)
    assert rows[-1]["engine_version"] >= STEPS - 2
    assert all(r["infra_errors"] == 0 for r in rows)


def test_async_run_on_vllm_accounts_for_every_draw(run_dir):
    exe = Path(sys.executable).with_name("posttrain")
    done = subprocess.run([str(exe), "trace", "accounting", str(run_dir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exactly once: yes" in done.stdout  # exit 0: nothing lost, nothing trained twice


def test_async_run_on_vllm_trained_the_weights_it_pushed(run_dir, base_dir):
    import torch
    from safetensors.torch import load_file

    from posttrain.trainer.checkpoint import latest_checkpoint

    base = load_file(str(base_dir / "model.safetensors"))
    final = load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))
    pushed = load_file(str(sorted((run_dir / "weights").glob("v*"))[-1] / "model.safetensors"))
    assert any(not torch.equal(base[k], final[k]) for k in base)
    assert all(torch.equal(final[k], pushed[k]) for k in final)
