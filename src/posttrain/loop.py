"""The closed loop: draw tasks, sample groups, verify, train, evaluate. Top to bottom.

Invariant: every rollout reaches the trace store exactly once, before the
train step that consumes it; infra errors are masked from the loss and
counted, never scored 0; in pipeline.mode sync (the default; async streams
groups within a staleness bound and its batches depend on timing,
docs/pipeline.md) a run resumed from a checkpoint continues exactly
as the uninterrupted run would have (same tasks, same samples, same weights),
from its newest intact checkpoint, with the trace and metrics cut back to what
they held when that checkpoint was written (its `records` marks), so the
resumed run's records equal the uninterrupted run's. Every task the pool hands
out is, across crashes and resumes, trained on once or dropped with its reason,
both in the trace (`draws`) before the checkpoint after it (`DrawLedger.account`,
pipeline/draws.py). The trace rows are built in trace/rows.py, the replay bookkeeping is
trainer/replay.py's, the batch trainer/batch.py's: this file is the loop.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spinning threads under load
# a step's prompts are encoded in one batched tokenizer call (pipeline/workers.py encode_many): without this the
# Rust tokenizer spreads it over a thread per core (more CPU than one thread for a few dozen short prompts, and the
# "process just got forked after parallelism" warning in every later subprocess)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from posttrain import lineage
from posttrain.configs import Config
from posttrain.domains.registry import verifier_label
from posttrain.errors import ConfigError
from posttrain.evaluate import EvalTable
from posttrain.evaluate.run import RunEvaluator, before_table
from posttrain.metrics_log import MetricsLog, roll_back
from posttrain.monitor.actions import (
    Action,
    ExcludeDomain,
    LowerWeight,
    RaiseDiversityReward,
    RaiseEntropyBonus,
    Stop,
)
from posttrain.monitor.budget import CpuBudget
from posttrain.pipeline.budget import domain_budgets, execute_of
from posttrain.pipeline.continuous import Continuous
from posttrain.pipeline.countermeasures import Countermeasures
from posttrain.pipeline.step import StepRollouts, make_workers, trace_events
from posttrain.pipeline.workers import configure_pool
from posttrain.rollout import Rollout, informative
from posttrain.rundir import RunDir
from posttrain.trace import TraceStore
from posttrain.trace.rows import rollout_records
from posttrain.trainer.batch import batch_of
from posttrain.trainer.fit import check_fits
from posttrain.trainer.memory import process_memory_mib
from posttrain.trainer.replay import replay_buffer
from posttrain.types import SamplingParams, add_spec, to_dict

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from posttrain.contracts.engine import Engine
    from posttrain.engine.sync import WeightSync
    from posttrain.monitor.monitor import Monitor
    from posttrain.tasks.pool import TaskPool
    from posttrain.trainer.distributed import LeaderTrainer
    from posttrain.trainer.replay import ReplayBuffer
    from posttrain.trainer.trainer import Trainer


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    before: EvalTable
    after: EvalTable
    steps: int


def train(cfg: Config | None, resume: str | Path | None = None, log: Any = print) -> RunResult | None:
    """Run the loop of `cfg` (or continue the run at `resume`, with `cfg` when given: its changed
    fields checked and recorded, lineage.py) and return its before/after tables; None on a
    torchrun follower rank, or when `resume` names a finished run that nothing asks to go on
    (said in one line). Reads top to bottom: set up, evaluate before, step, finish."""
    from posttrain.trainer.checkpoint import verify_checkpoint
    from posttrain.trainer.distributed import follow_unless_leader

    if resume and (done := lineage.finished_resume(resume, cfg, verify_checkpoint)):
        log(done)
        return None
    if cfg is None and not resume:
        raise ValueError("train() needs a config, or a run to resume")
    if follow_unless_leader(cfg, resume):  # torchrun + trainer.fsdp: ranks > 0 replay rank 0's trainer calls
        return None
    run = _Run.open(cfg, resume, log)  # run dir, task pool, model, trainer, engine, trace, monitor, evaluator
    stop = run.evaluate_before()
    live = _live_report(run)
    sampling = _Sampling.of(run)
    _resume_in_flight(run, sampling)  # a resumed run: the draws in flight at its checkpoint
    bar, step = _progress(run.cfg, run.state["step"]), run.state["step"]
    run.budget.start()  # run.cpu_budget_s counts the steps only
    for step in range(run.state["step"] + 1, run.cfg.run.steps + 1):
        summary, stop = _step(run, sampling, step, stop)
        bar.set_postfix_str(" ".join(f"{d}={v:.2f}" for d, v in summary["reward_by_domain"].items()))
        bar.update(1)
        live.refresh(step, run.evaluator.due(step, run.cfg.run.steps))
        if stop:
            log(f"stopping the run after step {step}: {stop}")
            run.metrics.write("stop", step, reason=stop)
            break
        if run.cfg.run.checkpoint_every and step % run.cfg.run.checkpoint_every == 0 and step < run.cfg.run.steps:
            run.save(step)  # named by the loop step; the last step's checkpoint is the final one in _finish
    bar.close()
    live.close()  # a refresh in flight stops: the final report supersedes it
    return _finish(run, sampling, step if stop else run.cfg.run.steps)


@dataclass
class _Run:
    """The parts of one run, set up in the order the run needs them (`open`); `state` is what a
    checkpoint carries besides the weights: step, eval levels, the table before, the eval history."""

    cfg: Config
    rundir: RunDir
    pool: TaskPool
    model: torch.nn.Module  # the policy (a transformers causal LM; peft-wrapped under LoRA)
    tokenizer: PreTrainedTokenizerBase
    trainer: Trainer | LeaderTrainer  # the trainer, or its torchrun leader
    engine: Engine  # hf, vllm or openai (engine/sync.py make_engine)
    sync: WeightSync  # weight sync with the (maybe remote) engine
    trace: TraceStore
    metrics: MetricsLog
    monitor: Monitor
    evaluator: RunEvaluator
    state: dict[str, Any]  # what a checkpoint carries (besides `records`, the trace and metrics marks)
    budget: CpuBudget  # run.cpu_budget_s: training CPU, carried across a resume
    countermeasures: Countermeasures  # entropy bonus and diversity reward per domain (configured or raised)
    stop: str  # why the monitor, started, stops the run ('' to go on)
    log: Callable[[str], object]
    in_flight: dict[str, Any] | None = None
    """A resumed run: the checkpoint's state of the async stream (`Continuous.state_dict`), or None."""
    stream: Continuous | None = None
    """pipeline.mode async: the stream, whose state every checkpoint carries."""
    replay: ReplayBuffer | None = None  # trainer.replay: the buffer of past groups (trainer/replay.py), None when off
    processor: Any = None  # a vision model's processor (saved with each checkpoint, tokenizer included); None: text
    reused_before: EvalTable | None = None
    """`eval.before_from`: the finished run's final table taken as the before (checked in `_open`)."""

    @classmethod
    def open(cls, cfg: Config | None, resume: str | Path | None, log: Any) -> _Run:
        """The run set up; a fresh run whose set-up fails leaves no run directory behind."""
        if resume:
            rundir, cfg, changed = lineage.resume_config(resume, cfg)  # refused changes: one ConfigError
            return cls._open(cfg, rundir, resume, log, changed)
        if cfg is None:
            raise ValueError("a fresh run needs a config")
        rundir = RunDir.create(cfg)  # refuses a non-empty folder: what is removed below is all this start's
        try:
            return cls._open(cfg, rundir, None, log)
        except BaseException:
            import shutil

            shutil.rmtree(rundir.path, ignore_errors=True)
            raise

    @classmethod
    def _open(
        cls, cfg: Config, rundir: RunDir, resume: str | Path | None, log: Any, changed: Sequence[Any] = ()
    ) -> _Run:
        from posttrain.engine.sync import WeightSync, evaluation_engine, make_engine
        from posttrain.monitor.monitor import Monitor, RunContext
        from posttrain.tasks.pool import TaskPool

        in_flight = None
        configure_pool(cfg.sandbox.pool_config())  # before any sandbox use: cheat probes, evaluation, execute
        pool = TaskPool(cfg.tasks, seed=cfg.run.seed)  # validates domain names before any heavy work
        if cfg.engine.kind == "vllm" and cfg.engine.speculation.kind != "off":  # before any heavy work
            from posttrain.engine.vllm import SAMPLED_SPEC_LOGPROBS

            raise ConfigError(
                f"engine.speculation.kind {cfg.engine.speculation.kind} with engine.kind vllm: rollouts sample at "
                f"rollout.temperature {cfg.rollout.temperature}, and {SAMPLED_SPEC_LOGPROBS}; set "
                "engine.speculation.kind off, or use the hf engine's speculation"
            )
        source = cfg.eval.before_from  # a fresh run's source checked before the model loads: one ConfigError
        early = before_table(cfg, source) if source and not resume else None
        model, tokenizer, trainer, base_copy, processor = _policy(cfg)
        check_fits(cfg, model)  # a run that cannot fit the machine stops here, one line, before any work
        engine = make_engine(
            cfg.engine, model, tokenizer, cfg.run.seed, rundir.path, trainer.draft_head, processor
        )  # hf, vllm or openai
        if cfg.engine.kind == "hf" and cfg.engine.generate_dtype != "model":
            log(f"engine: generate_dtype {cfg.engine.generate_dtype}: generating with {_generates(engine)}")
        sync = WeightSync(cfg.engine, engine, trainer, rundir.path, cfg.trainer.mismatch)
        levels = {name: pool.eval_difficulty(name) for name in pool.names}
        state: dict[str, Any] = {"step": 0, "levels": levels, "before": None, "history": []}
        if resume:
            from posttrain.trainer.checkpoint import intact_checkpoint

            state = trainer.resume(intact_checkpoint(rundir.path, log))  # past damaged ones, each said
            pool.load_state_dict(state.pop("pool"))
            sync.clean_leftovers(log)  # .tmp-* weight folders of an interrupted push
            sync.resume(state.pop("sync", None))  # the restored weights, as the version they had
            in_flight = state.pop("stream", None)  # the async stream's draws in flight, to re-run
            lineage.check_length(cfg, state["step"], rundir.path)
            log(f"resumed {rundir.path} at step {state['step']}")
        trace, metrics = _records(rundir, state.pop("records", {}) if resume else None, state["step"], log)
        if resume:  # config.yaml, config_history.jsonl, a config_change row and event (lineage.py)
            lineage.record_resume(rundir, cfg, list(changed), state["step"], trace, metrics, log)
        else:  # model.path a checkpoint of another run: the branch's first history line
            lineage.record_branch(rundir, cfg, trace, metrics, log)
        sync.probe.attach(functools.partial(_probe_event, trace))  # every verified push is a trace event
        sync.attach_spec(functools.partial(_spec_probe_event, trace))  # and every push probe of a draft head
        monitor = Monitor(cfg.monitor, RunContext.of(cfg, rundir.path), trace, metrics, pool, base_copy, log)
        cm = Countermeasures(cfg.trainer.entropy_bonus, cfg.rollout.diversity_reward, cfg.monitor.diversity.n)
        stop = apply_actions(monitor.start(state["step"], state.pop("monitor", None)), pool, cm=cm)
        budget = CpuBudget(cfg.run.cpu_budget_s, state.get("train_cpu_s", 0.0))
        evaluator = RunEvaluator(
            cfg, rundir.path, evaluation_engine(engine), metrics, state["levels"], log
        )  # held-out set in the run dir; the policy's own weights (not a bf16 rollout copy)
        reused = None
        if state["before"] is None and source:  # and its held-out set, before any step
            reused = evaluator.reused(early or before_table(cfg, source), source)
        replay = replay_buffer(cfg.trainer.replay, cfg.rollout.prompts_per_step, state.pop("replay", None))
        return cls(
            cfg=cfg, rundir=rundir, pool=pool, model=model, tokenizer=tokenizer, trainer=trainer, engine=engine,
            sync=sync, trace=trace, metrics=metrics, monitor=monitor, evaluator=evaluator, state=state, budget=budget,
            countermeasures=cm, stop=stop,
            log=log, in_flight=in_flight, replay=replay, processor=processor, reused_before=reused,
        )  # fmt: skip

    def evaluate_before(self) -> str:
        """The held-out table before training (a resumed run has it already) and the run's checks;
        returns why the run stops ('' to go on)."""
        if self.state["before"] is None:
            from posttrain.tasks.pool import TaskPool

            cfg = self.cfg
            # under trainer.fsdp the model is sharded across ranks and its forward needs every rank, while
            # the followers only replay trainer calls: no local model for the exposure check
            model = None if cfg.trainer.fsdp else self.model
            self.evaluator.checks(model, self.tokenizer, lambda: TaskPool(cfg.tasks, seed=cfg.run.seed))
            if self.reused_before is not None:  # eval.before_from: the starting weights' table, measured there
                before = self.reused_before
                self.evaluator.adopt(before, str(cfg.eval.before_from))
                self.log(f"held-out before training: the final table of {cfg.eval.before_from} (eval.before_from)")
            else:
                before = self.evaluator.full(0)
            self.state["before"] = before.to_json()
            self.log("held-out before training:\n" + self.evaluator.describe(before))
            actions = self.monitor.after_eval(0, self.evaluator.comparable(before))
            self.stop = apply_actions(actions, self.pool, self.stop, self.countermeasures)
        return self.stop

    def save(self, step: int, train_cpu_s: float | None = None, records: dict[str, Any] | None = None) -> None:
        """A checkpoint named by the loop step: weights, optimizer, `state`, the pool's, monitor's and sync's,
        and `records` (default: `marks()` now), what a resume cuts the trace and metrics back to;
        `train_cpu_s`: the training CPU to carry (default: the budget's count now)."""
        self.state["step"] = step
        self.state["train_cpu_s"] = self.budget.spent() if train_cpu_s is None else train_cpu_s
        records = self.marks() if records is None else records
        parts: dict[str, Any] = {"pool": self.pool, "monitor": self.monitor, "sync": self.sync}
        if self.stream is not None:
            parts["stream"] = self.stream
        if self.replay is not None:  # trainer.replay: the buffer's groups, so a resume replays the same
            parts["replay"] = self.replay
        extra = {**self.state, **{k: part.state_dict() for k, part in parts.items()}, "records": records}
        self.trainer.save(self.rundir.path, self.processor or self.tokenizer, extra, step)

    def marks(self) -> dict[str, Any]:
        """How far the trace and metrics.jsonl reach now (synced to disk)."""
        return {"trace": self.trace.mark(), "metrics": self.metrics.mark()}


