"""Evaluation inside a training run: the held-out set stored with the run, checks at start,
the full set before and after, a fixed subset and a rotation slice during training.

Invariant: a run's held-out set is built once, written to RUN_DIR/heldout.json
before the first evaluation, and read back on resume, so every evaluation of
a run (and `posttrain eval --run`, `posttrain compare` later) uses exactly
those items. Every curve point (before, during, after) is measured on the
same fixed subset (the first `eval.subset_tasks` items of each core set), so
points compare; the rotation slice is reported apart and never mixed into
it. The contamination and exposure checks run once, at the start of a new
run, and are written to RUN_DIR/checks.json. Each evaluation appends one line to
RUN_DIR/eval_samples.jsonl: every core item's prompt, greedy completion, score and verdict
per domain (the report's sample table), in one write; an image task's item names its images by
sha256 (`images`), never their bytes: the report draws them again from the task id.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.contracts.engine import Engine
from posttrain.evaluate.core import EvalOptions, EvalTable, evaluate_heldout
from posttrain.evaluate.heldout import HeldoutSet, build_heldout, rotation_slice
from posttrain.evaluate.tables import format_details, format_probes, format_table, format_turns, write_table
from posttrain.pipeline.group import RetryPolicy


def options(
    eval_cfg: Any, sampled: bool = True, tasks: Any = None, run: Any = None, progress: bool | None = None
) -> EvalOptions:
    """Eval options; with the run's `tasks` config, each domain's token and turn budgets are
    the ones it trains with (tasks.domains.<name>.max_tokens / max_turns / max_seconds, else its
    declaration); with the run's whole config `run`, its retry policy and execute caps, and its
    progress bar (`run.progress`) unless `progress` says otherwise."""
    budgets: dict[str, int] = {}
    turns: dict[str, int] = {}
    seconds: dict[str, float] = {}
    if tasks is not None:
        from posttrain.tasks.pool import resolve_specs

        specs = resolve_specs(tasks)
        budgets = {n: spec.max_tokens for n, (_, spec) in specs.items() if spec.max_tokens}
        turns = {n: spec.max_turns for n, (_, spec) in specs.items() if spec.max_turns}
        seconds = {n: spec.max_seconds for n, (_, spec) in specs.items() if spec.max_seconds}
    return EvalOptions(
        max_tokens=eval_cfg.max_tokens,
        budgets=budgets,
        turns=turns,
        seconds=seconds,
        batch_size=eval_cfg.batch_size,
        samples=eval_cfg.samples if sampled else 0,
        temperature=eval_cfg.temperature,
        ks=tuple(eval_cfg.k),
        seed=eval_cfg.seed,
        progress=bool(run.run.progress if progress is None and run is not None else progress),
        **({} if run is None else {"policy": RetryPolicy.of(run.pipeline), "sandbox": run.sandbox}),
    )


_SAMPLE_CHARS = 2000
"""A sample's prompt and completion are cut to this many characters in eval_samples.jsonl."""


