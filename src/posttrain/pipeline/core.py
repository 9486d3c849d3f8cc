"""The asynchronous rollout pipeline: generate -> execute -> verify over bounded queues.

Invariant: every admitted group leaves the pipeline exactly once, as one
GroupResult holding one Rollout per sample: scored, or masked with a typed
error after its retries ran out (never scored 0 for an infra error). Blame
is per sample and by cause: what the model's output made host code raise
(an environment step, the execute step, the verifier) scores that sample 0
with the reason; an infra failure of one sample's step, run or verification
(a transient verifier error) is retried, then masks that sample alone, and
its group-mates go on; each Rollout carries the retries it went through;
admission keeps each domain's quota of in-flight groups and takes the
highest-priority pending task first (`Scheduler.next_admissible`); an engine call
that fails over several groups is split in halves until the failing group
stands alone, so only its own request masks it. Every
background task is owned by the pipeline's asyncio.TaskGroup, so a crash in
any stage cancels its siblings and surfaces from `async with`; a stage
never blocks the event loop (its workers' calls are awaitable; only a
verifier that declares itself `cheap`, microseconds, is called inline);
no task waits on a timer: the feeder and `run_groups` sleep on events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget, stable_hash
from posttrain.envs import driver
from posttrain.envs.base import Trajectory
from posttrain.errors import NOT_RETRIED, ErrorRecord, GenerationError, PromptTooLong, blame, capture
from posttrain.pipeline.metrics import StageMeter, StageStats
from posttrain.pipeline.queues import BoundedQueue, QueueStats
from posttrain.pipeline.scheduler import EventSink, Scheduler
from posttrain.pipeline.workers import Verdict, Workers, verdict_of
from posttrain.rollout import Rollout, rollout_id
from posttrain.types import Completion, CostClass, Episode, GenerationRequest, SamplingParams, Task

COUNTERS = (
    "admitted",
    "finished",
    "retries",
    "masked_groups",
    "masked_rollouts",
    "paused_skipped",
    "long_sampled",
    "masked_execute",
    "model_faults",
    "generate_splits",
    "prompt_computed",
    "prompt_new",
)
"""The pipeline's counters (`pipe_<name>` in the per-step metrics): masked_groups counts
groups every sample of which was masked, masked_rollouts the masked samples;
model_faults the samples scored 0 because their output made host code raise (a
verifier or environment bug shows here); generate_splits the failed engine calls
split in halves; prompt_computed and prompt_new the prompt tokens of finished multi-turn
episodes that the engine computed and that were new to the episode (`Trajectory`)."""


@dataclass
class _Item:
    """One group in flight (internal, mutable; only Rollouts leave)."""

    task: Task
    group_id: str
    tier: CostClass
    seq: int
    admitted_at: float
    turn_budget: int = 1
    max_tokens: int = 16
    prompt_ids: tuple[int, ...] = ()
    executes: bool = False
    completions: list[Completion] = field(default_factory=list)
    trajectories: list[Trajectory] | None = None
    """Multi-turn groups: one episode per sample, stepped by `envs.driver`."""
    targets: list[list[Trajectory]] = field(default_factory=list)
    """The trajectories each of the last generation requests feeds (driver.requests)."""
    execs: list[Any] = field(default_factory=list)
    """Each sample's execute-stage result (`_PENDING` until it ran)."""
    decided: dict[int, Verdict] = field(default_factory=dict)
    """Samples whose verdict is known before verification: masked by an infra error after
    their retries, or scored 0 for a model fault. The rest of the group goes on."""
    sandbox_failed: bool = False
    """Some sample's execute step or environment step failed past its retries (the group
    then counts as an infra failure of its domain, `Scheduler.record_verification`)."""
    episodes: list[Episode] | None = None
    verified: dict[int, Verdict] = field(default_factory=dict)
    """Samples verified so far (a verification retry verifies only the others)."""
    attempts: dict[str, int] = field(default_factory=dict)
    group_retries: int = 0
    """Retries of a stage call for the whole group (every sample went through them)."""
    retried: dict[int, int] = field(default_factory=dict)
    """Per sample: retries of its own (its execute step or environment step, its verification)."""
    timings: dict[str, float] = field(default_factory=dict)
    closed: bool = False

    @property
    def multi_turn(self) -> bool:
        return self.trajectories is not None


