"""A finished run's empirical costs, read from its trace and metrics log: what the planner replays.

Invariant: every number here is read from the run's own files, never assumed. The pipeline
times a group's stages once for the whole group (its rollouts carry the same `generate_s`,
`execute_s`, `verify_s`), so a group is one sample: its domain, completion tokens, and
seconds per stage. A generation call is the set of groups whose rollouts share one
`generate_s` at one weight version (one engine call batches them): the engine's measured rate
is the calls' completion tokens over their seconds. The train side comes from metrics.jsonl's
train rows: the optimiser step's seconds and tokens, and the rest of each step (its wall time
less its wait for groups and its optimiser step: the weight push, trace and metrics writes).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.configs import read_yaml
from posttrain.configs.pipeline import PipelineConfig
from posttrain.errors import ConfigError
from posttrain.metrics_log import read_metrics
from posttrain.trace import readable


@dataclass(frozen=True)
class GroupSample:
    """One finished group of the run: what the simulator replays."""

    domain: str
    tokens: int
    generate_s: float
    execute_s: float
    verify_s: float
    program_s: float = 0.0
    """One of the group's programs: execute_s x c / group size, c = min(execute workers, sandbox
    slots, group size), the most of its programs the run could run at once (the programs of
    one group are taken to last alike; time spent waiting for another group's programs is
    counted in)."""


@dataclass(frozen=True)
class RunShape:
    """The loop shape of the run (its config.yaml)."""

    mode: str
    max_staleness: int
    prompts_per_step: int
    group_size: int
    queue_size: int
    max_inflight: int
    generate_batch: int
    workers: tuple[int, int, int]
    sandbox_slots: int


@dataclass
class Profile:
    """A run's empirical distributions (per domain) and costs."""

    groups: list[GroupSample]
    shape: RunShape
    tokens_per_s: float
    """The engine's measured completion tokens per second over its generation calls."""
    train_s_per_token: float
    """Optimiser-step seconds per trained token."""
    train_tokens: list[int]
    """Trained tokens of each step."""
    overhead_s: list[float]
    """The rest of each step: wall less waiting for groups less the optimiser step."""
    calls: int = 0
    by_domain: dict[str, list[GroupSample]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by: dict[str, list[GroupSample]] = defaultdict(list)
        for g in self.groups:
            by[g.domain].append(g)
        self.by_domain = dict(by)

    def summary(self) -> dict[str, Any]:
        """Per-domain means and shares (for the table and the JSON)."""

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        out: dict[str, Any] = {}
        for name, gs in sorted(self.by_domain.items()):
            out[name] = {
                "groups": len(gs),
                "share": len(gs) / len(self.groups),
                "tokens_mean": mean([g.tokens for g in gs]),
                "execute_s_mean": mean([g.execute_s for g in gs]),
                "execute_s_max": max(g.execute_s for g in gs),
                "verify_s_mean": mean([g.verify_s for g in gs]),
            }
        return out


def load_profile(run_dir: str | Path) -> Profile:
    """The profile of the finished run in `run_dir` (trace.db, metrics.jsonl, config.yaml)."""
    run = Path(run_dir)
    for name in ("trace.db", "metrics.jsonl", "config.yaml"):
        if not (run / name).is_file():
            raise ConfigError(f"{run} is not a finished run: it has no {name}")
    groups, calls = read_groups(run / "trace.db")
    if not groups:
        raise ConfigError(f"{run}/trace.db holds no finished rollouts to plan from")
    shape = read_shape(run / "config.yaml")
    c = min(shape.workers[1], shape.sandbox_slots, shape.group_size)
    groups = [dataclasses.replace(g, program_s=g.execute_s * c / shape.group_size) for g in groups]
    rows = read_metrics(run / "metrics.jsonl", "train")
    if not rows:
        raise ConfigError(f"{run}/metrics.jsonl has no train steps to plan from")
    train_tokens = [int(r.get("n_tokens", 0)) for r in rows]
    train_s = sum(float(r.get("seconds", 0.0)) for r in rows)
    call_s = sum(calls.values())
    call_tokens = sum(g.tokens for g in groups)
    return Profile(
        groups=groups,
        shape=shape,
        tokens_per_s=call_tokens / call_s if call_s > 0 else float("inf"),
        train_s_per_token=train_s / max(1, sum(train_tokens)),
        train_tokens=train_tokens,
        overhead_s=step_overheads(read_metrics(run / "metrics.jsonl"), shape.mode),
        calls=len(calls),
    )


def read_groups(path: Path) -> tuple[list[GroupSample], dict[tuple[int, float], float]]:
    """Every group of the trace (training split, not an infra failure), in admission order, and the generation calls:
    (weight version, call seconds) -> seconds."""
    with readable(path):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "SELECT group_id, domain, completion_tokens, timings, model_version FROM rollouts "
                "WHERE split = 'train' AND error_kind IS NULL ORDER BY created_at"
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{path}: not a readable trace ({exc})") from None
        finally:
            con.close()
    acc: dict[str, dict[str, Any]] = {}
    for group_id, domain, tokens, timings, version in rows:
        t = json.loads(timings)
        g = acc.setdefault(group_id, {"domain": domain, "tokens": 0, "t": t, "version": version})
        g["tokens"] += int(tokens)
    groups, calls = [], {}
    for _, g in sorted(acc.items(), key=lambda kv: _admission(kv[0])):
        t = g["t"]
        gen = float(t.get("generate_s", 0.0))
        calls[(g["version"], gen)] = gen
        groups.append(
            GroupSample(g["domain"], g["tokens"], gen, float(t.get("execute_s", 0.0)), float(t.get("verify_s", 0.0)))
        )
    return groups, calls


def _admission(group_id: str) -> tuple[int, int]:
    """A group id's admission order: the loop names groups `STEP:K` (others keep trace order)."""
    step, _, k = group_id.partition(":")
    return (int(step), int(k)) if step.isdigit() and k.isdigit() else (0, 0)


def read_shape(path: Path) -> RunShape:
    """The run's loop shape from its resolved config.yaml (defaults where a section is absent)."""
    tree = read_yaml(path)
    pipe = PipelineConfig.model_validate(tree.get("pipeline") or {})
    rollout = tree.get("rollout") or {}
    sandbox = tree.get("sandbox") or {}
    return RunShape(
        mode=pipe.mode,
        max_staleness=pipe.max_staleness,
        prompts_per_step=int(rollout.get("prompts_per_step", 8)),
        group_size=int(rollout.get("group_size", 4)),
        queue_size=pipe.queue_size,
        max_inflight=pipe.max_inflight,
        generate_batch=pipe.generate_batch,
        workers=(pipe.generate_workers, pipe.execute_workers, pipe.verify_workers),
        sandbox_slots=int(sandbox.get("workers", 64)),
    )


def step_overheads(every: list[dict[str, Any]], mode: str) -> list[float]:
    """Each train step's wall time (since the previous step's row; the first: since the record
    before it, the evaluation before training) less its wait for groups (sync: the whole
    sampling, `rollout_s`; async: `pipe_wait_s`) less its optimiser step (`seconds`); never
    negative."""
    out: list[float] = []
    last: float | None = None
    for before, row in zip(every, every[1:]):
        if row["kind"] != "train":
            continue
        start = before["time"] if last is None else last
        last = row["time"]
        wait = row.get("rollout_s", 0.0) if mode == "sync" else row.get("pipe_wait_s", row.get("rollout_s", 0.0))
        out.append(max(0.0, row["time"] - start - float(wait) - float(row.get("seconds", 0.0))))
    return out
