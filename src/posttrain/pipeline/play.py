"""The inline scheduler: groups run in the caller's thread, one call after another, for
training's direct path (`Play.direct`, from pipeline/step.py), the evaluator (evaluate/core.py)
and episode play (`play`).

Invariant: it runs the calls each group asks for (`GroupRun.next_call`) inline and feeds back
what came of them (a Wait is slept), generation through `group.generation`, so budgets, splits,
retries and masking are the group's, as in the staged pipeline. Only concurrency and admission
are its own: with a `Scheduler` (the direct path) groups are admitted by waves of at most
`batch_size`, in the staged pipeline's order, each wave verified and finished before the next;
without one every task is one wave. A wave's groups play in lockstep (`_play`): every group due
a turn, single-turn or an episode's next, generates together by token budget (shortest first,
at most `batch_size` a call). Under the direct path's conditions (`EmbeddedWorkers.inline`) its
groups, seeds and results equal the staged pipeline's (but generate_splits: the pipeline batches
retried groups together again).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget, stable_hash
from posttrain.engine.base import Engine
from posttrain.envs import driver
from posttrain.pipeline.group import (
    COUNTERS,
    Call,
    Done,
    Encode,
    Execute,
    Generate,
    GroupResult,
    GroupRun,
    Open,
    Played,
    RetryPolicy,
    Step,
    Verify,
    Wait,
    by_budget,
    generation,
    group_seed,
)
from posttrain.pipeline.metrics import StageMeter, StageStats
from posttrain.pipeline.scheduler import Scheduler
from posttrain.pipeline.workers import DomainExecute, EmbeddedWorkers, ExecuteFn, Verdict, execute_one, verify_group
from posttrain.progress import counting_rows, raise_total
from posttrain.types import Completion, Episode, GenerationRequest, Message, SamplingParams, Task


@dataclass(frozen=True)
class EngineCalls:
    """An engine's calls as the inline scheduler makes them; verification by `verify_group`."""

    engine: Engine

    def encode_now(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return self.engine.encode_chat(messages)

    def encode_many(self, prompts: Sequence[Sequence[Message]]) -> list[tuple[int, ...] | Exception]:
        return self.engine.encode_chats(prompts)  # the Engine contract: encode_chat's ids, each error in place

    def generate_now(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return self.engine.generate(requests)

    def verify_now(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
        return verify_group(task, episodes)

    def end_sessions(self, keys: Sequence[str]) -> None:
        self.engine.end_sessions(keys)  # the Engine contract: a no-op where nothing is kept


Calls = EngineCalls | EmbeddedWorkers
"""What the inline scheduler calls, in the caller's thread: an engine's, or the direct path's workers."""


class Play:
    """Run groups inline: `run(tasks)` (verified, finished), `groups(tasks)` (not verified) or,
    with a scheduler, `run_groups(tasks)` (the direct path: results, None for a paused domain's
    task); `stats()`. It calls `engine`, or `calls` (the direct path's workers); `execute` is the
    run's execute step with its caps. Group ids are `prefix` + admission seq (None: the task's
    id); with `seed`, each group is seeded by (seed, group id, generation attempt) as in the
    staged pipeline; without, by `params.seed` (an episode group: with its index among the
    call's episode groups). `progress`: a bar that counts the sample rows generated."""

    def __init__(
        self,
        engine: Engine | None,
        params: SamplingParams,
        budgets: Mapping[str, Budget] | None = None,
        policy: RetryPolicy | None = None,
        batch_size: int = 256,
        execute: ExecuteFn = DomainExecute(),
        sleep: Callable[[float], None] = time.sleep,
        scheduler: Scheduler | None = None,
        seed: int | None = None,
        prefix: str | None = None,
        latency_window: int = 4096,
        calls: Calls | None = None,
        progress: Any = None,
    ) -> None:
        if calls is None:
            if engine is None:
                raise ValueError("Play needs an engine or calls")
            calls = EngineCalls(engine)
        self.calls = calls
        self.params = params
        self.policy = policy or RetryPolicy()
        """The one retry policy (None: `RetryPolicy()`, the defaults of `pipeline.max_retries` and `backoff_s`)."""
        self.budgets = budgets or {}
        """Per-domain budgets (None for a domain: its declared turns and seconds, `params.max_tokens`)."""
        self.batch_size = batch_size
        self.execute = execute
        self.sleep = sleep
        self.scheduler, self.seed, self.prefix = scheduler, seed, prefix
        self.progress = progress
        """A bar (posttrain/progress.py) counting the sample rows generated, as the engine reports them
        inside a call (`progress.rows_done`) and the rest when the call returns; None: none."""
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.meters = {k: StageMeter(k, 1, latency_window) for k in ("generate", "execute", "verify")}
        self._next_seq = 0
        self._tokens = itertools.count(1)
        self._episode_seeds: dict[int, int | None] = {}
        self._seed_of: weakref.WeakKeyDictionary[GroupRun, int | None] = weakref.WeakKeyDictionary()
        """An episode group's seed without a run seed."""

    @classmethod
    def direct(cls, cfg: PipelineConfig, workers: Calls, params: SamplingParams, sched: Scheduler, **kw: Any) -> Play:
        """Training's direct path (pipeline/step.py): waves of `generate_batch` groups admitted by
        `sched`, the run's retry policy; `kw`: budgets, seed, prefix (default "")."""
        kw.setdefault("prefix", "")
        kw.update(scheduler=sched, latency_window=cfg.latency_window, calls=workers)
        return cls(None, params, kw.pop("budgets", None), RetryPolicy.of(cfg), cfg.generate_batch, **kw)

    def run(self, tasks: Sequence[Task]) -> list[GroupRun]:
        """Every task's group, verified and finished (`GroupRun.result`), in task order."""
        return [r for r in self._run(tasks, verify=True) if r is not None]

    def groups(self, tasks: Sequence[Task]) -> list[GroupRun]:
        """Every task's group generated and executed (not verified), in task order; a group a
        stage masked past its retries is finished already."""
        return [r for r in self._run(tasks, verify=False) if r is not None]

    def run_groups(self, tasks: Sequence[Task]) -> list[GroupResult | None]:
        """Results in task order; None for a task whose domain is paused (paused_skipped)."""
        return [r.result if r is not None else None for r in self._run(tasks, verify=True)]

    def stats(self) -> Any:
        """The stage meters and counters (`PipelineStats`, the staged pipeline's keys without queues)."""
        from posttrain.pipeline.core import PipelineStats

        cap = self.scheduler.cap.value if self.scheduler is not None else 0
        stages: tuple[StageStats, ...] = tuple(m.stats() for m in self.meters.values())
        return PipelineStats(stages, (), dict(self.counters), cap)

    # ---- admission: waves ---------------------------------------------------------------
    def _run(self, tasks: Sequence[Task], verify: bool) -> list[GroupRun | None]:
        first, self._next_seq = self._next_seq, self._next_seq + len(tasks)
        sched = self.scheduler
        order = list(range(len(tasks)))
        if sched is not None:
            order.sort(key=lambda i: (sched.tier(tasks[i].domain) != "long", i))
        single = [i for i in order if not _episodic(tasks[i])]
        encoded = dict(zip(single, self.calls.encode_many([tasks[i].prompt for i in single])))
        episodic = [i for i, t in enumerate(tasks) if _episodic(t)]
        if self.seed is None and self.params.seed is not None:
            seeds = {first + i: stable_hash("play", self.params.seed, k) for k, i in enumerate(episodic)}
            self._episode_seeds.update(seeds)
        runs: dict[int, GroupRun] = {}
        waiting = order
        while waiting:
            before = len(waiting)
            wave = self._wave(first, tasks, encoded, waiting)
            if len(waiting) == before:  # nothing in flight here, so only a scheduler shared elsewhere blocks
                raise RuntimeError("inline scheduler: no pending task is admissible (in-flight groups held elsewhere)")
            live = [r for _, r in wave if r.result is None]
            self._play(live)
            for r in sorted(live, key=lambda r: self._tokens_of(r.task)):  # the order the engine calls ran in
                if verify and r.result is None:
                    done = self._drive(r)
                    assert isinstance(done, Done)
                    if sched is not None:
                        sched.record_verification(r.task.domain, bool(done.health))
                if sched is not None:
                    sched.finish(r.task.domain)
            runs.update((seq - first, r) for seq, r in wave)
        return [runs.get(i) for i in range(len(tasks))]

    def _tokens_of(self, task: Task) -> int:
        budget = self.budgets.get(task.domain)
        return budget.tokens if budget is not None else self.params.max_tokens

    def _wave(
        self, first: int, tasks: Sequence[Task], encoded: Mapping[int, Any], waiting: list[int]
    ) -> list[tuple[int, GroupRun]]:
        """Admit the next wave, taking its tasks out of `waiting`: without a scheduler, all of
        them; with one, tasks of paused domains are skipped and counted, then, in the staged
        pipeline's admission order (`Scheduler.next_admissible`), up to `batch_size` groups."""
        sched = self.scheduler
        if sched is None:
            everything = [(first + i, self._admit(first + i, tasks[i], encoded.get(i))) for i in waiting]
            waiting.clear()
            return everything
        for i in [i for i in waiting if sched.is_paused(tasks[i].domain)]:
            self.counters["paused_skipped"] += 1
            waiting.remove(i)
        wave: list[tuple[int, GroupRun]] = []
        while waiting and sum(r.result is None for _, r in wave) < self.batch_size:
            k = sched.next_admissible([tasks[i] for i in waiting])
            if k is None:
                break
            i = waiting.pop(k)
            wave.append((first + i, run := self._admit(first + i, tasks[i], encoded.get(i))))
            if run.result is not None:  # it could not start: masked, its slot free again
                sched.finish(run.task.domain)
        return wave

    def _admit(self, seq: int, task: Task, ids: Any) -> GroupRun:
        """One group admitted: its prompt's ids (`ids`, or the error encoding raised), or its
        environments opened; a task that cannot start is masked and counted, as in the pipeline."""
        tier = self.scheduler.admit(task.domain) if self.scheduler is not None else None
        gid = task.id if self.prefix is None else f"{self.prefix}{seq}"
        budget = self.budgets.get(task.domain)
        run = GroupRun.admit(
            task, gid, tier, seq, self.params, self.policy, self.counters, budget, self.calls.end_sessions
        )
        if seq in self._episode_seeds:
            self._seed_of[run] = self._episode_seeds.pop(seq)
        while isinstance(call := run.next_call(), Open | Encode):
            if isinstance(call, Open):
                run.feed(_attempt(call.envs))
            elif ids is not None:
                run.feed(ids if isinstance(ids, BaseException) else [ids])
            else:
                run.feed(_attempt(lambda: [self.calls.encode_now(p) for p in call.prompts]))
        return run

    # ---- the calls, in the caller's thread ----------------------------------------------
    def _play(self, wave: list[GroupRun]) -> None:
        """The wave's groups played in lockstep: every group due a turn (a single-turn group's
        one turn, each episode group's next) generated together, by token budget
        (`group.by_budget`, shortest first, at most `batch_size` groups a call), then the episode
        groups' environment steps, until no episode is due another turn; then the execute steps
        of the single-turn groups. Twenty two-turn episodes cost two engine calls, not forty."""
        live = [r for r in wave if r.result is None]
        due = [r for r in live if isinstance(r.next_call(), Generate)]
        while due:
            for batch in by_budget(due, lambda r: self._tokens_of(r.task)):
                for start in range(0, len(batch), self.batch_size):
                    self._generate(batch[start : start + self.batch_size])
            due = [r for r in live if _episodic(r.task) and isinstance(self._drive(r, (Generate, Verify)), Generate)]
        for r in live:
            if not _episodic(r.task):
                self._drive(r, Verify)

    def _seed(self, run: GroupRun) -> int | None:
        if self.seed is not None:
            return group_seed(run, self.seed)
        return self._seed_of.get(run, self.params.seed)

    def _generate(self, batch: list[GroupRun]) -> None:
        """`batch` generated through `group.generation`; the groups whose call is retried are
        generated again after the longest of their backoffs, until none is."""
        while batch:
            plan = generation(batch, self.params, self._seed)
            try:
                call = next(plan)
                while True:
                    call = plan.send(self._metered("generate", call[0], self._generate_now, call[1]))
            except StopIteration:
                pass
            waits = [(r, c.seconds) for r in batch if isinstance(c := r.next_call(), Wait)]
            if waits:
                self.sleep(max(s for _, s in waits))
            batch = [r for r, _ in waits]

    def _generate_now(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """The engine call, its rows counted on `progress`: each as the engine reports it, the
        rest when the call returns (an engine that reports nothing); a failed call's rows are not
        counted (a retry's are)."""
        bar = self.progress
        if bar is None:
            return self.calls.generate_now(requests)
        rows = sum(r.params.n for r in requests)
        raise_total(bar, bar.n + rows)
        counted = 0

        def done(n: int) -> None:
            nonlocal counted
            n = min(n, rows - counted)
            counted += n
            bar.update(n)

        with counting_rows(done):
            out = self.calls.generate_now(requests)
        if counted < rows:
            done(rows - counted)
        return out

    def _metered(self, stage: str, items: int, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        """What `fn(*args)` returned (or raised) and the seconds it took, on the stage's meter."""
        meter, token = self.meters[stage], next(self._tokens)
        meter.begin(token)
        got = _attempt(fn, *args)
        return got, meter.end(token, items, error=isinstance(got, BaseException))

    def _drive(self, run: GroupRun, until: type | tuple[type, ...] | None = None) -> Call:
        """Run the group's calls inline until it asks for `until` (a call type or a tuple of
        them; None: until it is done); a Wait is slept, a turn generated alone."""
        while not isinstance(call := run.next_call(), Done) and (until is None or not isinstance(call, until)):
            if isinstance(call, Wait):
                self.sleep(call.seconds)
            elif isinstance(call, Generate):
                self._generate([run])
            elif isinstance(call, Step):
                run.feed(self._step(call))
            elif isinstance(call, Execute):
                comps, run_one = call.completions, self.execute
                run.feed([execute_one(run_one, call.task, c) if call.declared else None for c in comps])
            elif isinstance(call, Verify):
                verify = self.calls.verify_now if call.episodes else lambda *_: ()
                run.feed(*self._metered("verify", 1, verify, call.task, call.episodes))
            else:
                raise TypeError(f"inline scheduler: unexpected call {call!r}")
        return call

    def _step(self, call: Step) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for _, t in call.pending:
            try:
                driver.step(t)  # raises only infra errors; a model fault ends t inside
            except Exception as exc:
                out.append(exc)
                continue
            driver.observe(t, self.calls.encode_now)
            out.append(None)
        return out


def _attempt(fn: Callable[..., Any], *args: Any) -> Any:
    """What `fn(*args)` returns, or the exception it raised (what a group is fed)."""
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def _episodic(task: Task) -> bool:
    from posttrain.domains.registry import get

    return get(task.domain).environment() is not None


def play(
    engine: Engine,
    tasks: Sequence[Task],
    params: SamplingParams,
    n: int = 1,
    budgets: Mapping[str, Budget] | None = None,
    retries: int = 2,
) -> list[list[Played]]:
    """`n` episodes per task, run to their end through the one lifecycle (not verified); a step
    or execute step that keeps failing (after `retries` retries, no backoff) masks its episode
    with the error kind. Single-turn domains: one generation of `n` each."""
    runs = Play(engine, dataclasses.replace(params, n=n), budgets, RetryPolicy(retries, 0.0)).groups(tasks)
    return [r.played() for r in runs]