def _records(rundir: RunDir, marks: Mapping[str, Any] | None, step: int, log: Any) -> tuple[TraceStore, MetricsLog]:
    """The run's trace and metrics log. On resume (`marks`: the checkpoint's, {} when it predates
    them), the trace is checked first (a damaged one is a ConfigError naming its recovery) and both
    are cut back to what they held when the checkpoint was written: what the interrupted run
    wrote after it goes."""
    trace = TraceStore(rundir.trace_path)
    if marks is None:
        return trace, MetricsLog(rundir.metrics_path)
    trace.check()
    if not marks:
        log("resume: the checkpoint predates trace and metrics marks; records after it are not rolled back")
        return trace, MetricsLog(rundir.metrics_path)
    rollouts, events = trace.roll_back(marks["trace"], step)
    cut = roll_back(rundir.metrics_path, marks["metrics"])
    if rollouts or events or cut:
        log(
            f"resume: rolled back what was written after step {step}: {rollouts} rollouts and {events} events "
            f"of trace.db, {cut} bytes of metrics.jsonl"
        )
    return trace, MetricsLog(rundir.metrics_path)


def _resume_in_flight(run: _Run, sampling: _Sampling) -> None:
    """Draws in flight when the checkpoint the run resumes from was written (pipeline.mode
    async: the groups outstanding in the stream; their generation died with the process) are
    re-run: the stream rebuilds their tasks and admits them first (`Continuous.resume`), each
    keeping its draw id (a `resume_rerun` trace event lists them). A draw it cannot rebuild (the
    checkpoint predates the stream's state, or the pool no longer draws the recorded task; in
    sync mode no draw is open at a checkpoint) is dropped as "interrupted"."""
    pending, step = run.trace.pending_draw_records(), run.state["step"]
    if not pending:
        return
    stream = sampling.rollouts if isinstance(sampling.rollouts, Continuous) else None
    lost = stream.resume(run.in_flight, pending, step) if stream is not None else [d.id for d in pending]
    rerun = [d.id for d in pending if d.id not in set(lost)]
    if rerun:
        message = f"resume: {len(rerun)} draws in flight at the checkpoint of step {step} re-run"
        run.trace.add_event("resume_rerun", message, step=step, data={"draws": rerun})
        run.log(message)
    if lost:
        run.trace.record_dropped(step, dict.fromkeys(lost, "interrupted"))
        run.log(f"resume: {len(lost)} draws in flight at the checkpoint of step {step} dropped as interrupted")


