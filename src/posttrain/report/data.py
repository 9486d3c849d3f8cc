"""What a report shows, read from a run directory: metrics rows, eval table, trace events.

Invariant: reading never writes to the run directory and never needs the
model; every series is keyed by the step it was measured at, and a section
whose source is absent (no pipeline stages, no sandbox results, no monitor
rows) is empty rather than an error, so a report of any run renders.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import ConfigError
from posttrain.metrics_log import read_metrics
from posttrain.trace import read_or

Series = dict[str, list[tuple[int, float]]]
_IDLE = re.compile(r"^(\w+)_idle_share$")


@dataclass(frozen=True)
class RunData:
    path: Path
    config: str
    train: list[dict[str, Any]]
    monitor: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    alarms: list[dict[str, Any]]
    probes: list[dict[str, Any]]
    eval_table: dict[str, Any] | None
    sandbox: dict[str, Counter] = field(default_factory=dict)
    judges: list[dict[str, Any]] = field(default_factory=list)
    """The run-start bias checks of its judge domains (metrics rows `judge_check`)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Each evaluation's items (eval_samples.jsonl lines: step, eval, domains -> items), in order."""
    problems: list[str] = field(default_factory=list)
    """What could not be read (a corrupt metrics line, eval.json, an eval_samples.jsonl line), each
    naming the file and why; the page shows them and renders the rest."""

    def per_domain(self, name: str) -> Series:
        """A monitor signal per domain: {domain: [(step, value)]}."""
        out: Series = {}
        for row in self.monitor:
            for domain, values in row.get("domains", {}).items():
                if name in values:
                    out.setdefault(domain, []).append((row["step"], float(values[name])))
        return out

    def token_use(self) -> dict[str, dict[str, float]]:
        """Per domain over the run: its token budget, mean completion tokens and truncated
        share of its rollouts (averaged over the steps that sampled it)."""
        acc: dict[str, dict[str, list[float]]] = {}
        for row in self.train:
            for key, value in row.items():
                for field_ in ("tokens_mean", "truncated_share", "token_budget"):
                    if key.startswith(field_ + "_") and isinstance(value, (int, float)):
                        acc.setdefault(key[len(field_) + 1 :], {}).setdefault(field_, []).append(float(value))
        return {d: {k: sum(v) / len(v) for k, v in fields.items()} for d, fields in sorted(acc.items())}

    def staleness(self) -> dict[str, dict[str, float]] | None:
        """pipeline.mode async: the run's groups re-queued and dropped for staleness, by domain and
        by completion length bucket (`stale_<requeued|dropped>_<domain|len>_<name>`, cumulative in
        each train row: the last row's), with the largest staleness trained on. None for a sync run."""
        rows = [r for r in self.train if r.get("pipe_async")]
        if not rows:
            return None
        out: dict[str, dict[str, float]] = {
            "max": {"staleness": max(float(r.get("pipe_staleness_max", 0)) for r in rows)}
        }
        for key, value in rows[-1].items():
            for kind in ("requeued", "dropped"):
                for by in ("domain", "len"):
                    prefix = f"stale_{kind}_{by}_"
                    if key.startswith(prefix):
                        out.setdefault(f"{by}:{key[len(prefix) :]}", {})[kind] = float(value)
        return out

    def pools(self) -> list[dict[str, float]]:
        """runtime ray: the stages' actor counts (`pool_<stage>_workers`) and the pool changes so
        far (`pool_changes`, `pool_grown`, `pool_shrunk`, `pool_blocked`), at the first train row
        and at every row where some count moved. Empty for a run without Ray pools."""
        rows = [r for r in self.train if "pool_changes" in r]
        out: list[dict[str, float]] = []
        for r in rows:
            cur = {"step": float(r.get("step", 0)), **{k: float(v) for k, v in r.items() if k.startswith("pool_")}}
            if not out or any(cur.get(k) != out[-1].get(k) for k in cur if k != "step"):
                out.append(cur)
        return out

    def replay(self) -> dict[str, float] | None:
        """trainer.replay over the run: steps that replayed, groups replayed and admitted, the
        replayed rows' mean share of their steps' rows, their mean and largest age (weight versions
        from the ones that generated them to the ones that replayed them), mean ratio to their
        behaviour log-probs and clipped share, the buffer's evictions.
        None for a run without the buffer."""
        rows = [r for r in self.train if "replay_groups" in r]
        if not rows:
            return None
        used = [r for r in rows if r["replay_groups"]]

        def mean(key: str) -> float:
            return sum(float(r[key]) for r in used) / len(used) if used else 0.0

        last = rows[-1]
        return {
            "steps": float(len(used)),
            "groups": float(sum(r["replay_groups"] for r in rows)),
            "admitted": float(last.get("replay_admitted_total", 0)),
            "share": mean("replay_share"),
            "age_mean": mean("replay_age_mean"),
            "age_max": float(max((r["replay_age_max"] for r in rows), default=0)),
            "ratio_mean": mean("replay_ratio_mean"),
            "clipped": mean("replay_clipped"),
            "evicted_age": float(last.get("replay_evicted_age_total", 0)),
            "evicted_capacity": float(last.get("replay_evicted_capacity_total", 0)),
            "evicted_used": float(last.get("replay_evicted_used_total", 0)),
        }

    def train_series(self, key: str) -> list[tuple[int, float]]:
        return [(r["step"], float(r[key])) for r in self.train if isinstance(r.get(key), (int, float))]

    def reward_by_domain(self) -> Series:
        return self.train_by_domain("reward_by_domain")

    def train_by_domain(self, key: str) -> Series:
        """A train row's per-domain figure `key` (a dict: domain -> value) as one line per domain."""
        out: Series = {}
        for row in self.train:
            for domain, value in (row.get(key) or {}).items():
                out.setdefault(domain, []).append((row["step"], float(value)))
        return out

    def speculation(self) -> tuple[Series, Series, Series]:
        """Speculative rollouts (engine.speculation) and the co-trained draft head
        (trainer.draft_head), per step: the engine's acceptance at each depth (`engine_spec_acceptance_d{i}`,
        with the mean accepted length beside it), its acceptance per domain, and the head's
        teacher-forced accuracy at each depth (`draft_acc`). Empty series for a run without them."""
        by_depth: Series = {}
        head: Series = {}
        for row in self.train:
            for key, value in row.items():
                if key.startswith("engine_spec_acceptance_d") and isinstance(value, (int, float)):
                    by_depth.setdefault("depth " + key.rsplit("_d", 1)[1], []).append((row["step"], float(value)))
            for depth, value in enumerate(row.get("draft_acc") or (), start=1):
                head.setdefault(f"depth {depth}", []).append((row["step"], float(value)))
        length = self.train_series("engine_spec_accepted_len")
        if length:
            by_depth["mean accepted length / 10"] = [(s, v / 10) for s, v in length]
        return by_depth, self.train_by_domain("spec_acceptance_by_domain"), head

    def spec_step_len(self) -> Series:
        """Tokens emitted per row per drafting step, per step: the rollouts' (`engine_spec_step_len`)
        and the push probe's (`engine_probe_spec_step_len`, greedy on fixed prompts after each push:
        the figure the collapse check judges with a draft head). Empty for a run without them."""
        got = {
            "rollouts": self.train_series("engine_spec_step_len"),
            "push probe": self.train_series("engine_probe_spec_step_len"),
        }
        return {name: series for name, series in got.items() if series}

    def shares(self) -> Series:
        """The pool's target sampling share per domain after each step (alarms may lower one)."""
        out: Series = {}
        for row in self.monitor:
            for domain, value in row.get("weights", {}).items():
                out.setdefault(domain, []).append((row["step"], float(value)))
        return out

    def audit_fail_share(self) -> Series:
        """Share of audited top-reward rollouts failing the stricter check, per domain and step."""
        out: Series = {}
        for row in self.monitor:
            for domain, a in row.get("audit", {}).items():
                if a.get("audited"):
                    out.setdefault(domain, []).append((row["step"], a["failed"] / a["audited"]))
        return out

    def kl(self) -> Series:
        out: Series = {}
        for row in self.monitor:
            for domain, value in row.get("kl", {}).items():
                out.setdefault(domain, []).append((row["step"], float(value)))
        trainer_kl = [(s, v) for s, v in self.train_series("kl") if v]
        if trainer_kl:
            out["trainer (k3 in loss)"] = trainer_kl
        return out

    def heldout_by_domain(self) -> Series:
        out: Series = {}
        for row in self.evals:
            for domain, value in row.get("domains", {}).items():
                if isinstance(value, (int, float)):
                    out.setdefault(domain, []).append((row["step"], float(value)))
        return out

    def heldout_intervals(self) -> dict[str, list[tuple[int, float, float, float]]]:
        """Per domain and the mean over domains: (step, accuracy, low, high) at each evaluation
        of the fixed subset (rows without intervals, from older runs, are left out)."""
        out: dict[str, list[tuple[int, float, float, float]]] = {}
        for row in self.evals:
            for domain, value in row.get("domains", {}).items():
                ci = row.get("ci", {}).get(domain)
                if isinstance(value, (int, float)) and ci:
                    out.setdefault(domain, []).append((row["step"], float(value), float(ci[0]), float(ci[1])))
            if row.get("mean_ci") and isinstance(row.get("mean_accuracy"), (int, float)):
                lo, hi = row["mean_ci"]
                out.setdefault("mean over domains", []).append(
                    (row["step"], float(row["mean_accuracy"]), float(lo), float(hi))
                )
        return out

    def rotation_by_domain(self) -> Series:
        """Accuracy on each evaluation's rotation slice (fresh items), per domain."""
        out: Series = {}
        for row in self.evals:
            for domain, value in row.get("rotation", {}).items():
                out.setdefault(domain, []).append((row["step"], float(value)))
        return out

    def train_vs_eval_verifier(self) -> Series:
        """Training verifier minus eval verifier pass rate on the same held-out items, per domain."""
        out: Series = {}
        for row in self.evals:
            for domain, train in row.get("train_verifier", {}).items():
                value = row.get("domains", {}).get(domain)
                if isinstance(value, (int, float)) and isinstance(train, (int, float)):
                    out.setdefault(domain, []).append((row["step"], float(train) - float(value)))
        return out

    def stage_utilisation(self) -> Series:
        """Pipeline stage busy share per step, from `<stage>_idle_share` keys of train rows."""
        out: Series = {}
        for row in self.train:
            for key, value in row.items():
                m = _IDLE.match(key)
                if m and isinstance(value, (int, float)):
                    out.setdefault(m.group(1), []).append((row["step"], 1.0 - float(value)))
        return out