@dataclass(frozen=True)
class GroupResult:
    """One finished group, in the order of its admission `seq`."""

    seq: int
    tier: CostClass
    rollouts: tuple[Rollout, ...]
    model_version: int
    """Oldest weight version among the group's samples (the staleness reference)."""

    @property
    def domain(self) -> str:
        return self.rollouts[0].task.domain


@dataclass(frozen=True)
class PipelineStats:
    stages: tuple[StageStats, ...]
    queues: tuple[QueueStats, ...]
    counters: Mapping[str, int]
    inflight_cap: int

    def flat(self) -> dict[str, float]:
        """Per-step metrics: depth, throughput, p50/p99 latency, idle share per stage."""
        out: dict[str, float] = {f"pipe_{k}": float(v) for k, v in self.counters.items()}
        for s in self.stages:
            out.update(
                {
                    f"{s.name}_items": s.items,
                    f"{s.name}_per_s": round(s.throughput, 3),
                    f"{s.name}_p50_s": round(s.p50_s, 5),
                    f"{s.name}_p99_s": round(s.p99_s, 5),
                    f"{s.name}_idle_share": round(1.0 - s.utilisation, 4),
                }
            )
        for q in self.queues:
            out[f"queue_{q.name}_max_depth"] = q.max_depth
        out["inflight_cap"] = self.inflight_cap
        return out


