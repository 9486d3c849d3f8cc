"""Writes examples/data/subtraction.jsonl: 400 questions with their answers, the kind of
file a user brings (one JSON object per line). Deterministic: same file every run.

    python examples/make_byo_data.py

The tiny embedded base model knows digits and the `a-b=` format from pretraining
(60% of its pretraining answers were deliberately wrong), so it gets some of these
right before training and RL can move it; a task in a format it never saw would
stay at 0.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "data" / "subtraction.jsonl"


def main() -> None:
    rng = random.Random(2026)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(0, 10)], 400)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as fh:
        for i, (a, b) in enumerate(pairs):
            row = {
                "id": f"q{i:03d}",
                "question": f"{a}-{b}=",
                "answer": str(a - b),
                "source": "examples/make_byo_data.py",
            }
            fh.write(json.dumps(row) + "\n")
    print(f"wrote {OUT} ({len(pairs)} rows)")


if __name__ == "__main__":
    main()
