"""The closed loop: draw tasks, sample groups, verify, train, evaluate. Top to bottom.

Invariant: every rollout reaches the trace store exactly once, before the
train step that consumes it; infra errors are masked from the loss and
counted, never scored 0; a run resumed from a checkpoint continues exactly
as the uninterrupted run would have (same tasks, same samples, same weights).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spinning threads under load

from posttrain.config import Config
from posttrain.evaluate import EvalTable
from posttrain.evaluate.run import RunEvaluator
from posttrain.monitor.actions import Action, ExcludeDomain, LowerWeight, Stop
from posttrain.monitor.budget import CpuBudget
from posttrain.pipeline.budget import domain_budgets
from posttrain.pipeline.step import StepRollouts, make_workers, trace_events
from posttrain.pipeline.workers import DomainExecute
from posttrain.rollout import Rollout, informative
from posttrain.rundir import MetricsLog, RunDir
from posttrain.trace import RolloutRecord, TraceStore, exec_summary, transcript
from posttrain.types import SamplingParams, to_dict

if TYPE_CHECKING:
    from posttrain.tasks.pool import TaskPool


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    before: EvalTable
    after: EvalTable
    steps: int


def train(cfg: Config, resume: str | Path | None = None, log: Any = print) -> RunResult | None:
    import torch

    from posttrain.scale.distributed import LeaderTrainer, follow_unless_leader

    if follow_unless_leader(cfg, resume):  # torchrun + trainer.fsdp: ranks > 0 replay rank 0's trainer calls
        return None

    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base
    from posttrain.monitor.monitor import Monitor, RunContext
    from posttrain.scale.remote import WeightSync, make_engine
    from posttrain.tasks.pool import TaskPool
    from posttrain.trainer.trainer import Trainer

    run, cfg = RunDir.open(resume) if resume else (RunDir.create(cfg), cfg)
    torch.set_num_threads(cfg.run.threads)
    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)  # validates domain names before any heavy work
    model_dir = cfg.model.path or ensure_base(cfg.base, progress=cfg.run.progress)
    device = (
        "cuda"
        if cfg.model.device == "auto" and torch.cuda.is_available()
        else ("cpu" if cfg.model.device == "auto" else cfg.model.device)
    )
    model, tokenizer = load_model(model_dir, device=device, dtype=getattr(torch, cfg.model.dtype))
    ref_model = load_model(model_dir, device=device)[0] if cfg.trainer.kl_coef > 0 else None
    trainer = Trainer(model, cfg.trainer, ref_model=ref_model)
    trainer = LeaderTrainer(trainer) if cfg.trainer.fsdp else trainer
    engine = make_engine(cfg.engine, model, tokenizer, cfg.run.seed)  # hf in process, or openai + weight sync
    sync = WeightSync(cfg.engine, engine, trainer, run.path)
    trace, metrics = TraceStore(run.trace_path), MetricsLog(run.metrics_path)
    levels = {name: pool.eval_difficulty(name) for name in pool.names}
    state = {"step": 0, "levels": levels, "before": None, "history": []}

    if resume:
        state = trainer.resume(run.path)
        pool.load_state_dict(state.pop("pool"))
        sync.push()
        levels = state["levels"]
        log(f"resumed {run.path} at step {state['step']}")
    base_copy = functools.cache(lambda: ref_model if ref_model is not None else load_model(model_dir, device=device)[0])
    monitor = Monitor(cfg.monitor, RunContext.of(cfg, run.path), trace, metrics, pool, base_copy, log)
    stop = apply_actions(monitor.start(state["step"], state.pop("monitor", None)), pool)
    evaluator = RunEvaluator(cfg, run.path, engine, metrics, levels, log)  # held-out set stored in the run dir
    if state["before"] is None:
        evaluator.checks(model, tokenizer, lambda: TaskPool(cfg.tasks, seed=cfg.run.seed))  # contamination, exposure
        before = evaluator.full(0)
        state["before"] = before.to_json()
        log("held-out before training:\n" + evaluator.describe(before))
        stop = apply_actions(monitor.after_eval(0, evaluator.comparable(before)), pool, stop)
    before = EvalTable.from_json(state["before"])

    budgets = domain_budgets(pool.names, pool.specs, cfg.rollout.max_tokens)  # tokens per turn and turns, per domain
    params = SamplingParams(
        max_tokens=max(b.tokens for b in budgets.values()),
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        n=cfg.rollout.group_size,
    )
    execute = DomainExecute(
        cfg.sandbox.pool_config(),
        cfg.sandbox.max_memory_mb,
        cfg.sandbox.max_wall_s,
        {n: b.seconds for n, b in budgets.items()},
    )  # each domain's runs within its budget seconds
    workers = make_workers(cfg.runtime, cfg.pipeline, engine, execute=execute)
    rollouts = StepRollouts(
        cfg.pipeline, workers, pool, cfg.run.seed, trace_events(trace, log), cfg.rollout.dynamic_sampling, budgets
    )
    bar = _progress(cfg, state["step"])
    budget = CpuBudget(cfg.run.cpu_budget_s, state.get("train_cpu_s", 0.0)).start()  # counts the steps only
    for step in range(state["step"] + 1, cfg.run.steps + 1):
        t0 = time.perf_counter()
        groups, pipe_stats = rollouts.sample(pool.draw(cfg.rollout.prompts_per_step), params, step)
        records = {id(r): _record(r, params, budgets) for g in groups for r in g}
        trace.write_rollouts(list(records.values()))
        ids = {key: rec.id for key, rec in records.items()}  # id(rollout) -> its trace id, the id it keeps
        for r in (r for g in groups for r in g if r.reward is not None):
            pool.observe(r.task, r.reward)
        kept = [g for g in groups if informative(g)] if cfg.rollout.dynamic_sampling else groups
        kept = sync.fresh(kept, cfg.pipeline.max_staleness)  # versions as the (maybe remote) engine reported them
        gen_s = time.perf_counter() - t0
        kept_ids = {id(g) for g in kept}
        filtered = [g for g in groups if id(g) not in kept_ids]  # sampled this step, not trained on
        batch = _batch(kept, ids, params.temperature, filtered)
        stats = trainer.step(batch) if batch is not None else None
        if stats is not None and stats.weights_changed:
            sync.push()
        links = stats.rollouts if stats is not None else {}  # rollout id -> what the step did with it
        trace.mark_consumed(step, links)
        summary = _summary(groups, kept, budgets)
        trained = {} if stats is None else {k: v for k, v in to_dict(stats).items() if k not in ("step", "rollouts")}
        metrics.write(
            "train",
            step,
            rollout_s=gen_s,
            **summary,
            **trained,
            **pipe_stats,
            engine_version=engine.version,
            engine_dropped_stale=sync.dropped_stale,
            train_cpu_s=round(budget.spent(), 3),
        )
        actions = monitor.after_step(step, groups, kept, ids, links, stats, {**summary, **trained})
        stop = apply_actions(actions, pool, stop)  # the monitor observes, the loop acts
        bar.set_postfix_str(" ".join(f"{d}={v:.2f}" for d, v in summary["reward_by_domain"].items()))
        bar.update(1)
        if evaluator.due(step, cfg.run.steps):  # the fixed subset and a rotation slice
            table = evaluator.periodic(step)
            state["history"].append([step, table.to_json()])
            pool.observe_eval(table.accuracies, table.counts)
            stop = apply_actions(monitor.after_eval(step, table), pool, stop)
        stop = apply_actions(budget.after_step(step), pool, stop)  # run.cpu_budget_s
        if stop:
            log(f"stopping the run after step {step}: {stop}")
            metrics.write("stop", step, reason=stop)
            break
        if cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0 and step < cfg.run.steps:
            state["step"] = step  # named by the loop step; the last step's checkpoint is the final one below
            state["train_cpu_s"] = budget.spent()
            trainer.save(
                run.path, tokenizer, {**state, "pool": pool.state_dict(), "monitor": monitor.state_dict()}, step
            )
    bar.close()

    state["step"] = step if stop else cfg.run.steps
    state["train_cpu_s"] = budget.spent()
    after = evaluator.full(state["step"])
    trainer.save(
        run.path, tokenizer, {**state, "pool": pool.state_dict(), "monitor": monitor.state_dict()}, state["step"]
    )
    monitor.after_eval(state["step"], evaluator.comparable(after))  # its actions: too late, nothing is drawn after
    history = [(s, EvalTable.from_json(t)) for s, t in state["history"]]
    evaluator.write(run.eval_path, before, after, history)
    log("held-out before and after training:\n" + evaluator.describe(before, after))
    monitor.close()
    rollouts.close()
    sync.close()
    trainer.close()
    trace.close()
    metrics.close()
    if cfg.monitor.report:
        from posttrain.report import write_report

        log(f"report: {write_report(run.path)}")
    return RunResult(run.path, before, after, state["step"])


def apply_actions(actions: Sequence[Action], pool: TaskPool, stop: str = "") -> str:
    """Apply the monitor's actions, in order, through the task pool's API. Returns why the run
    stops: `stop` when already set (the first reason wins), else the first Stop's, else ''."""
    for action in actions:
        match action:
            case LowerWeight(domain, factor):
                pool.set_weight(domain, pool.weight(domain) * factor)
            case ExcludeDomain(domain):
                pool.exclude(domain)
            case Stop(reason):
                stop = stop or reason
    return stop