def _sandbox_outcomes(db: Path) -> dict[str, Counter]:
    """Per domain: sandbox result statuses (exec_result.status) and infra-error kinds."""
    out: dict[str, Counter] = {}
    for domain, status, error_kind in read_or(db, lambda store: store.outcomes(), []):
        counter = out.setdefault(domain, Counter())
        if status:
            counter[f"sandbox:{status}"] += 1
        if error_kind:
            counter[f"error:{error_kind}"] += 1
    return out


def _step_at(when: float, train: list[dict[str, Any]]) -> int:
    """The first train step logged at or after `when` (the last one when none is)."""
    for row in train:
        if row.get("time", 0.0) >= when:
            return int(row["step"])
    return int(train[-1]["step"]) if train else 0


def _other_alarms(db: Path, train: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Alarm events written to the trace by others than the monitor (the pipeline's
    verifier degradation, ...); the monitor's own are in metrics.jsonl already."""
    out = []
    for event in read_or(db, lambda store: store.events("alarm"), []):
        try:
            payload = json.loads(event["data"] or "{}")
        except ValueError:
            payload = {}
        if "alarm" in payload:
            continue
        step = event["step"]
        out.append(
            {
                "step": step if step is not None else _step_at(event["created_at"], train),
                "alarm": "pipeline",
                "domain": event["domain"],
                "message": event["message"],
                "action": "pipeline",
                "done": "recorded by the pipeline",
            }
        )
    return out


def _eval_table(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """eval.json, or None (absent, or unreadable: then a problem naming it)."""
    if not path.is_file():
        return None
    try:
        table = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        problems.append(f"{path}: not JSON ({exc}); the held-out tables are left out")
        return None
    if not isinstance(table, dict):
        problems.append(f"{path}: a JSON {type(table).__name__}, not an object; the held-out tables are left out")
        return None
    return table


def _sample_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """One eval_samples.jsonl line, or None and why it is not one."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(row, dict) or not isinstance(row.get("step"), int) or not isinstance(row.get("domains"), dict):
        return None, "not an object with an integer step and domains"
    for domain, items in row["domains"].items():
        if not isinstance(items, list) or not all(isinstance(i, dict) and "completion" in i for i in items):
            return None, f"domain {domain!r} is not a list of items with a completion"
    return row, ""


def read_samples(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The evaluations of eval_samples.jsonl in order, the last line of each (step, eval) kept (a
    resumed run evaluates its last step again); a corrupt line is skipped into `problems`."""
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    lines.pop()  # a line still being written (or the empty string after the last newline)
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row, why = _sample_line(line)
        if row is None:
            problems.append(f"{path}:{number}: corrupt eval samples line skipped ({why})")
            continue
        out.pop((row["step"], str(row.get("eval"))), None)
        out[(row["step"], str(row.get("eval")))] = row
    return list(out.values())


def load_run(path: str | Path) -> RunData:
    run = Path(path)
    metrics = run / "metrics.jsonl"
    if not run.is_dir() or not (run / "config.yaml").is_file():
        raise ConfigError(f"{str(run)!r} is not a run directory (no config.yaml)")
    problems: list[str] = []
    rows = read_metrics(metrics, problems=problems)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    table_path = run / "eval.json"
    return RunData(
        path=run,
        config=(run / "config.yaml").read_text(),
        train=by_kind.get("train", []),
        monitor=by_kind.get("monitor", []),
        evals=by_kind.get("eval", []),
        heldout=by_kind.get("heldout", []),
        alarms=sorted(
            by_kind.get("alarm", []) + _other_alarms(run / "trace.db", by_kind.get("train", [])),
            key=lambda a: a["step"],
        ),
        probes=by_kind.get("probe", []),
        eval_table=_eval_table(table_path, problems),
        sandbox=_sandbox_outcomes(run / "trace.db"),
        judges=by_kind.get("judge_check", []),
        samples=read_samples(run / "eval_samples.jsonl", problems),
        problems=problems,
    )