def _policy(cfg: Config) -> tuple[Any, Any, Any, Callable[[], Any], Any]:
    """The policy model and its tokenizer, its trainer (the torchrun leader's under trainer.fsdp),
    a lazily loaded copy of the base model (the KL reference when there is one) for the monitor,
    and a vision model's processor (model/vision.py; None for a text model)."""
    import torch

    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base
    from posttrain.model.vision import is_vision_dir, load_vlm
    from posttrain.trainer.distributed import LeaderTrainer
    from posttrain.trainer.trainer import Trainer

    torch.set_num_threads(cfg.run.threads)
    model_dir = cfg.model.path or ensure_base(cfg.base, progress=cfg.run.progress)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = auto if cfg.model.device == "auto" else cfg.model.device
    if is_vision_dir(model_dir):
        model, tokenizer, processor = load_vlm(model_dir, device=device, dtype=getattr(torch, cfg.model.dtype))
        load = functools.partial(load_vlm, model_dir, device=device)
    else:
        model, tokenizer = load_model(model_dir, device=device, dtype=getattr(torch, cfg.model.dtype))
        processor, load = None, functools.partial(load_model, model_dir, device=device)
    ref_model = load()[0] if cfg.trainer.kl_coef > 0 else None
    trainer = Trainer(model, cfg.trainer, ref_model=ref_model, processor=processor)
    trainer = LeaderTrainer(trainer) if cfg.trainer.fsdp else trainer
    base_copy = functools.cache(lambda: ref_model if ref_model is not None else load()[0])
    return model, tokenizer, trainer, base_copy, processor