def _progress(cfg: Config, done: int) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=cfg.run.steps, initial=done, desc="train", unit="step", disable=not cfg.run.progress, dynamic_ncols=True
    )


def _batch(
    groups: Sequence[Sequence[Rollout]],
    ids: Mapping[int, str],
    temperature: float,
    filtered: Sequence[Sequence[Rollout]] = (),
) -> Any:
    """One row per scored rollout of the kept groups, carrying its trace id; a scored empty
    completion is a row too (it counts in its group's advantages, enters no loss).
    The scored rollouts of the `filtered` groups (sampled this step, left out) are counted,
    with their loss tokens, for the loss's normalisers (trainer.normalise).
    None when no rollout is scored (nothing to train on)."""
    from posttrain.trainer.batch import TrainBatch, TrainRow

    rows = [
        TrainRow.from_completion(r.completion, r.reward, r.group_id, temperature, r.loss_mask, rollout_id=ids[id(r)])
        for g in groups
        for r in g
        if r.reward is not None
    ]
    dropped = [r for g in filtered for r in g if r.reward is not None]
    tokens = sum(sum(r.loss_mask) if r.loss_mask is not None else len(r.completion.token_ids) for r in dropped)
    return TrainBatch(tuple(rows), filtered_rows=len(dropped), filtered_tokens=tokens) if rows else None


