"""`posttrain release RUN_DIR`: promote a training checkpoint into the model registry."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("release", help="promote a run's checkpoint into the model registry (stable or canary)")
    p.add_argument("run_dir", help="a run directory (its latest checkpoint) or a Hugging Face model directory")
    p.add_argument("--registry", default="registry", help="model registry directory (default ./registry)")
    p.add_argument("--step", type=int, help="release this checkpoint step instead of the latest")
    p.add_argument("--share", type=float, help="canary traffic share (default: the registry's, 0.1)")
    p.add_argument(
        "--fast-mode",
        choices=("lossless", "int8"),
        default="lossless",
        help="int8: allow the lossy int8 fast tier if the held-out quality gate passes",
    )
    p.add_argument("--gate-domains", default="add,sub,mul,reverse,sort", help="comma-separated gated domains")
    p.add_argument("--gate-tasks", type=int, default=50, help="held-out tasks per gated domain")
    p.add_argument(
        "--max-drop", type=float, default=0.01, help="largest allowed per-domain accuracy drop (0.01 = 1 point)"
    )
    p.set_defaults(func=run)


def pick_checkpoint(run_dir: str, step: int | None) -> Any:
    from pathlib import Path

    from posttrain.errors import ConfigError
    from posttrain.trainer.checkpoint import latest_checkpoint, list_checkpoints

    root = Path(run_dir)
    if (root / "config.json").is_file() and step is None:
        return root
    if step is not None:
        found = dict(list_checkpoints(root))
        if step not in found:
            raise ConfigError(
                f"--step {step}: no checkpoint of that step in {run_dir!r} (have {sorted(found) or 'none'})"
            )
        return found[step]
    ckpt = latest_checkpoint(root)
    if ckpt is None:
        raise ConfigError(
            f"run_dir {run_dir!r} has no checkpoints (expected checkpoints/step_N/) and is not a model directory"
        )
    return ckpt


def run(args: argparse.Namespace) -> int:
    import json

    from posttrain.errors import ConfigError
    from posttrain.serve.gate import quality_gate
    from posttrain.serve.registry import ModelRegistry

    if args.share is not None and not 0 <= args.share <= 1:
        raise ConfigError(f"--share must be in [0, 1], got {args.share}")
    ckpt = pick_checkpoint(args.run_dir, args.step)
    gate: dict[str, Any] = {"mode": "lossless", "passed": True, "note": "lossless: verified by the float weights"}
    mode = "lossless"
    if args.fast_mode == "int8":
        domains = tuple(d for d in args.gate_domains.split(",") if d)
        result = quality_gate(ckpt, "int8", domains, args.gate_tasks, args.max_drop)
        gate = result.as_dict()
        mode = "int8" if result.passed else "lossless"
    reg = ModelRegistry(args.registry)
    info = reg.add(ckpt, source=str(ckpt), fast_mode=mode, gate=gate)  # type: ignore[arg-type]
    state = reg.release(info, args.share)
    role = "stable" if state.stable == info.name else f"canary (share {state.canary_share})"
    print(
        json.dumps({"version": info.name, "role": role, "source": str(ckpt), "fast_mode": mode, "gate": gate}, indent=2)
    )
    return 0