@dataclass(frozen=True)
class _Sampling:
    """How the run samples: each domain's budget (tokens per turn, turns, seconds), the sampling
    parameters (the largest token budget), and the pipeline that makes a step's groups."""

    budgets: Mapping[str, Any]
    params: SamplingParams
    rollouts: StepRollouts | Continuous
    """pipeline.mode sync: one step's groups at a time; async: a stream (pipeline/continuous.py)."""

    @classmethod
    def of(cls, run: _Run) -> _Sampling:
        cfg = run.cfg
        budgets = domain_budgets(run.pool.names, run.pool.specs, cfg.rollout.max_tokens)
        params = SamplingParams(
            max_tokens=max(b.tokens for b in budgets.values()),
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            n=cfg.rollout.group_size,
        )
        execute = execute_of(cfg.sandbox, budgets)  # the caps evaluation runs under too (evaluate/run.py)
        workers = make_workers(cfg.runtime, cfg.pipeline, run.engine, execute=execute)
        events = trace_events(run.trace, run.log)
        if cfg.pipeline.mode == "async":
            version = lambda: int(run.engine.version)  # noqa: E731 - the trainer's weights, as the engine has them
            stream = Continuous(
                cfg.pipeline, workers, run.pool, cfg.run.seed, cfg.rollout.prompts_per_step, version, events, budgets
            )
            run.stream = stream
            return cls(budgets, params, stream)
        rollouts = StepRollouts(
            cfg.pipeline, workers, run.pool, cfg.run.seed, events, cfg.rollout.dynamic_sampling, budgets
        )
        return cls(budgets, params, rollouts)

    def groups(self, run: _Run, step: int) -> tuple[list[list[Rollout]], list[list[Rollout]], dict[str, float]]:
        """The step's groups to train on, the finished ones left out for staleness (traced, not
        trained; async only), and the pipeline's stats."""
        if isinstance(self.rollouts, Continuous):  # async: whatever is finished, within max_staleness
            return self.rollouts.take(run.pool.draw, self.params, step)
        groups, stats = self.rollouts.sample(run.pool.draw(run.cfg.rollout.prompts_per_step), self.params, step)
        return groups, [], stats


