"""The asynchronous rollout pipeline: generate -> execute -> verify over bounded queues.

Invariant: every admitted group leaves the pipeline exactly once, as one GroupResult holding
one Rollout per sample: scored, or masked with a typed error after its retries ran out (never
scored 0 for an infra error). What comes next for a group (the stage order, retries and their
backoffs, blame by cause, the split of a failed engine call, the rollouts) is the group
lifecycle's (`GroupRun.next_call` / `feed` and `generation`, pipeline/group.py); the pipeline
admits (a domain's quota, the highest priority first: `Scheduler.next_admissible`), maps each
call kind to its queue (`_route`) and runs the calls concurrently. Every background task is
owned by the pipeline's asyncio.TaskGroup, so a crash in any stage cancels its siblings and
surfaces from `async with`; a stage never blocks the event loop (its workers' calls are
awaitable; only a verifier that declares itself `cheap`, microseconds, is called inline); no
task polls: the feeder and `run_groups` sleep on events, and a generation call that waits for
more groups (`_gather`) sleeps on one with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget
from posttrain.envs import driver
from posttrain.envs.base import Trajectory
from posttrain.errors import blame
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
    Outcome,
    RetryPolicy,
    Step,
    Verify,
    Wait,
    by_budget,
    generation,
    group_seed,
)
from posttrain.pipeline.metrics import StageMeter, StageStats
from posttrain.pipeline.queues import BoundedQueue, QueueStats
from posttrain.pipeline.scheduler import EventSink, Scheduler
from posttrain.pipeline.workers import Verdict, Workers
from posttrain.types import Episode, GenerationRequest, SamplingParams, Task

__all__ = ["COUNTERS", "GroupResult", "Pipeline", "PipelineStats"]


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
            out.update({f"{s.name}_items": s.items, f"{s.name}_per_s": round(s.throughput, 3)})
            out.update({f"{s.name}_p50_s": round(s.p50_s, 5), f"{s.name}_p99_s": round(s.p99_s, 5)})
            out[f"{s.name}_idle_share"] = round(1.0 - s.utilisation, 4)
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
        """Per-domain budgets (None: `params.max_tokens` and the declared turns for every domain)."""
        self._events = events
        self._prefix = group_prefix
        self.seed = seed
        """With a seed, each group's samples are seeded by (seed, group id, attempt): `group_seed`."""
        self.q_generate: BoundedQueue[GroupRun] = BoundedQueue("generate", config.queue_size)
        self.q_continue: BoundedQueue[GroupRun] = BoundedQueue("continue", config.max_inflight + 1)
        self.q_execute: BoundedQueue[GroupRun] = BoundedQueue("execute", config.queue_size)
        self.q_verify: BoundedQueue[GroupRun] = BoundedQueue("verify", config.queue_size)
        self.results: BoundedQueue[GroupResult] = BoundedQueue("results", config.queue_size)
        self.meters = {
            k: StageMeter(k, config.calls(k), config.latency_window) for k in ("generate", "execute", "verify")
        }
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._seq = itertools.count()
        self._tokens = itertools.count()
        self._changed = asyncio.Event()
        """Set when a slot frees or tasks are added (the feeder's wake-up)."""
        self._arrived = asyncio.Event()
        """Set when a result is queued or a task is skipped (run_groups' wake-up)."""
        self._gen_ready = asyncio.Event()
        self._moved = asyncio.Event()
        """Set when a group moves between stages or the feeder goes idle (a gathering call's wake-up)."""
        self._upstream: set[int] = set()
        """Groups (by id) in the execute stage or backing off: each may ask for a turn next."""
        self._feeding = False
        """The feeder is admitting (not asleep waiting for room or tasks)."""
        self._last_call_s: float | None = None
        """Seconds of the last engine call (`gather_share` scales the wait by it)."""
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task] = []
        self._pending: deque[tuple[int, Task]] = deque()
        self._closing = False
        self._skipped: list[int] = []
        self._group_ids: dict[int, str] = {}
        self._cheap_domains: dict[str, bool] = {}
        self._policy = RetryPolicy.of(config)

    # ---- ownership -----------------------------------------------------
    async def __aenter__(self) -> Pipeline:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        spawn = self._tg.create_task
        # concurrent calls per stage: the workers, or with elastic pools the pool's max (pipeline/ray.py)
        self._tasks += [spawn(self._generate_worker(i)) for i in range(self.cfg.calls("generate"))]
        self._tasks += [spawn(self._execute_worker()) for _ in range(self.cfg.calls("execute"))]
        self._tasks += [spawn(self._verify_worker()) for _ in range(self.cfg.calls("verify"))]
        self._tasks.append(spawn(self._feeder()))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True  # also stops a loop whose cancellation wait_for swallowed (Python 3.11)
        for t in self._tasks:
            t.cancel()
        assert self._tg is not None
        await self._tg.__aexit__(*exc)

    # ---- admission -----------------------------------------------------
    def _room(self) -> bool:
        """Room for another group under the in-flight cap (`AdaptiveCap`, by the fullest queue)."""
        fill = max(q.fill() for q in (self.q_generate, self.q_execute, self.q_verify))
        return self.counters["admitted"] - self.counters["finished"] < self.scheduler.cap.update(fill)

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
                self._feeding = False
                self._moved.set()
                self._changed.clear()
                await self._changed.wait()
                continue
            self._feeding = True
            await self._admit(*task)

    async def _admit(self, seq: int, task: Task) -> None:
        tier = self.scheduler.admit(task.domain)
        gid = self._group_ids.pop(seq, f"{self._prefix}{seq}")
        budget = (self.budgets or {}).get(task.domain)
        item = GroupRun.admit(
            task, gid, tier, seq, self.params, self._policy, self.counters, budget, self.workers.end_sessions
        )
        while isinstance(call := item.next_call(), Open | Encode):  # a task that cannot start is masked
            try:
                if isinstance(call, Open):
                    item.feed(await asyncio.to_thread(call.envs))
                else:
                    item.feed([await self.workers.encode(p) for p in call.prompts])
            except Exception as exc:
                item.feed(exc)
        await self._route(item, call)  # a first turn (an episode group's too) to the generate queue

    # ---- stages --------------------------------------------------------
    async def _take_batch(self) -> list[GroupRun]:
        """Up to `generate_batch` groups, the continuation queue's first (sleeps until one is
        queued), then those that join while groups are still on their way (`_gather`)."""
        batch: list[GroupRun] = []
        while len(batch) < self.cfg.generate_batch:
            if not batch and self._closing:
                raise asyncio.CancelledError
            nxt = self.q_continue.get_nowait() or self.q_generate.get_nowait()
            if nxt is not None:
                batch.append(nxt)
            elif batch:
                break
            else:
                self._gen_ready.clear()
                await self._gen_ready.wait()
        await self._gather(batch)
        return batch

    def _coming(self) -> bool:
        """Whether a group may still join the generate queues soon: the feeder is admitting, or a
        group is in an environment or execute step or backing off (it may ask for a turn next)."""
        return self._feeding or bool(self._upstream)

    async def _gather(self, batch: list[GroupRun]) -> None:
        """Add to `batch` the groups that reach the generate queues while `_coming`, waiting at most
        `gather_share` of the last call's seconds (`gather_max_s` at most, and for the first call),
        until `generate_batch` groups: a step's groups, and every episode's next turn, in one call."""
        cfg, loop = self.cfg, asyncio.get_running_loop()
        if not cfg.gather_share or len(batch) >= cfg.generate_batch or not self._coming():
            return
        last = self._last_call_s
        limit = cfg.gather_max_s if last is None else min(cfg.gather_max_s, cfg.gather_share * last)
        start = loop.time()
        deadline, first = start + limit, len(batch)
        while len(batch) < cfg.generate_batch:
            nxt = self.q_continue.get_nowait() or self.q_generate.get_nowait()
            if nxt is not None:
                batch.append(nxt)
                continue
            left = deadline - loop.time()
            if left <= 0 or not self._coming() or self._closing:
                break
            self._moved.clear()
            try:
                await asyncio.wait_for(self._moved.wait(), left)
            except TimeoutError:
                pass
        self.counters["gathered"] += len(batch) - first
        self.counters["gather_ms"] += round((loop.time() - start) * 1000)

    async def _generate_worker(self, index: int) -> None:
        """Each batch is split by token budget, shortest first (`group.by_budget`: budgets
        within 2x share a call): a 16-token row neither waits for nor pads to a 1024-token one."""
        while not self._closing:
            for batch in by_budget(await self._take_batch(), _turn_tokens):
                await self._generate_bucket(batch)

    async def _generate_bucket(self, batch: list[GroupRun]) -> None:
        """`batch`'s engine calls (`group.generation`: a call that fails over several groups is
        split in halves, so only the group whose own request fails is masked; a timeout or a
        single group's failure is retried), then each group on to its next stage."""
        plan = generation(batch, self.params, self._seed)
        call = next(plan)
        while True:
            try:
                call = plan.send(await self._engine_call(*call))
            except StopIteration:
                break
        for it in batch:
            await self._route(it)

    def _seed(self, item: GroupRun) -> int | None:
        return group_seed(item, self.seed)

    async def _metered(self, stage: str, call: Awaitable[Any], items: int = 1) -> tuple[Any, float]:
        """What the worker call `call` returned (or the exception that failed it: infra for the
        whole call; 0 seconds) and the seconds it took, on the stage's meter."""
        token = next(self._tokens)
        self.meters[stage].begin(token)
        try:
            got = await call
        except Exception as exc:  # a cancellation is no Exception: it propagates
            self.meters[stage].end(token, items, error=True)
            return exc, 0.0
        return got, self.meters[stage].end(token, items)

    async def _engine_call(self, groups: int, requests: list[GenerationRequest]) -> Outcome:
        """What came of one engine call (its completions, or what it raised) and its seconds."""
        call, timeout = self.workers.generate(requests), self.cfg.generate_timeout_s
        got, took = await self._metered("generate", asyncio.wait_for(call, timeout) if timeout else call, groups)
        if not isinstance(got, BaseException):
            self._last_call_s = took
        if isinstance(got, TimeoutError):
            got = TimeoutError(f"generation timed out after {timeout}s")
        return got, took

    async def _execute_worker(self) -> None:
        """A group's environment steps, then (once every episode is done, or for a single-turn
        group) its execute step, in one pass while it asks for them."""
        while not self._closing:
            item = await self.q_execute.get()
            while isinstance(call := item.next_call(), Step | Execute):
                item.feed(
                    *await self._metered(
                        "execute", self._step_envs(call) if isinstance(call, Step) else self._execute(call)
                    )
                )
            await self._route(item, call)

    async def _execute(self, call: Execute) -> Sequence[Any]:
        """The execute step's results (none to run: no call; the ExecuteFn decides whether anything runs)."""
        return await self.workers.execute(call.task, call.completions) if call.completions else ()

    async def _step_envs(self, call: Step) -> list[BaseException | None]:
        """Step every trajectory whose last action is not stepped yet, concurrently (a retry
        after an infra error steps only those). An action that made its environment raise
        ends that episode as a model fault (`driver.step`); returns, per trajectory, what
        `driver.step` raised (an infra error) or None."""
        stepped = await asyncio.gather(
            *(asyncio.to_thread(driver.step, t) for _, t in call.pending), return_exceptions=True
        )
        out: list[BaseException | None] = []
        for (_, t), got in zip(call.pending, stepped):
            if isinstance(got, BaseException):  # driver.step raises only infra errors
                out.append(got)
                continue
            if not t.done:  # the observation joins the context through the chat template
                await self._observe(t)
            out.append(None)
        return out

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
            call = item.next_call()  # the group's envs closed: their sandbox slots free
            if not isinstance(call, Verify):
                await self._route(item, call)
                continue
            item.feed(*await self._metered("verify", self._verify_some(call.task, call.episodes)))
            await self._route(item)

    async def _verify_some(self, task: Task, episodes: list[Episode]) -> Sequence[Verdict]:
        """The verdicts of `episodes` (none: no call); a verifier that declares itself cheap
        (`Workers.cheap_verifier`, microseconds) is called in the event loop's thread."""
        if not episodes:
            return ()
        if task.domain not in self._cheap_domains:
            self._cheap_domains[task.domain] = self.workers.cheap_verifier(task.domain)
        if self._cheap_domains[task.domain]:
            return self.workers.verify_now(task, episodes)
        return await self.workers.verify(task, episodes)

    # ---- routing: each call kind to its queue ---------------------------
    async def _route(self, item: GroupRun, call: Call | None = None) -> None:
        """`item` to the queue of the call it asks for next (`call`: asked already): a turn to
        the generate queue (an episode's turn to the continuation queue), a step or execute
        step to the execute queue, a verification to the verify queue; a Wait back after its
        seconds; a finished group out."""
        call = call or item.next_call()
        self._upstream.discard(id(item))
        if isinstance(call, Step | Execute | Wait):
            self._upstream.add(id(item))  # it may come back for a turn
        self._moved.set()
        if isinstance(call, Done):
            if call.health is not None:  # infra failed: its sandbox past retries, or its verifier
                self.scheduler.record_verification(item.task.domain, call.health)
            self.scheduler.finish(item.task.domain)
            self._changed.set()
            await self.results.put(call.result)
            self._arrived.set()
        elif isinstance(call, Wait):
            assert self._tg is not None
            self._tasks.append(self._tg.create_task(self._later(item, call.seconds)))
        elif isinstance(call, Generate):
            await (self.q_continue if call.turn else self.q_generate).put(item)
            self._gen_ready.set()
        elif isinstance(call, Step | Execute):
            await self.q_execute.put(item)
        elif isinstance(call, Verify):
            await self.q_verify.put(item)
        else:
            raise TypeError(f"pipeline: unexpected call {call!r}")

    async def _later(self, item: GroupRun, delay: float) -> None:
        """`item` routed again after `delay` seconds (a task the TaskGroup owns)."""
        await asyncio.sleep(delay)
        await self._route(item)

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


def _turn_tokens(item: GroupRun) -> int:
    """The token budget of the turn `item` is due (its next call is a Generate)."""
    call = item.next_call()
    assert isinstance(call, Generate)
    return call.tokens
