"""What the weight-sync probe costs and how its tolerance compares with what one optimizer step changes,
on the demo (configs/default.yaml, the embedded tiny base, the hf engine, engine.verify_sync on).

The loop runs N steps with a checkpoint after every step (a small held-out set, no periodic
evaluation); then for each pair of consecutive checkpoints the probe (engine/probe.py: its prompt, its
seed, its tokens as the engine at the earlier weights generates them) is scored by the trainer under
both, and the largest |change| of a probe token's log-prob is what that optimizer step moved. Printed:
the probe's wall time per push against the loop step's, the engine-trainer gap it measured, and the
per-step change against the float32 tolerance.

    .venv/bin/python bench/sync_probe.py --steps 12
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()

    import torch

    from posttrain.configs import load_config
    from posttrain.configs.engine import EngineConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.engine.probe import PROBE_SEED, PROBE_TEMPERATURE, SyncProbe
    from posttrain.loop import train
    from posttrain.metrics_log import read_metrics
    from posttrain.model.arch import load_model
    from posttrain.trainer.checkpoint import checkpoint_path
    from posttrain.trainer.trainer import Trainer
    from posttrain.types import GenerationRequest, SamplingParams

    out = Path(tempfile.mkdtemp(prefix="sync-probe-"))
    cfg = load_config(
        Path(__file__).parents[1] / "configs" / "default.yaml",
        [
            f"run.steps={args.steps}",
            "run.checkpoint_every=1",
            "trainer.keep_checkpoints=1000",
            "eval.tasks_per_domain=8",
            "eval.every_steps=0",
            "eval.samples=0",
            "monitor.report=false",
            "run.progress=false",
            "engine.verify_sync=on",
            f"run.out_dir={out}",
            "run.name=probe",
        ],
    )
    run = train(cfg, log=lambda *_: None).run_dir
    rows = read_metrics(run / "metrics.jsonl", "train")
    probe_s = [r["sync_probe_s"] for r in rows if "sync_probe_s" in r]
    gaps = [r["sync_probe_max_diff"] for r in rows if "sync_probe_max_diff" in r]
    step_s = [r["rollout_s"] + r.get("seconds", 0.0) for r in rows]
    mismatch = [r["mismatch_abs_max"] for r in rows if r.get("n_tokens")]

    torch.set_num_threads(1)
    changes, means = [], []
    for step in range(1, args.steps):
        before, tok = load_model(checkpoint_path(run, step), device="cpu")
        after, _ = load_model(checkpoint_path(run, step + 1), device="cpu")
        if all(torch.equal(a, b) for a, b in zip(before.parameters(), after.parameters())):
            continue  # a step without an update (no signal, skipped)
        engine = HFEngine(before, tok, seed=0)
        probe = SyncProbe(EngineConfig(verify_sync="on"), engine, Trainer(before, cfg.trainer))
        result = probe.check(step)
        prompt = probe.prompt()
        params = SamplingParams(max_tokens=cfg.engine.verify_tokens, temperature=PROBE_TEMPERATURE, seed=PROBE_SEED)
        comp = engine.generate([GenerationRequest(prompt, params)])[0][0]  # the probe's own tokens
        old = Trainer(before, cfg.trainer).sequence_logprobs(prompt, comp.token_ids, PROBE_TEMPERATURE)
        new = Trainer(after, cfg.trainer).sequence_logprobs(prompt, comp.token_ids, PROBE_TEMPERATURE)
        diffs = [abs(a - b) for a, b in zip(old, new)]
        changes.append(max(diffs))
        means.append(sum(diffs) / len(diffs))
        assert result.ok

    tol = EngineConfig().verify_tolerance or 1e-4
    print(f"run: {run} ({args.steps} demo steps, prompt {len(prompt)} tokens, {cfg.engine.verify_tokens} generated)")
    ms = [s * 1e3 for s in probe_s]
    print(f"probe wall time per push: median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
    print(f"loop step (rollout + train) median {statistics.median(step_s) * 1e3:.0f} ms")
    print(f"engine-trainer gap the probe saw: max {max(gaps):.2e} (tolerance {tol:g})")
    print(f"train-inference mismatch (max |dlogp| over trained tokens): max {max(mismatch):.2e}")
    print(
        f"one optimizer step moves a probe token's log-prob by max |d| median {statistics.median(changes):.3g} "
        f"(min {min(changes):.3g}, over {len(changes)} steps; mean |d| median {statistics.median(means):.3g}): "
        f"the smallest is {min(changes) / tol:.0f}x the float32 tolerance"
    )


if __name__ == "__main__":
    main()