def _step(run: _Run, sampling: _Sampling, step: int, stop: str) -> tuple[dict[str, Any], str]:
    """One loop step: sample and verify groups, trace every rollout, train on the kept groups, log,
    then the monitor and the periodic evaluation. Returns the step's summary and why the run stops."""
    t0 = time.perf_counter()
    groups, left, pipe_stats = sampling.groups(run, step)
    cm = run.countermeasures
    groups, left = cm.shape(groups), cm.shape(left)  # the diversity reward, beside the verifier's
    _write_trace(run, sampling, [*groups, *left])  # left: re-queued or dropped for staleness, not trained
    run.pool.offer(groups)  # tasks.branch: tasks derived from their failed episodes join the pool's queue
    # a group without signal stays for the entropy bonus of its domain (it enters only that term)
    kept = (
        [g for g in groups if informative(g) or cm.entropy_coef(g[0].task.domain) > 0]
        if run.cfg.rollout.dynamic_sampling
        else groups
    )
    kept = run.sync.fresh(kept, run.cfg.pipeline.max_staleness)  # versions as the (maybe remote) engine reported them
    rollout_s = time.perf_counter() - t0
    # trainer.replay: past groups, trained again at the engine's (the trainer's) weights
    replays = run.replay.take(step, int(run.engine.version)) if run.replay is not None else []
    stats = _train_step(run, step, groups, kept, sampling.params.temperature, cm.entropy_coef, replays)
    links = stats.rollouts if stats is not None else {}  # rollout id -> what the step did with it
    outcome, guard = (stats.outcome, stats.guard_reason) if stats is not None else ("no_signal", None)
    ledger = sampling.rollouts.ledger  # each returned group's draw gets its fate (pipeline/draws.py)
    ledger.account(step, groups, kept, outcome, guard, run.cfg.rollout.dynamic_sampling)
    ledger.flush(run.trace)  # one transaction, before any checkpoint after this step
    summary = _summary(groups, kept, sampling.budgets)
    trained = {} if stats is None else _stats_row(stats)
    if run.replay is not None:  # its replay event, the kept groups admitted, its metrics (trainer/replay.py)
        trained.update(
            run.replay.after_step(run.trace, step, kept, replays, stats, sampling.params.temperature, cm.entropy_coef)
        )
    run.metrics.write(
        "train",
        step,
        rollout_s=rollout_s,
        **summary,
        **trained,
        **pipe_stats,
        **cm.row(run.pool.names),
        **_bonus_row(groups),
        **run.pool.branch.row(),
        engine_version=run.engine.version,
        engine_dropped_stale=run.sync.dropped_stale,
        **run.sync.probe.row(),  # the step's push check (engine.verify_sync), when one ran
        **run.sync.stats(),
        train_cpu_s=round(run.budget.spent(), 3),
        **process_memory_mib(),
    )
    actions = run.monitor.after_step(step, groups, kept, links, stats, {**summary, **trained})
    stop = apply_actions(actions, run.pool, stop, cm)  # the monitor observes, the loop acts
    if run.evaluator.due(step, run.cfg.run.steps):  # the fixed subset and a rotation slice
        table = run.evaluator.periodic(step)
        run.state["history"].append([step, table.to_json()])
        run.pool.observe_eval(table.accuracies, table.counts)
        stop = apply_actions(run.monitor.after_eval(step, table), run.pool, stop, cm)
    stop = apply_actions(run.budget.after_step(step), run.pool, stop, cm)  # run.cpu_budget_s
    return summary, stop


