"""Helpers of the bring-your-own tests: small task files written on the spot."""

from __future__ import annotations

import json
import random
from pathlib import Path

TINY = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_tokens=6",
    "eval.tasks_per_domain=6",
    "eval.max_tokens=6",
    "run.threads=1",
    "run.progress=false",
    "run.checkpoint_every=0",
    "monitor.report=false",
]


def rows(n: int = 120, seed: int = 0) -> list[dict]:
    """Subtraction questions (the embedded model's `a-b=` form), with a difficulty and an id."""
    rng = random.Random(seed)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10)], n)
    return [{"id": f"r{i}", "q": f"{a}-{b}=", "a": str(a - b), "lvl": 1 + (b >= 5)} for i, (a, b) in enumerate(pairs)]


def write_jsonl(path: Path, data: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def train_cfg(tmp_path: Path, base: str, name: str, domains: str, *extra: str):
    from posttrain.configs import load_config

    return load_config(
        None,
        [
            *TINY,
            f"model.path={base}",
            f"run.out_dir={tmp_path}",
            f"run.name={name}",
            f"tasks.domains={domains}",
            *extra,
        ],
    )