class Pipeline:
    """Use as `async with Pipeline(...) as pipe:`; then `await pipe.run_groups(tasks)`
    (a fixed set, results in task order), or `pipe.submit(...)` and `await pipe.drain()`
    (a stream, pipeline/continuous.py). Multi-turn domains (an `environment()`)
    run their episodes through `envs.driver`: generate and execute alternate until
    every episode of the group is done, then the execute stage runs the domain's
    execute step on each last action (for a domain that executes), then verify."""

    def __init__(
        self,
        config: PipelineConfig,
        workers: Workers,
        params: SamplingParams,
        scheduler: Scheduler,
        events: EventSink | None = None,
        group_prefix: str = "",
        seed: int | None = None,
        budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        self.cfg, self.workers, self.params, self.scheduler = config, workers, params, scheduler
        self.budgets = budgets
        """Per-domain budgets: each group generates with its domain's tokens per turn and
        turns (None: `params.max_tokens` and the declared turns for every domain)."""
        self._events = events
        self._prefix = group_prefix
        self.seed = seed
        """With a seed, each group's samples are seeded by (seed, group id): the same
        whatever the batching, the worker or the runtime."""
        self.q_generate: BoundedQueue[_Item] = BoundedQueue("generate", config.queue_size)
        self.q_continue: BoundedQueue[_Item] = BoundedQueue("continue", config.max_inflight + 1)
        self.q_execute: BoundedQueue[_Item] = BoundedQueue("execute", config.queue_size)
        self.q_verify: BoundedQueue[_Item] = BoundedQueue("verify", config.queue_size)
        self.results: BoundedQueue[GroupResult] = BoundedQueue("results", config.queue_size)
        w = config.latency_window
        self.meters = {
            "generate": StageMeter("generate", config.generate_workers, w),
            "execute": StageMeter("execute", config.execute_workers, w),
            "verify": StageMeter("verify", config.verify_workers, w),
        }
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._seq = itertools.count()
        self._tokens = itertools.count()
        self._changed = asyncio.Event()
        """Set when a slot frees or tasks are added (the feeder's wake-up)."""
        self._arrived = asyncio.Event()
        """Set when a result is queued or a task is skipped (run_groups' wake-up)."""
        self._gen_ready = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task] = []
        self._pending: deque[tuple[int, Task]] = deque()
        self._closing = False
        self._skipped: list[int] = []
        self._group_ids: dict[int, str] = {}
        self._cheap_domains: dict[str, bool] = {}

    # ---- ownership -----------------------------------------------------
    async def __aenter__(self) -> Pipeline:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        spawn = self._tg.create_task
        self._tasks += [spawn(self._generate_worker(i)) for i in range(self.cfg.generate_workers)]
        self._tasks += [spawn(self._execute_worker()) for _ in range(self.cfg.execute_workers)]
        self._tasks += [spawn(self._verify_worker()) for _ in range(self.cfg.verify_workers)]
        self._tasks.append(spawn(self._feeder()))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True  # also stops a loop whose cancellation wait_for swallowed (Python 3.11)
        for t in self._tasks:
            t.cancel()
        assert self._tg is not None
        await self._tg.__aexit__(*exc)

    # ---- admission -----------------------------------------------------
    def _fill(self) -> float:
        return max(q.fill() for q in (self.q_generate, self.q_execute, self.q_verify))

    def _room(self) -> bool:
        inflight = self.counters["admitted"] - self.counters["finished"]
        return inflight < self.scheduler.cap.update(self._fill())

    def _next_pending(self) -> tuple[int, Task] | None:
        """The pending task to admit now (`Scheduler.next_admissible`: a free slot of its tier,
        room in its domain's quota, the highest priority, then the pending order), or None."""
        i = self.scheduler.next_admissible([task for _, task in self._pending])
        if i is None:
            return None
        got = self._pending[i]
        del self._pending[i]
        return got

    def _drop_paused(self) -> None:
        keep: deque[tuple[int, Task]] = deque()
        for seq, task in self._pending:
            if self.scheduler.is_paused(task.domain):
                self.counters["paused_skipped"] += 1
                self._skipped.append(seq)
                self._arrived.set()
            else:
                keep.append((seq, task))
        self._pending = keep

    async def _feeder(self) -> None:
        while not self._closing:
            task = None
            if self._room() and self._pending:
                self._drop_paused()
                task = self._next_pending()
            if task is None:  # whatever frees a slot or adds a task sets _changed: no polling
                self._changed.clear()
                await self._changed.wait()
                continue
            await self._admit(*task)

    async def _admit(self, seq: int, task: Task) -> None:
        tier = self.scheduler.admit(task.domain)
        self.counters["admitted"] += 1
        self.counters["long_sampled"] += tier == "long"
        from posttrain.domains.registry import get

        domain = get(task.domain)
        gid = self._group_ids.pop(seq, f"{self._prefix}{seq}")
        budget = (self.budgets or {}).get(task.domain)
        item = _Item(
            task,
            gid,
            tier,
            seq,
            time.perf_counter(),
            turn_budget=driver.turns_of(domain, budget),
            max_tokens=budget.tokens if budget else self.params.max_tokens,
            executes=domain.executes,
        )
        try:
            if domain.environment() is None:
                item.prompt_ids = await self.workers.encode(task.prompt)
            else:
                item.trajectories = await self._open(item, domain)
        except Exception as exc:  # a task that cannot start is masked and counted; the pipeline goes on
            await self._retry(item, "admit", exc)
            return
        await self._to_generate(item, self.q_generate)

    async def _open(self, item: _Item, domain: Any) -> list[Trajectory]:
        """The group's episodes: fresh environments reset on the task, their first
        observations in the prompt (samples that share one prompt share its encoding)."""
        envs = await asyncio.to_thread(driver.open_envs, domain, item.task, self.params.n)
        try:
            encoded: dict[str, tuple[int, ...]] = {}
            for _, obs in envs:
                if obs not in encoded:
                    encoded[obs] = await self.workers.encode(driver.first_messages(item.task, obs))
        except BaseException:
            driver.close_envs(e for e, _ in envs)
            raise
        item.prompt_ids = encoded[envs[0][1]]
        seconds = (self.budgets or {}).get(item.task.domain) or domain.budget
        return driver.start(envs, item.task, [encoded[o] for _, o in envs], item.turn_budget, seconds.seconds)

    # ---- stages --------------------------------------------------------
    async def _take_batch(self) -> list[_Item]:
        batch = [await self._get_either()]
        while len(batch) < self.cfg.generate_batch:
            nxt = self.q_continue.get_nowait() or self.q_generate.get_nowait()
            if nxt is None:
                break
            batch.append(nxt)
        return batch

    async def _get_either(self) -> _Item:
        """Next item from the continuation queue (priority) or the generate queue."""
        while not self._closing:
            item = self.q_continue.get_nowait() or self.q_generate.get_nowait()
            if item is not None:
                return item
            self._gen_ready.clear()
            await self._gen_ready.wait()
        raise asyncio.CancelledError  # closing

    async def _to_generate(self, item: _Item, queue: BoundedQueue[_Item]) -> None:
        await queue.put(item)
        self._gen_ready.set()

    def _requests(self, item: _Item) -> list[GenerationRequest]:
        return group_requests(item, self.params, self.seed)

    async def _generate_worker(self, index: int) -> None:
        """Each batch is split by token budget, shortest first, one engine call per
        budget: a 16-token row neither waits for nor pads to a 1024-token one."""
        while not self._closing:
            buckets: dict[int, list[_Item]] = {}
            for it in await self._take_batch():
                buckets.setdefault(it.max_tokens, []).append(it)
            for _, batch in sorted(buckets.items()):
                await self._generate_bucket(batch)

    async def _generate_bucket(self, batch: list[_Item]) -> None:
        """One engine call for `batch`. A call that fails over several groups is split in
        halves (`splits`), so a group whose own request fails (a prompt over the model's
        positions) is masked alone; a timeout or a single group's failure is retried."""
        requests = [self._requests(it) for it in batch]
        token = next(self._tokens)
        meter = self.meters["generate"]
        meter.begin(token)
        try:
            flat = [r for rs in requests for r in rs]
            call = self.workers.generate(flat)
            outs = await (asyncio.wait_for(call, self.cfg.generate_timeout_s) if self.cfg.generate_timeout_s else call)
            if len(outs) != len(flat):
                raise GenerationError(f"engine returned {len(outs)} groups for {len(flat)} requests")
        except Exception as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            meter.end(token, len(batch), error=True)
            if isinstance(exc, TimeoutError):
                exc = GenerationError(f"generation timed out after {self.cfg.generate_timeout_s}s")
            elif splits(batch):
                self.counters["generate_splits"] += 1
                half = len(batch) // 2
                await self._generate_bucket(batch[:half])
                await self._generate_bucket(batch[half:])
                return
            elif isinstance(exc, PromptTooLong) and batch[0].multi_turn and len(requests[0]) > 1:
                await self._generate_alone(batch[0], requests[0])
                return
            for it in batch:
                await self._retry(it, "generate", exc)
            return
        took = meter.end(token, len(batch))
        cursor = 0
        for it, rs in zip(batch, requests):
            got, cursor = outs[cursor : cursor + len(rs)], cursor + len(rs)
            it.timings["generate_s"] = it.timings.get("generate_s", 0.0) + took / len(batch)
            if it.multi_turn:  # the group's share of the call joins its episodes' own time
                driver.spent([t for ts in it.targets for t in ts], took / len(batch))
            await self._after_generate(it, got)

    async def _generate_alone(self, item: _Item, requests: list[GenerationRequest]) -> None:
        """A multi-turn group whose call failed with PromptTooLong: its trajectories' requests
        one by one. An episode whose context no longer fits the model after its own turns ends
        there, as truncated (`driver.out_of_context`); one whose first prompt does not fit is
        masked with kind "prompt"; the mates play on. Another failure retries the group (only
        the trajectories still due a turn generate again)."""
        try:
            for req, ts in zip(requests, item.targets):
                try:
                    driver.add_actions([ts], await self.workers.generate([req]))
                except PromptTooLong as exc:
                    self._no_room(item, ts, exc)
        except Exception as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            await self._retry(item, "generate", exc)
            return
        await self.q_execute.put(item)

    def _no_room(self, item: _Item, ts: Sequence[Trajectory], exc: PromptTooLong) -> None:
        """The trajectories `ts`, whose request the engine can never take, end: as truncated
        after turns of their own, masked (kind "prompt") before any."""
        assert item.trajectories is not None
        for t in ts:
            if t.turns:
                driver.out_of_context(t)
                continue
            i = next(k for k, u in enumerate(item.trajectories) if u is t)
            driver.mask(t, "prompt")
            item.decided[i] = verdict_of(capture(exc))
            self.counters["masked_rollouts"] += 1

    async def _after_generate(self, item: _Item, got: list[list[Completion]]) -> None:
        if item.multi_turn:
            driver.add_actions(item.targets, got)
        else:
            item.completions = list(got[0])
        await self.q_execute.put(item)

    async def _execute_worker(self) -> None:
        while not self._closing:
            item = await self.q_execute.get()
            token = next(self._tokens)
            self.meters["execute"].begin(token)
            try:
                retried = await self._execute_item(item)
            except Exception as exc:  # the worker call itself failed: infra for the whole call
                if isinstance(exc, asyncio.CancelledError):
                    raise
                self.meters["execute"].end(token, error=True)
                await self._retry(item, "execute", exc)
                continue
            item.timings["execute_s"] = item.timings.get("execute_s", 0.0) + self.meters["execute"].end(token)
            if retried:
                continue
            if any(not t.done for t in item.trajectories or ()):
                await self._to_generate(item, self.q_continue)
            else:
                await self.q_verify.put(item)

    async def _execute_item(self, item: _Item) -> bool:
        """Step the group's episodes (multi-turn), then, once every episode is done (or for a
        single-turn group), run the execute step: True when some sample failed for the infra
        and is run again after a backoff (`_retry_samples`)."""
        if item.multi_turn:
            failed = await self._step_envs(item)
            if failed and self._retry_samples(item, failed):
                return True
            if not item.executes or any(not t.done for t in item.trajectories or ()):
                return False
        failed = await self._run_execute(item)  # single-turn: the ExecuteFn decides whether anything runs
        return bool(failed) and self._retry_samples(item, failed)

    def _retry_samples(self, item: _Item, failed: Mapping[int, ErrorRecord]) -> bool:
        """After the infra failures `failed` (sample -> record) of some of the group's samples:
        True when the stage runs again for them after a backoff (the others keep what they
        have); else each is masked alone and the group goes on (False)."""
        delay = take_retry(self.cfg, item, "execute", next(iter(failed.values())), self.counters)
        if delay is not None:
            for i in failed:
                item.retried[i] = item.retried.get(i, 0) + 1
            assert self._tg is not None
            self._tasks.append(self._tg.create_task(self._requeue("execute", item, delay)))
            return True
        for i, rec in failed.items():
            item.decided[i] = verdict_of(rec)
            if item.trajectories is not None:
                driver.mask(item.trajectories[i], rec.kind)
        self.counters["masked_rollouts"] += len(failed)
        self.counters["masked_execute"] += len(failed)
        item.sandbox_failed = True  # a failing sandbox degrades its domain (recorded once the group verified)
        return False

    def _to_execute(self, item: _Item) -> list[Completion]:
        """What the execute stage runs: the completions, or each episode's last action."""
        if item.trajectories is None:
            return item.completions
        return [driver.exec_action(t) for t in item.trajectories]

    async def _run_execute(self, item: _Item) -> dict[int, ErrorRecord]:
        """Run the execute step of each sample not run yet and not decided (a retry runs only
        those). A run the model's output broke decides its sample (scored 0); returns the
        infra failures, sample -> record."""
        comps = self._to_execute(item)
        if not item.execs:
            item.execs = [_PENDING] * len(comps)
        todo = [i for i, e in enumerate(item.execs) if e is _PENDING and i not in item.decided]
        got = await self.workers.execute(item.task, [comps[i] for i in todo]) if todo else ()
        failed: dict[int, ErrorRecord] = {}
        for i, res in zip(todo, got):
            if not isinstance(res, ErrorRecord):
                item.execs[i] = res
            elif res.kind == "model":
                item.execs[i] = None
                self._fault(item, i, res)
            else:
                failed[i] = res
        return failed

    def _fault(self, item: _Item, i: int, rec: ErrorRecord) -> None:
        """Sample `i`'s output made host code raise: scored 0 with the reason, counted."""
        item.decided[i] = verdict_of(rec)
        self.counters["model_faults"] += 1

    async def _step_envs(self, item: _Item) -> dict[int, ErrorRecord]:
        """Step every trajectory whose last action is not stepped yet, concurrently (a retry
        after an infra error steps only those). An action that made its environment raise
        ends that episode as a model fault (`driver.step`); returns the infra failures,
        trajectory index -> record."""
        assert item.trajectories is not None
        pending = [(i, t) for i, t in enumerate(item.trajectories) if t.awaiting_step]
        stepped = await asyncio.gather(*(asyncio.to_thread(driver.step, t) for _, t in pending), return_exceptions=True)
        failed: dict[int, ErrorRecord] = {}
        for (i, t), got in zip(pending, stepped):
            if isinstance(got, BaseException):  # driver.step raises only infra errors
                failed[i] = capture(got, "sandbox")
                continue
            if not t.done:  # the observation joins the context through the chat template
                await self._observe(t)
            if t.fault is not None and i not in item.decided:
                self._fault(item, i, ErrorRecord("model", t.fault))
            elif t.error is not None and i not in item.decided:
                item.decided[i] = Verdict(None, t.error, "the observation could not be encoded")
                self.counters["masked_rollouts"] += 1
        return failed

    async def _observe(self, t: Trajectory) -> None:
        """The last observation's tokens join the context; an observation that cannot be
        encoded ends the episode (`driver.observe`: blamed by cause)."""
        try:
            rendered = [await self.workers.encode(m) for m in t.render_inputs()]
        except Exception as exc:
            driver.end_failed(t, blame(exc, "infra"))
            return
        t.add_observation(*rendered)

    async def _verify_worker(self) -> None:
        while not self._closing:
            item = await self.q_verify.get()
            if item.episodes is None:
                item.episodes = self._episodes(item)
            episodes = item.episodes
            _close_envs(item, self.workers)  # free their sandbox sessions before verification needs slots
            todo = [i for i in range(len(episodes)) if i not in item.decided and i not in item.verified]
            token = next(self._tokens)
            self.meters["verify"].begin(token)
            try:
                got = await self._verify_some(item.task, [episodes[i] for i in todo])
            except Exception as exc:
                if isinstance(exc, asyncio.CancelledError):
                    raise
                self.meters["verify"].end(token, error=True)
                await self._retry(item, "verify", exc)
                continue
            item.timings["verify_s"] = item.timings.get("verify_s", 0.0) + self.meters["verify"].end(token)
            item.verified.update(zip(todo, got))
            if self._retry_verdicts(item, todo):
                continue
            final = list(item.verified.values())
            if final or item.sandbox_failed:  # infra failed: its sandbox past retries, or its verifier
                failed = item.sandbox_failed or any(v.error_kind == "verifier" for v in final)
                self.scheduler.record_verification(item.task.domain, failed)
            self.counters["model_faults"] += sum(v.fault is not None for v in final)
            verdicts = {**item.decided, **item.verified}
            await self._finish(item, [verdicts[i] for i in range(len(episodes))], episodes)

    def _retry_verdicts(self, item: _Item, todo: Sequence[int]) -> bool:
        """After verifying the samples `todo`: True when some got a transient infra verdict (a
        VerifierError, an OSError or a timeout in the verifier: `retry_kinds`) and verification
        runs again for those alone after a backoff (`take_retry`: `max_retries`, `backoff_s`
        doubling); False when none did or the retries are spent (their masked verdicts stand)."""
        again = retry_kinds(item.verified, todo)
        if not again:
            return False
        first = item.verified[again[0]]
        delay = take_retry(self.cfg, item, "verify", ErrorRecord("verifier", first.error or ""), self.counters)
        if delay is None:
            return False
        for i in again:
            del item.verified[i]
            item.retried[i] = item.retried.get(i, 0) + 1
        assert self._tg is not None
        self._tasks.append(self._tg.create_task(self._requeue("verify", item, delay)))
        return True

    async def _verify_some(self, task: Task, episodes: list[Episode]) -> Sequence[Verdict]:
        """The verdicts of `episodes` (none: no call)."""
        if not episodes:
            return ()
        if self._cheap(task.domain):  # microseconds: no thread hop
            return self.workers.verify_now(task, episodes)
        return await self.workers.verify(task, episodes)

    def _cheap(self, domain: str) -> bool:
        """The domain's verifier is called in the event loop's thread (`Workers.cheap_verifier`)."""
        if domain not in self._cheap_domains:
            self._cheap_domains[domain] = self.workers.cheap_verifier(domain)
        return self._cheap_domains[domain]

    def _episodes(self, item: _Item) -> list[Episode]:
        if item.trajectories is not None:
            if item.executes and item.execs:
                return [driver.episode(t, _ran(e)) for t, e in zip(item.trajectories, item.execs)]
            return [driver.episode(t) for t in item.trajectories]
        execs = [_ran(e) for e in item.execs] or [None] * len(item.completions)
        return [Episode(c.text, finish_reason=c.finish_reason, exec_result=e) for c, e in zip(item.completions, execs)]

    # ---- endings -------------------------------------------------------
    async def _finish(self, item: _Item, verdicts: Sequence[Verdict], episodes: Sequence[Episode] = ()) -> None:
        _close_envs(item, self.workers)
        for t in item.trajectories or ():
            self.counters["prompt_computed"] += t.prompt_computed
            self.counters["prompt_new"] += t.prompt_new
        self.counters["masked_groups"] += all(v.score is None for v in verdicts)
        result = finished_group(item, self.params.n, verdicts, episodes)
        self.scheduler.finish(item.task.domain)
        self.counters["finished"] += 1
        self._changed.set()
        await self.results.put(result)
        self._arrived.set()

    async def _retry(self, item: _Item, stage: str, exc: BaseException) -> None:
        """A stage call that failed for the whole item (admission, its engine request, a
        worker call): retried after a backoff, then every sample not already decided is
        masked (a sample scored for a model fault keeps its score)."""
        rec = capture(exc, "sandbox" if stage == "execute" else "infra")
        delay = None if stage == "admit" else take_retry(self.cfg, item, stage, rec, self.counters)
        if delay is not None:
            item.group_retries += 1
            assert self._tg is not None
            self._tasks.append(self._tg.create_task(self._requeue(stage, item, delay)))
            return
        n_samples = len(item.completions) or (len(item.trajectories) if item.trajectories else self.params.n)
        masked = [i for i in range(n_samples) if i not in item.decided]
        self.counters["masked_rollouts"] += len(masked)
        if stage == "execute":  # a sandbox that keeps failing degrades its domain like a failing verifier
            self.counters["masked_execute"] += len(masked)
            self.scheduler.record_verification(item.task.domain, True)
        verdict = Verdict(None, rec.kind, rec.message)
        await self._finish(item, [item.decided.get(i, verdict) for i in range(n_samples)])

    async def _requeue(self, stage: str, item: _Item, delay: float) -> None:
        await asyncio.sleep(delay)
        queue = {"generate": self.q_generate, "execute": self.q_execute, "verify": self.q_verify}[stage]
        if stage == "generate":
            await self._to_generate(item, self.q_continue if item.multi_turn and item.trajectories else self.q_generate)
        else:
            await queue.put(item)

    # ---- the two ways to use it: a fixed set, or a stream ----------------
    async def run_groups(self, tasks: Sequence[Task], prefix: str | None = None) -> list[GroupResult | None]:
        """Run a fixed set of tasks (long tier first); results in task order,
        None for a task whose domain is paused (counted as paused_skipped).
        With `prefix`, group ids are prefix + the task's index in `tasks`."""
        seqs = [next(self._seq) for _ in tasks]
        if prefix is not None:
            self._group_ids.update({seq: f"{prefix}{i}" for i, seq in enumerate(seqs)})
        order = sorted(range(len(tasks)), key=lambda i: (self.scheduler.tier(tasks[i].domain) != "long", i))
        self._pending.extend((seqs[i], tasks[i]) for i in order)
        self._changed.set()
        wanted, got = set(seqs), {}
        while wanted - set(got) - set(self._skipped):
            res = self.results.get_nowait()
            if res is None:  # nothing queued: sleep until a result or a skip arrives
                self._arrived.clear()
                await self._arrived.wait()
                continue
            got[res.seq] = res
        return [got.get(s) for s in seqs]

    def submit(self, tasks: Sequence[Task], group_ids: Sequence[str], front: bool = False) -> list[int]:
        """Add `tasks` to admit, their groups named `group_ids`, behind every pending task
        (`front`: before them, in order: a re-queued task). Returns their admission seqs;
        their results come out of `drain` (the continuous mode, pipeline/continuous.py)."""
        if len(group_ids) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks, {len(group_ids)} group ids")
        seqs = [next(self._seq) for _ in tasks]
        self._group_ids.update(zip(seqs, group_ids))
        if front:
            self._pending.extendleft(reversed(list(zip(seqs, tasks))))
        else:
            self._pending.extend(zip(seqs, tasks))
        self._changed.set()
        return seqs

    async def drain(self) -> tuple[list[GroupResult], list[int]]:
        """Sleep until some group finished or some submitted task was skipped (its domain
        paused), then return every finished group queued and every skipped seq since the
        last call. Not to be mixed with `run_groups`, which consumes the same results."""
        while True:
            got: list[GroupResult] = []
            while (res := self.results.get_nowait()) is not None:
                got.append(res)
            skipped, self._skipped = self._skipped, []
            if got or skipped:
                return got, skipped
            self._arrived.clear()
            await self._arrived.wait()

    def stats(self) -> PipelineStats:
        queues = (self.q_generate, self.q_continue, self.q_execute, self.q_verify, self.results)
        return PipelineStats(
            tuple(m.stats() for m in self.meters.values()),
            tuple(q.stats() for q in queues),
            dict(self.counters),
            self.scheduler.cap.value,
        )