def _bonus_row(groups: Sequence[Sequence[Rollout]]) -> dict[str, Any]:
    """The metrics row's mean diversity bonus per domain, over its rollouts that got one."""
    by_domain: dict[str, list[float]] = {}
    for r in (r for g in groups for r in g):
        if r.diversity_bonus is not None:
            by_domain.setdefault(r.task.domain, []).append(r.diversity_bonus)
    return {"diversity_bonus_mean": {d: round(sum(v) / len(v), 6) for d, v in sorted(by_domain.items())}}


def _probe_event(trace: TraceStore, result: Any) -> None:
    """A weight-sync check (engine/probe.py ProbeResult) as a `sync_probe` trace event."""
    trace.add_event("sync_probe", result.message, data=result.to_dict())


def _spec_probe_event(trace: TraceStore, message: str, figures: dict[str, float]) -> None:
    """A draft head's push probe (engine/sync.py `_spec_probe`) as a `spec_probe` trace event."""
    trace.add_event("spec_probe", message, data=figures)


def _stats_row(stats: Any) -> dict[str, Any]:
    """The metrics row's view of the trainer's stats: `to_dict` of every field but the step and the
    per-rollout links (those go to the trace; converting them first cost ~2 ms a step)."""
    return {
        f.name: to_dict(getattr(stats, f.name)) for f in dataclasses.fields(stats) if f.name not in ("step", "rollouts")
    }