def append_samples(path: Path, step: int, label: str, table: EvalTable) -> None:
    """Append one line of `table`'s core items (prompt, completion, score, verdict, error; an
    image task's image digests) per domain to `path`, in one write on an O_APPEND descriptor (a
    reader sees whole lines only)."""
    domains = {
        d: [
            {
                "task": s.task_id,
                "prompt": s.prompt[:_SAMPLE_CHARS],
                "completion": s.completion[:_SAMPLE_CHARS],
                "value": s.value,
                "ok": s.ok,
                "error": s.error,
                **({"images": list(s.images)} if s.images else {}),
            }
            for s in r.samples
        ]
        for d, r in table.results.items()
    }
    line = json.dumps({"step": step, "eval": label, "time": time.time(), "domains": domains}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = memoryview(line.encode())
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def heldout_for(eval_cfg: Any, levels: Mapping[str, int]) -> HeldoutSet:
    return build_heldout(
        levels, eval_cfg.tasks_per_domain, eval_cfg.seed, eval_cfg.above_tasks, dict(eval_cfg.transfer_domains)
    )


def before_table(cfg: Any, source: str | Path) -> EvalTable:
    """`eval.before_from`: the final table of the finished run at `source` (its eval.json's
    `after`), checked, before any model loads, to be what evaluating `cfg.model.path` would give:
    that path is the run's newest checkpoint, whose weights the table measured, and the
    evaluation options (`options`: budgets, caps, samples, temperature, k, seed, retry policy,
    sandbox caps) of its config equal `cfg`'s. `RunEvaluator.reused` then checks the held-out
    set. A ConfigError says which check failed (every differing option named), or what is missing."""
    from dataclasses import asdict, replace

    from posttrain.configs import load_config
    from posttrain.errors import ConfigError
    from posttrain.trainer.checkpoint import latest_checkpoint

    run = Path(source)
    what = f"eval.before_from: {run}"
    data_path, config_path = run / "eval.json", run / "config.yaml"
    if not (data_path.is_file() and config_path.is_file()):
        raise ConfigError(f"{what} is not a run directory with eval.json and config.yaml")
    try:
        after = json.loads(data_path.read_text()).get("after")
        table = EvalTable.from_json(after) if after else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{what}: its eval.json cannot be read ({exc!r})") from None
    if table is None:
        raise ConfigError(f"{what}: its eval.json has no final table (the run did not finish)")
    newest = latest_checkpoint(run)
    model_path = cfg.model.path
    if newest is None or Path(str(model_path)).resolve() != newest.resolve():
        raise ConfigError(
            f"{what}: its final table measured {newest}, this run starts from model.path={model_path}; "
            f"set model.path={newest}, or leave eval.before_from unset to evaluate the start"
        )
    theirs_cfg = load_config(config_path)
    mine = asdict(replace(options(cfg.eval, tasks=cfg.tasks, run=cfg), progress=False))
    theirs = asdict(replace(options(theirs_cfg.eval, tasks=theirs_cfg.tasks, run=theirs_cfg), progress=False))
    differ = [k for k in mine if mine[k] != theirs[k]]
    if differ:
        said = ", ".join(f"{k} ({theirs[k]!r} there, {mine[k]!r} here)" for k in differ)
        raise ConfigError(f"{what}: its evaluation options differ from this run's: {said}")
    return table


class RunEvaluator:
    """Owns a run's held-out set and its evaluations; the loop calls it at the marked points."""

    def __init__(
        self,
        cfg: Any,
        run_dir: Path,
        engine: Engine,
        metrics: Any,
        levels: Mapping[str, int],
        log: Callable[[str], Any] = print,
    ) -> None:
        self.cfg, self.run_dir, self.engine, self.metrics, self.log = cfg.eval, Path(run_dir), engine, metrics, log
        self.tasks = cfg.tasks
        self.run = cfg
        """The run's whole config: evaluation takes its retry policy and execute caps."""
        path = self.run_dir / "heldout.json"
        if path.is_file():
            self.heldout = HeldoutSet.load(path)
        else:
            self.heldout = heldout_for(self.cfg, levels)
            self.heldout.save(path)
        for warning in self.heldout.warnings():
            log(f"warning: {warning}")
        self.seconds = {"full": 0.0, "periodic": 0.0, "checks": 0.0}

    # ------------------------------------------------------------ checks at the start of a run

    def checks(self, model: Any, tokenizer: Any, pool_factory: Callable[[], Any]) -> dict[str, Any]:
        """n-gram contamination of the held-out prompts by the run's first training draws, and
        the exposure of the (base) model to the held-out answers; logged and written to checks.json."""
        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        if self.cfg.contamination:
            out["contamination"] = self._contamination(pool_factory())
            bad = [
                f"{d} ({r['contaminated']}/{r['eval_tasks']})"
                for d, r in out["contamination"].items()
                if r["contaminated"]
            ]
            self.log(
                "contamination (n-gram overlap, held-out vs training draws): "
                + (f"OVERLAP in {', '.join(bad)}" if bad else "none found")
            )
        if self.cfg.exposure and model is None:
            out["exposure_skipped"] = "no local model to score with (trainer.fsdp shards it across ranks)"
            self.log(f"exposure check skipped: {out['exposure_skipped']}")
        elif self.cfg.exposure and tokenizer is not None and hasattr(model, "parameters"):
            from posttrain.evaluate.exposure import check_exposure, exposure_json

            found = check_exposure(
                model, tokenizer, self.heldout, self.cfg.exposure_tasks, self.cfg.exposure_threshold, self.cfg.seed
            )
            out["exposure"] = exposure_json(found)
            for e in found.values():
                if e.flagged:
                    self.log(f"warning: exposure check: {e.message()}")
            if not any(e.flagged for e in found.values()):
                self.log(f"exposure check of the base model: no domain looks memorised ({len(found)} checked)")
        self.seconds["checks"] += time.perf_counter() - t0
        (self.run_dir / "checks.json").write_text(json.dumps(out, indent=1))
        return out

    def _contamination(self, pool: Any) -> dict[str, Any]:
        from dataclasses import asdict

        from posttrain.domains.hygiene import contamination

        drawn: dict[str, list[Any]] = {}
        for task in pool.draw(self.cfg.contamination_train_tasks):
            drawn.setdefault(task.domain, []).append(task)
        out = {}
        for key, s in self.heldout.sets.items():
            if s.kind in ("core", "above"):
                rep = contamination(s.domain, drawn.get(s.domain, []), s.tasks(), n=self.cfg.ngram)
                out[key if s.kind == "above" else s.domain] = asdict(rep)
        return out

    # ------------------------------------------------------------ evaluations

    def full(self, step: int) -> EvalTable:
        """Every core item (sampled metrics included), the generalisation probes."""
        t0 = time.perf_counter()
        table = evaluate_heldout(self.engine, self.heldout, options(self.cfg, tasks=self.tasks, run=self.run))
        seconds = time.perf_counter() - t0
        self.seconds["full"] += seconds
        self._row(step, self.comparable(table), seconds, full=table)
        return table

    def reused(self, table: EvalTable, source: str | Path) -> EvalTable:
        """`table` (from `before_table`: the run at `source` checked without the model) checked
        against this run's held-out set: its held-out version must be this set's. A ConfigError
        says what differs."""
        from posttrain.errors import ConfigError

        if table.heldout_version != self.heldout.version:
            raise ConfigError(
                f"eval.before_from: {source}: its held-out set ({table.heldout_version}) is not this run's "
                f"({self.heldout.version}): the tasks, levels or eval.tasks_per_domain / above_tasks / "
                "transfer_domains / seed differ"
            )
        return table

    def adopt(self, table: EvalTable, source: str | Path) -> None:
        """`table` (from `reused`) recorded as step 0's full evaluation: its metrics row (0 seconds)
        and its samples, the source run's last full evaluation's line of eval_samples.jsonl."""
        self._row(0, self.comparable(table), 0.0, full=table, samples=False)
        path = Path(source) / "eval_samples.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
        full = [r for r in rows if r.get("eval") == "full"]
        if full:
            with open(self.run_dir / "eval_samples.jsonl", "a") as fh:
                fh.write(json.dumps({**full[-1], "step": 0, "from": str(source)}) + "\n")

    def due(self, step: int, last: int) -> bool:
        return bool(self.cfg.every_steps) and step % self.cfg.every_steps == 0 and step < last

    def periodic(self, step: int) -> EvalTable:
        """The fixed subset and this evaluation's rotation slice."""
        t0 = time.perf_counter()
        rotation = {}
        if self.cfg.rotation_tasks:
            number = step // max(self.cfg.every_steps, 1)
            rotation = {
                d: rotation_slice(s, self.cfg.rotation_tasks, number, self.cfg.seed)
                for d, s in self.heldout.of_kind("core").items()
            }
        opts = options(self.cfg, sampled=False, tasks=self.tasks, run=self.run)
        table = evaluate_heldout(self.engine, self.heldout, opts, self.cfg.subset_tasks, rotation, probes=False)
        seconds = time.perf_counter() - t0
        self.seconds["periodic"] += seconds
        self._row(step, table, seconds)
        return table

    def comparable(self, table: EvalTable) -> EvalTable:
        """The view every curve point shares: the fixed subset of the core sets."""
        return table.head(self.cfg.subset_tasks)

    def _row(
        self, step: int, table: EvalTable, seconds: float, full: EvalTable | None = None, samples: bool = True
    ) -> None:
        lo, hi = table.mean_interval()
        row: dict[str, Any] = {
            "mean_accuracy": table.mean_accuracy,
            "mean_ci": [lo, hi],
            "seconds": seconds,
            "domains": table.accuracies,
            "ci": {k: [r.low, r.high] for k, r in table.results.items()},
            "n": {k: r.scored for k, r in table.results.items()},
            "infra_errors": {k: r.infra_errors for k, r in table.results.items()},
            "train_verifier": {k: r.train_accuracy for k, r in table.results.items() if r.train_accuracy is not None},
            "rotation": {k: r.accuracy for k, r in table.rotation.items() if r.accuracy is not None},
            "rotation_n": {k: r.scored for k, r in table.rotation.items()},
        }
        by_turn = {k: [v for v, _, _ in r.pass_at_turn.values()] for k, r in table.results.items() if r.turn_budget}
        if by_turn:
            row["pass_at_turn"] = by_turn
        stops = {k: {kind: v[0] for kind, v in r.stop_rates.items()} for k, r in table.results.items() if r.stop_rates}
        if stops:
            row["stop_rate"] = stops
        if full is not None:
            row["full"] = {
                "domains": full.accuracies,
                "mean_accuracy": full.mean_accuracy,
                "probes": {k: r.accuracy for k, r in full.probes.items()},
            }
        self.metrics.write("eval", step, **row)
        if samples:
            append_samples(self.run_dir / "eval_samples.jsonl", step, "full" if full else "subset", full or table)

    # ------------------------------------------------------------ the end of a run

    def write(self, path: Path, before: EvalTable, after: EvalTable, history: Sequence[tuple[int, EvalTable]]) -> None:
        checks_path = self.run_dir / "checks.json"
        checks = json.loads(checks_path.read_text()) if checks_path.is_file() else {}
        extra = {
            "heldout": {**self.heldout.to_json(), "version": self.heldout.version, "warnings": self.heldout.warnings()},
            "subset_tasks": self.cfg.subset_tasks,
            "eval_seconds": dict(self.seconds),
            **checks,
        }
        write_table(path, before, after, history, extra)

    @staticmethod
    def describe(before: EvalTable, after: EvalTable | None = None) -> str:
        parts = [
            format_table(before, after),
            format_turns(before, after),
            format_details(after or before),
            format_probes(before, after),
        ]
        return "\n".join(p for p in parts if p)