def take_retry(
    cfg: PipelineConfig, item: _Item, stage: str, rec: ErrorRecord, counters: dict[str, int]
) -> float | None:
    """The backoff before `item`'s `stage` runs again after the error `rec`, the attempt and the
    retry counted; None when it is not retried (a config or task error, or its retries spent)."""
    n = item.attempts.get(stage, 0)
    if rec.kind in NOT_RETRIED or n >= cfg.max_retries:
        return None
    item.attempts[stage] = n + 1
    counters["retries"] += 1
    return cfg.backoff_s * (2**n)


def retry_kinds(verdicts: Mapping[int, Verdict], todo: Sequence[int]) -> list[int]:
    """The samples of `todo` whose verdict is a retriable infra error (masked, of a kind a retry
    can change: not config, task, prompt or model)."""
    return [i for i in todo if verdicts[i].score is None and verdicts[i].error_kind not in (None, *NOT_RETRIED)]


def splits(batch: Sequence[_Item]) -> bool:
    """Whether a failed engine call over `batch` is split in halves (more than one group)."""
    return len(batch) > 1


_PENDING: Any = object()
"""An execute-stage result not produced yet (the sample has not run, or its run failed)."""


def _ran(result: Any) -> Any:
    """An execute-stage result as the verifier reads it (None for a run that never produced one)."""
    return None if result is _PENDING else result