def _write_trace(run: _Run, sampling: _Sampling, groups: Sequence[Sequence[Rollout]]) -> None:
    """Write every rollout of the step to the trace, under the id it was born with (before any
    train step consumes it), and let the pool see the scored ones."""
    run.trace.write_rollouts(rollout_records(groups, sampling.params, verifier_label, sampling.budgets))
    for r in (r for g in groups for r in g if r.reward is not None):
        run.pool.observe(r.task, r.reward)


def _train_step(
    run: _Run,
    step: int,
    groups: Sequence[Sequence[Rollout]],
    kept: Sequence[Sequence[Rollout]],
    temperature: float,
    entropy_coef: Callable[[str], float] | None = None,
    replays: Sequence[Any] = (),
) -> Any:
    """Train on the kept groups (the filtered ones count in the normalisers) and the `replays`
    (trainer.replay's entries: past groups' rows, with their behaviour log-probs), push changed
    weights to the engine, and mark in the trace what the step did with each rollout it sampled
    (a replayed rollout keeps the link to the step that sampled it; its replay is a `replay`
    event, `ReplayBuffer.after_step`). The trainer's stats, or None. `entropy_coef`: each domain's
    entropy-bonus coefficient (None: 0)."""
    kept_ids = {g[0].group_id for g in kept if g}
    filtered = [g for g in groups if g and g[0].group_id not in kept_ids]  # sampled this step, not trained on
    batch = batch_of(kept, temperature, filtered, entropy_coef, tuple(row for e in replays for row in e.rows))
    stats = run.trainer.step(batch) if batch is not None else None
    run.sync.guard.after_step(groups, stats, run.log)  # engine faults, train-inference mismatch: alarm or stop
    if stats is not None and stats.weights_changed:
        run.sync.push()
    replayed = {row.rollout_id for e in replays for row in e.rows}
    links = stats.rollouts if stats is not None else {}
    run.trace.mark_consumed(step, {rid: link for rid, link in links.items() if rid not in replayed})
    return stats


def _live_report(run: _Run) -> Any:
    """monitor.report: RUN_DIR/report.html rewritten in the background after each evaluation and
    every monitor.report_every_steps steps (report/live.py), so it can be opened while the run trains."""
    from posttrain.report.live import LiveReport

    return LiveReport(run.rundir.path, run.cfg.monitor.report_every_steps, run.cfg.monitor.report, run.log)


def _finish(run: _Run, sampling: _Sampling, step: int) -> RunResult:
    """The end of the run: the held-out table after training, the final checkpoint, eval.json,
    every part closed, and the report when asked for. Draws still in flight (pipeline.mode
    async: the groups outstanding in the stream) are dropped as "stopped" before the final
    checkpoint's marks."""
    spent = run.budget.spent()  # the final evaluation is outside run.cpu_budget_s
    ledger = sampling.rollouts.ledger
    if ledger.stop(step):
        ledger.flush(run.trace)
    marks = run.marks()  # an extended run resumes from the final checkpoint: its records go back to here
    after = run.evaluator.full(step)
    run.save(step, spent, marks)
    run.monitor.after_eval(step, run.evaluator.comparable(after))  # its actions: too late, nothing is drawn after
    before = EvalTable.from_json(run.state["before"])
    history = [(s, EvalTable.from_json(t)) for s, t in run.state["history"]]
    run.evaluator.write(run.rundir.eval_path, before, after, history)
    run.log("held-out before and after training:\n" + run.evaluator.describe(before, after))
    run.log(f"peak RSS of the training process: {process_memory_mib()['peak_rss_mib']:,.0f} MiB")
    for part in (run.monitor, sampling.rollouts, run.sync, run.trainer, run.trace, run.metrics):
        part.close()
    if run.cfg.monitor.report:
        from posttrain.report import write_report

        run.log(f"report: {write_report(run.rundir.path)}")
    lineage.mark_finished(run.rundir, step, run.cfg.run.steps)  # a plain resume now does nothing
    return RunResult(run.rundir.path, before, after, step)