def _summary(
    groups: Sequence[Sequence[Rollout]], kept: Sequence[Sequence[Rollout]], budgets: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    by_domain: dict[str, list[float]] = {}
    errors = truncated = 0
    tokens: dict[str, list[int]] = {}
    for g in groups:
        for r in g:
            errors += r.reward is None
            truncated += r.completion.finish_reason == "length"
            row = tokens.setdefault(r.task.domain, [0, 0, 0])  # rollouts, completion tokens, truncated
            row[0] += 1
            row[1] += len(r.completion.token_ids)
            row[2] += r.completion.finish_reason == "length"
            if r.reward is not None:
                by_domain.setdefault(r.task.domain, []).append(r.reward)
    rewards = [x for v in by_domain.values() for x in v]
    out = {
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "reward_by_domain": {d: sum(v) / len(v) for d, v in sorted(by_domain.items())},
        "groups": len(groups),
        "groups_kept": len(kept),
        "groups_filtered": len(groups) - len(kept),
        "infra_errors": errors,
        "truncated": truncated,
    }
    for d, (n, toks, cut) in sorted(tokens.items()):  # per-domain token use against its budget
        out[f"tokens_mean_{d}"] = round(toks / n, 3)
        out[f"truncated_share_{d}"] = round(cut / n, 4)
        if budgets and d in budgets:
            out[f"token_budget_{d}"] = budgets[d].tokens
    return out


@functools.lru_cache(maxsize=256)
def _sampling(params: SamplingParams, max_tokens: int | None) -> dict[str, Any]:
    """The trace's view of the sampling parameters (with the domain's token budget), built
    once per distinct value: every rollout of a domain shares it. Callers copy it."""
    return to_dict(params if max_tokens is None else dataclasses.replace(params, max_tokens=max_tokens))


def _record(r: Rollout, params: SamplingParams, budgets: Mapping[str, Any] | None = None) -> RolloutRecord:
    s = r.score
    tokens = budgets[r.task.domain].tokens if budgets and r.task.domain in budgets else None
    return RolloutRecord(
        task_id=r.task.id,
        domain=r.task.domain,
        split=r.task.meta.split,
        difficulty=r.task.meta.difficulty,
        taskset_version=r.task.meta.taskset_version,
        group_id=r.group_id,
        model_version=r.completion.model_version,
        sampling=dict(_sampling(params, tokens)),
        prompt=r.prompt_text,
        completion=r.completion.text,
        completion_tokens=len(r.completion.token_ids),
        finish_reason=r.completion.finish_reason,
        reward=None if s is None else s.value,
        passed=None if s is None else s.passed,
        parts={} if s is None else dict(s.parts),
        reason=r.error or ("" if s is None else s.reason),
        verifier=_verifier_name(r.task.domain),
        timings=dict(r.timings),
        error_kind=r.error_kind,
        error=r.error,
        exec_result=exec_summary(r.exec_result),
        turns=transcript(r.turns),
    )


def _verifier_name(domain: str) -> str:
    from posttrain.domains.registry import get

    v = get(domain).verifier
    return f"{getattr(v, 'name', type(v).__name__)}@{getattr(v, 'version', '?')}"