def group_requests(item: _Item, params: SamplingParams, seed: int | None) -> list[GenerationRequest]:
    """The generation requests of a group's next turn (one request for a single-turn group),
    seeded by (seed, group id, generation attempt): the same whatever the batching."""
    base = None if seed is None else stable_hash("group", seed, item.group_id, item.attempts.get("generate", 0))
    params = dataclasses.replace(params, max_tokens=item.max_tokens)
    if item.trajectories is not None:
        reqs, item.targets = driver.requests(item.trajectories, params, base, item.group_id)
        return reqs
    return [GenerationRequest(item.prompt_ids, dataclasses.replace(params, seed=base), item.group_id)]


def finished_group(item: _Item, n: int, verdicts: Sequence[Verdict], episodes: Sequence[Episode] = ()) -> GroupResult:
    """A finished group: one Rollout per verdict (a group masked before generation gets `n`
    empty completions with finish reason "error"), the group's timings on each."""
    if item.multi_turn and item.trajectories:
        comps = [t.completion() for t in item.trajectories]
    else:
        comps = item.completions or [Completion(item.prompt_ids, (), "", (), "error", 0) for _ in range(n)]
    item.timings["total_s"] = time.perf_counter() - item.admitted_at
    item.timings["queue_s"] = max(
        0.0, item.timings["total_s"] - sum(item.timings.get(k, 0.0) for k in ("generate_s", "execute_s", "verify_s"))
    )
    rollouts = []
    for i, (c, v) in enumerate(zip(comps, verdicts)):
        timings = dict(item.timings)
        first = ""
        if item.multi_turn and item.trajectories:
            t = item.trajectories[i]
            timings["turns"] = float(len(t.turns))
            timings["episode_s"] = round(t.own_s, 6)
            timings["prompt_computed"], timings["prompt_new"] = float(t.prompt_computed), float(t.prompt_new)
            if t.timed_out:
                timings["timed_out"] = 1.0
            mask, first = tuple(t.mask), t.first_observation
        else:
            mask = None
        ep = episodes[i] if episodes else None
        rollouts.append(
            Rollout(
                item.task,
                c,
                item.group_id,
                v.score,
                v.error_kind,
                v.error,
                timings,
                mask,
                ep.exec_result if ep else None,
                ep.turns if ep else (),
                first,
                item.group_retries + item.retried.get(i, 0),
                id=rollout_id(item.group_id, i),
            )
        )
    version = min((c.model_version for c in comps), default=0)
    return GroupResult(item.seq, item.tier, tuple(rollouts), version)


def _close_envs(item: _Item, workers: Workers) -> None:
    """Close every environment of a group once (a terminal env holds a sandbox
    session, and so a pool slot, until closed), and end its episodes' engine sessions."""
    if item.trajectories is not None and not item.closed:
        item.closed = True
        driver.close_envs(t.env for t in item.trajectories)
        workers.end_sessions(driver.session_keys(item.group_id, len(item.trajectories)))