def apply_actions(actions: Sequence[Action], pool: TaskPool, stop: str = "", cm: Countermeasures | None = None) -> str:
    """Apply the monitor's actions, in order, through the task pool's API (and the run's
    countermeasures `cm`). Returns why the run stops: `stop` when already set (the first reason
    wins), else the first Stop's, else ''."""
    for action in actions:
        match action:
            case RaiseEntropyBonus(domain, coef) if cm is not None:
                cm.raise_entropy(domain, coef)
            case RaiseDiversityReward(domain, weight) if cm is not None:
                cm.raise_diversity(domain, weight)
            case RaiseEntropyBonus() | RaiseDiversityReward():
                raise RuntimeError(f"{action} needs the run's countermeasures to apply it")
            case LowerWeight(domain, factor):
                pool.set_weight(domain, pool.weight(domain) * factor)
            case ExcludeDomain(domain):
                pool.exclude(domain)
            case Stop(reason):
                stop = stop or reason
    return stop


def _progress(cfg: Config, done: int) -> Any:
    from posttrain.progress import progress

    return progress(cfg.run.steps, "train", initial=done, disable=not cfg.run.progress)  # plain lines off a terminal


def _branch_summary(groups: Sequence[Sequence[Rollout]], rewards: Mapping[str, list[float]]) -> dict[str, Any]:
    """The metrics line's derived groups (tasks.branch): how many, and their mean reward by domain
    (apart from `reward_by_domain`, the domains' own tasks); nothing in a step without one."""
    n = sum(1 for g in groups if g and g[0].task.meta.branched)
    if not n:
        return {}
    return {"groups_branch": n, "reward_by_domain_branch": {d: sum(v) / len(v) for d, v in sorted(rewards.items())}}


def _summary(
    groups: Sequence[Sequence[Rollout]], kept: Sequence[Sequence[Rollout]], budgets: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    by_domain: dict[str, list[float]] = {}
    branch: dict[str, list[float]] = {}  # derived tasks' rewards (tasks.branch), apart from their domain's own
    errors = truncated = 0
    tokens: dict[str, list[int]] = {}
    drafts: dict[str, tuple[int, ...]] = {}  # engine.speculation per domain: drafts verified, proposed, accepted
    for g in groups:
        for r in g:
            if r.completion.spec:
                drafts[r.task.domain] = add_spec(drafts.get(r.task.domain, ()), r.completion.spec)
            errors += r.reward is None
            truncated += r.completion.finish_reason == "length"
            row = tokens.setdefault(r.task.domain, [0, 0, 0])  # rollouts, completion tokens, truncated
            row[0] += 1
            row[1] += len(r.completion.token_ids)
            row[2] += r.completion.finish_reason == "length"
            if r.reward is not None:
                (branch if r.task.meta.branched else by_domain).setdefault(r.task.domain, []).append(r.reward)
    rewards = [x for v in (*by_domain.values(), *branch.values()) for x in v]
    out = {
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "reward_by_domain": {d: sum(v) / len(v) for d, v in sorted(by_domain.items())},
        "groups": len(groups),
        **_branch_summary(groups, branch),
        "groups_kept": len(kept),
        "groups_filtered": len(groups) - len(kept),
        "infra_errors": errors,
        "truncated": truncated,
        "tokens_sampled": sum(t[1] for t in tokens.values()),  # the report's tokens/s
    }
    for d, (n, toks, cut) in sorted(tokens.items()):  # per-domain token use against its budget
        out[f"tokens_mean_{d}"] = round(toks / n, 3)
        out[f"truncated_share_{d}"] = round(cut / n, 4)
        if budgets and d in budgets:
            out[f"token_budget_{d}"] = budgets[d].tokens
    if drafts:  # engine.speculation: acceptance and mean accepted length of each domain's drafts
        out["spec_acceptance_by_domain"] = {d: round(a / p, 4) for d, (_, p, a) in sorted(drafts.items()) if p}
        out["spec_accepted_len_by_domain"] = {d: round(1 + a / n, 4) for d, (n, _, a) in sorted(drafts.items())}
    return out


def _generates(engine: Engine) -> str:
    """What the hf engine generates with, in words (engine.generate_dtype resolved)."""
    from posttrain.engine.hf import generates_with

    kind = generates_with(engine)
    return "the trained module itself" if kind == "model" else f"a {kind} copy of it, refreshed at every push"
