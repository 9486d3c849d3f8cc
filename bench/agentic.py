"""The agentic loop's learning figure: `posttrain train configs/agentic.yaml` per seed, evaluated
as episodes. Prints, per seed, the held-out pass rate at the last turn before and after, pass@turn-k
before and after, wall and CPU seconds of the run (RL and all its evaluations) and its peak RSS,
then the issue's criteria: last-turn pass rate up by >= 15 points, pass@turn-2 above pass@turn-1
after training, the run under 10 minutes.

    .venv/bin/python bench/agentic.py --seeds 0 1 2 [overrides ...]

The base (configs/agentic.yaml's base section, one for every seed) is built first if it is not
cached, and timed apart. Each run is a `posttrain train` subprocess under /usr/bin/time -v.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "agentic.yaml"
MIN_GAIN, MAX_WALL_S = 0.15, 600.0


def timed(cmd: list[str]) -> dict:
    """Run `cmd` under /usr/bin/time -v: wall, CPU (user+sys) seconds and peak RSS (MiB)."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    field = lambda name: float(re.search(rf"{name}: ([\d.]+)", proc.stderr).group(1))  # noqa: E731
    cpu = field(r"User time \(seconds\)") + field(r"System time \(seconds\)")
    return {
        "stdout": proc.stdout,
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_mib": field(r"Maximum resident set size \(kbytes\)") / 1024,
    }


def build_base(overrides: list[str], config: Path = CONFIG) -> dict:
    code = (
        "import sys; from posttrain.configs import load_config; from posttrain.model.pretrain import default_dir, "
        "ensure_base; cfg = load_config(sys.argv[1], sys.argv[2:]); cached = (default_dir(cfg.base) / "
        "'config.json').is_file(); ensure_base(cfg.base, progress=False); print('CACHED' if cached else 'BUILT')"
    )
    return timed([sys.executable, "-c", code, str(config), *overrides])


def turns(result: dict) -> dict[int, float]:
    return {int(k): v[0] for k, v in result["domains"]["lookup"]["pass_at_turn"].items()}


def train_seed(config: Path, seed: int, overrides: list[str]) -> tuple[dict, dict]:
    """`posttrain train CONFIG run.seed=SEED` in a temporary run directory under /usr/bin/time -v:
    its timing (`timed`) and its eval.json."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            str(ROOT / ".venv/bin/posttrain"),
            "train",
            str(config),
            f"run.seed={seed}",
            f"run.out_dir={out}",
            f"run.name=seed{seed}",
            "run.progress=false",
            *overrides,
        ]
        t = timed(cmd)
        return t, json.loads((Path(out) / f"seed{seed}" / "eval.json").read_text())


def one_seed(seed: int, overrides: list[str]) -> dict:
    t, table = train_seed(CONFIG, seed, overrides)
    print(f"seed {seed}: {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} CPU-s, eval {table['eval_seconds']}", flush=True)
    before, after = turns(table["before"]), turns(table["after"])
    last = max(before)
    t.pop("stdout")
    return {
        "seed": seed,
        **t,
        "before": before,
        "after": after,
        "gain": after[last] - before[last],
        "ci": table["deltas"]["domains"]["lookup"]["ci"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    base = build_base(args.overrides)
    status = "cached, this is only its load" if "CACHED" in base["stdout"] else "built"
    print(
        f"base ({status}): {base['wall_s']:.0f} s wall, {base['cpu_s']:.0f} CPU-s, peak RSS {base['rss_mib']:.0f} MiB"
    )
    rows = [one_seed(s, args.overrides) for s in args.seeds]
    ks = sorted(rows[0]["before"])
    head = "".join(f"  turn-{k} b->a" for k in ks)
    print(f"{'seed':>4}{head}  last-turn gain [paired 95% CI]  wall s  CPU s  RSS MiB")
    for r in rows:
        cells = "".join(f"  {r['before'][k]:.2f}->{r['after'][k]:.2f}" for k in ks)
        print(
            f"{r['seed']:>4}{cells}  {r['gain']:+.3f} [{r['ci'][0]:+.2f},{r['ci'][1]:+.2f}]"
            f"{r['wall_s']:>9.0f}{r['cpu_s']:>7.0f}{r['rss_mib']:>9.0f}"
        )
    gains = sorted(r["gain"] for r in rows)
    print(
        f"last-turn gain over {len(rows)} seeds: min {gains[0]:+.3f}, median {gains[len(gains) // 2]:+.3f}, "
        f"max {gains[-1]:+.3f}"
    )
    for r in rows:
        ok = [r["gain"] >= MIN_GAIN - 1e-9, r["after"][2] > r["after"][1], r["wall_s"] < MAX_WALL_S]
        print(
            f"seed {r['seed']}: gain >= {MIN_GAIN:+.2f} {'yes' if ok[0] else 'NO'}; pass@turn-2 > pass@turn-1 "
            f"after {'yes' if ok[1] else 'NO'}; under {MAX_WALL_S:.0f} s {'yes' if ok[2] else 'NO'}"
        )


if __name__ == "__main__":
    main()
