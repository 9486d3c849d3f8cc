"""Continuous asynchronous rollouts (pipeline.mode async): one long-lived pipeline streams
groups while the trainer trains; the trainer takes a batch when enough groups are finished.

Invariant: no group is trained more than k = pipeline.max_staleness weight versions after
its admission, nor on completions more than k versions older than the trainer's weights
(`rollout.too_stale`, the one staleness check, on the older of the two versions). The
bound is kept without losing long tasks: `take` waits for every outstanding group that the
coming update would push past the bound (staleness is counted from admission, so a group
that has to run long is waited for, not dropped); only a finished group that is still too
stale (a remote engine whose completions lag their admission) is re-queued, once, at the
front, and dropped the second time, through `Continuous.record_dropped`, counted by domain
and completion length. Each ticket leaves once: trained, re-queued (a new group id, + "r1"),
dropped, or skipped (its domain paused). Every task drawn is registered in `ledger`
(pipeline/draws.py) at the step that drew it and bound to its group at admission (a re-queued
group's new id to the same draw); a drop for staleness or a pause is its draw's fate there, the
loop decides the fates of the groups `take` returns, and draws still outstanding when the run
stops are the loop's to drop ("stopped"). A checkpoint carries, for every draw still open, the
pool's state before the draw that made it and the group it was bound to last (`state_dict`);
a resumed run rebuilds those tasks from it (the same prompts, checked by task id) and
re-admits them first (`resume`): each draw keeps its id and gets a new group (its last group
id + "~" + the checkpoint's loop step), so its fate is still decided once. At most
(k + 1) x per_step groups are outstanding (admitted, not trained), so the pipeline never
runs further ahead than the bound allows.
Tasks are drawn in the caller's thread only (`take`'s `draw`): the pool's state and draw
order stay the loop's. The pipeline and its collector run in one background event loop;
a crash there surfaces from the next `take`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget, stable_hash
from posttrain.pipeline.core import GroupResult, Pipeline
from posttrain.pipeline.draws import DrawLedger
from posttrain.pipeline.scheduler import EventSink
from posttrain.pipeline.step import make_scheduler
from posttrain.pipeline.workers import Workers
from posttrain.rollout import Rollout, staleness, too_stale
from posttrain.trace import DrawRecord
from posttrain.types import SamplingParams, Task

LENGTH_BUCKETS = ((16, "0-15"), (64, "16-63"), (256, "64-255"), (1024, "256-1023"))
"""Completion length buckets (mean tokens of a group's samples) of the staleness counts; 1024+ above."""


def length_bucket(tokens: float) -> str:
    """The bucket label of a group whose samples average `tokens` completion tokens."""
    return next((name for top, name in LENGTH_BUCKETS if tokens < top), "1024+")


@dataclass
class _Ticket:
    """One admitted group until it leaves (`take`)."""

    task: Task
    draw: str
    """Its draw id in the ledger (the same across a re-queue)."""
    group_id: str
    admitted: int
    """The trainer's weight version when it was admitted (staleness counts from here)."""
    requeued: int = 0
    result: GroupResult | None = None
    skipped: bool = False


class Continuous:
    """`take(draw, params, step)` returns the groups to train on at loop step `step`."""

    def __init__(
        self,
        config: PipelineConfig,
        workers: Workers,
        pool: Any,
        seed: int,
        per_step: int,
        version: Callable[[], int],
        events: EventSink | None = None,
        budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        self.config, self.workers, self.seed, self.budgets = config, workers, seed, budgets
        self.k = config.max_staleness
        self.per_step = per_step
        self.capacity = (self.k + 1) * per_step
        """Most outstanding groups (admitted, not trained)."""
        self.version = version
        """The trainer's weight version, as the engine acknowledged it."""
        self.scheduler = make_scheduler(config, pool, events)
        self.pool = pool
        self.ledger = DrawLedger()
        """Every task drawn, from its draw to its fate (`DrawLedger.account`, which the loop calls,
        decides the returned groups')."""
        self.tickets: dict[int, _Ticket] = {}  # by admission seq, outstanding
        self.counts: dict[str, Counter[str]] = {k: Counter() for k in ("drawn", "trained", "requeued", "dropped")}
        """Per domain, over the run: groups drawn, trained, re-queued and dropped for staleness."""
        self.lengths: dict[str, Counter[str]] = {k: Counter() for k in ("requeued", "dropped")}
        """Per completion length bucket, over the run: groups re-queued and dropped for staleness."""
        self._step: dict[str, float] = {}
        self._batches: list[tuple[int, dict[str, Any], int, list[str]]] = []
        """(loop step, the pool's state before the draw, tasks drawn, their draw ids) of every
        draw that still has an open draw: what a checkpoint needs to rebuild the tasks in flight."""
        self._rerun: list[tuple[Task, str, str]] = []
        """(task, draw id, group id) re-admitted first at the next take (`resume`)."""
        self._at = 0  # the loop step of the current take
        self._cond = threading.Condition()
        self._arrived: dict[int, GroupResult] = {}
        self._skipped: set[int] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-stream", daemon=True)
        self._thread.start()
        self._pipe: Pipeline | None = None
        self._serving: Any = None
        self._stop: asyncio.Event | None = None

    # ---- the background pipeline ----------------------------------------
    def _start(self, params: SamplingParams) -> None:
        ready = threading.Event()
        self._serving = asyncio.run_coroutine_threadsafe(self._serve(params, ready), self._loop)
        self._serving.add_done_callback(lambda _: self._wake())
        while not ready.wait(0.05):
            if self._serving.done():
                self._serving.result()  # raises what stopped it

    async def _serve(self, params: SamplingParams, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        seed = stable_hash("rollout", self.seed)
        async with Pipeline(self.config, self.workers, params, self.scheduler, seed=seed, budgets=self.budgets) as pipe:
            self._pipe = pipe
            async with asyncio.TaskGroup() as tg:  # owns the collector: its crash surfaces here
                collector = tg.create_task(self._collect(pipe))
                ready.set()
                await self._stop.wait()
                collector.cancel()

    async def _collect(self, pipe: Pipeline) -> None:
        """Hand every finished group and skipped task to the trainer's thread as it comes."""
        while True:
            results, skipped = await pipe.drain()
            with self._cond:
                self._arrived.update((r.seq, r) for r in results)
                self._skipped.update(skipped)
                self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _in_loop(self, fn: Callable[[Pipeline], Any]) -> Any:
        """`fn(pipeline)` run in the pipeline's event loop (its state is that thread's), waited for."""

        async def go() -> Any:
            assert self._pipe is not None
            return fn(self._pipe)

        return asyncio.run_coroutine_threadsafe(go(), self._loop).result()

    def _submit(self, tickets: list[_Ticket], front: bool = False) -> None:
        tasks, ids = [t.task for t in tickets], [t.group_id for t in tickets]
        for t in tickets:
            self.ledger.bind(t.draw, t.group_id)
        seqs = self._in_loop(lambda pipe: pipe.submit(tasks, ids, front))
        with self._cond:
            self.tickets.update(zip(seqs, tickets))

    # ---- the trainer's side ---------------------------------------------
    def take(
        self, draw: Callable[[int], Sequence[Task]], params: SamplingParams, step: int
    ) -> tuple[list[list[Rollout]], list[list[Rollout]], dict[str, float]]:
        """The groups to train on now, the finished groups left out for staleness (re-queued or
        dropped: for the trace, not trained), and the step's stats. New weights reach the
        generating engine first (`Workers.sync`: between its calls), then the pipeline is
        topped up to `capacity` with tasks from `draw` (each registered in `ledger` as drawn at
        `step`), then the trainer waits for `per_step`
        finished groups and every group the coming update would make too stale."""
        if self._serving is None:
            self._start(params)
        self.workers.sync()
        version, self._at = int(self.version()), step
        self._step = dict.fromkeys(("stale_requeued", "stale_dropped"), 0.0)
        self._top_up(draw, step, version)
        t0 = time.perf_counter()
        chosen = self._wait(version)
        waited = time.perf_counter() - t0
        groups, left, ages = self._check(chosen, version, step)
        return groups, left, self._stats(version, ages, waited, len(chosen))

    def _top_up(self, draw: Callable[[int], Sequence[Task]], step: int, version: int) -> None:
        if self._rerun:  # the groups in flight at the checkpoint a resume started from, first
            self._submit([_Ticket(t, d, g, version) for t, d, g in self._rerun], front=True)
            self._rerun = []
        missing = self.capacity - len(self.tickets)
        if missing <= 0:
            return
        before = self.pool.state_dict()
        tasks = list(draw(missing))
        draws = self.ledger.drawn(tasks, step)
        self._batches = [*self._open_batches(), (step, before, len(tasks), draws)]
        self.counts["drawn"].update(t.domain for t in tasks)
        self._submit([_Ticket(t, d, f"{step}:{i}", version) for i, (t, d) in enumerate(zip(tasks, draws, strict=True))])

    def _wait(self, version: int) -> list[int]:
        """Sleep until `per_step` groups are finished (or none is in flight) and every due group
        is; returns the seqs to train on: the due ones, then the oldest finished, `per_step` in
        all (more when more are due: the bound is kept, never traded for the batch size)."""
        due = {s for s, t in self.tickets.items() if too_stale(version + 1, t.admitted, self.k)}  # by the next update
        with self._cond:
            while True:
                self._absorb()
                done = [s for s, t in self.tickets.items() if t.result is not None]
                open_ = [s for s, t in self.tickets.items() if t.result is None and not t.skipped]
                if (len(done) >= self.per_step or not open_) and not due & set(open_):
                    break
                if self._serving.done():
                    self._serving.result()
                    raise RuntimeError("the rollout pipeline stopped")
                self._cond.wait()
        for s in [s for s, t in self.tickets.items() if t.skipped]:
            ticket = self.tickets.pop(s)  # its domain paused: counted by the pipeline (pipe_paused_skipped)
            self.ledger.dropped(ticket.draw, "paused", self._at)
        order = sorted(done, key=lambda s: (s not in due, self.tickets[s].admitted, s))
        return order[: max(self.per_step, len(due & set(done)))]

    def _absorb(self) -> None:
        """Move what the collector handed over onto the tickets (the caller holds the condition)."""
        for seq in [s for s in self._arrived if s in self.tickets]:
            self.tickets[seq].result = self._arrived.pop(seq)
        for seq in [s for s in self._skipped if s in self.tickets]:
            self.tickets[seq].skipped = True
            self._skipped.discard(seq)

    def _check(
        self, chosen: list[int], version: int, step: int
    ) -> tuple[list[list[Rollout]], list[list[Rollout]], list[int]]:
        """The one staleness check on each chosen group (its admission or its oldest completion,
        whichever is older); too stale: re-queued once at the front, then dropped."""
        groups: list[list[Rollout]] = []
        left: list[list[Rollout]] = []
        ages: list[int] = []
        for seq in chosen:
            ticket = self.tickets.pop(seq)
            assert ticket.result is not None
            group = list(ticket.result.rollouts)
            made = [r.completion.model_version for r in group if r.completion.finish_reason != "error"]
            oldest = min([ticket.admitted, *made])  # a sample masked before generation has no version
            if too_stale(version, oldest, self.k):
                left.append(group)
                self._retire(ticket, group, staleness(version, oldest), step, version)
                continue
            groups.append(group)
            ages.append(staleness(version, oldest))
            self.counts["trained"][ticket.task.domain] += 1
        return groups, left, ages

    def _retire(self, ticket: _Ticket, group: list[Rollout], age: int, step: int, version: int) -> None:
        domain = ticket.task.domain
        bucket = length_bucket(sum(len(r.completion.token_ids) for r in group) / max(1, len(group)))
        if ticket.requeued == 0:
            self.counts["requeued"][domain] += 1
            self.lengths["requeued"][bucket] += 1
            self._step["stale_requeued"] += 1
            again = _Ticket(ticket.task, ticket.draw, f"{ticket.group_id}r1", version, requeued=1)
            self._submit([again], front=True)
            return
        self.lengths["dropped"][bucket] += 1
        self.record_dropped([group], f"stale: {age} versions behind (max_staleness {self.k})")

    def record_dropped(self, groups: Sequence[Sequence[Rollout]], reason: str) -> None:
        """Every group dropped for staleness goes through here: counted per domain (`counts`),
        and its draw dropped in `ledger` for `reason` ("stale: ...") at the current loop step
        (written to the trace at the loop's end-of-step flush, before any checkpoint)."""
        for g in groups:
            draw = self.ledger.draw_of(g[0].group_id)
            if draw is None:
                raise RuntimeError(f"group {g[0].group_id} has no open draw in the ledger")
            self.ledger.dropped(draw, reason, self._at)
            self.counts["dropped"][g[0].task.domain] += 1
            self._step["stale_dropped"] += 1

    def _stats(self, version: int, ages: list[int], waited: float, chosen: int) -> dict[str, float]:
        stats, mix = self._in_loop(lambda pipe: (pipe.stats().flat(), self.scheduler.mix()))  # cumulative
        stats.update(self._step)
        stats.update(self.workers.pool_stats())  # runtime ray: actors per stage, pool changes
        stats.update(
            pipe_async=1.0,
            pipe_trainer_version=float(version),
            pipe_staleness_mean=round(sum(ages) / len(ages), 4) if ages else 0.0,
            pipe_staleness_max=float(max(ages, default=0)),
            pipe_wait_s=round(waited, 4),
            pipe_batch_groups=float(chosen),
            pipe_outstanding=float(len(self.tickets)),
        )
        for kind in ("requeued", "dropped"):
            for name, n in self.counts[kind].items():
                stats[f"stale_{kind}_domain_{name}"] = float(n)
            for name, n in self.lengths[kind].items():
                stats[f"stale_{kind}_len_{name}"] = float(n)
        for name, row in mix.items():
            stats[f"mix_{name}"] = round(row["realised"], 4)
        return stats

    def _open_batches(self) -> list[tuple[int, dict[str, Any], int, list[str]]]:
        open_ = set(self.ledger.open())
        return [b for b in self._batches if open_.intersection(b[3])]

    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint: the draws that still have open draws, each with the pool's state
        before it (JSON-able), so that a resume rebuilds the tasks in flight (`resume`)."""
        groups = {t.draw: t.group_id for t in self.tickets.values()}  # (a rollback may clear the trace's binding)
        batches = [{"step": s, "pool": p, "n": n, "ids": ids} for s, p, n, ids in self._open_batches()]
        return {"draws": batches, "groups": groups}

    def resume(self, state: Mapping[str, Any] | None, pending: Sequence[DrawRecord], step: int) -> list[str]:
        """Re-admit the draws `pending` (open in the trace of the checkpoint the run resumes
        from, at loop step `step`) at the next take, before any new draw: each task rebuilt by
        replaying its draw on the pool from the state `state_dict` saved, and kept only when its
        id is the one the trace recorded. Returns the ids of the draws it could not rebuild
        (a checkpoint without the stream's state, or a pool that no longer draws the same task):
        the loop drops those as "interrupted"."""
        rebuilt: dict[str, Task] = {}
        live = self.pool.state_dict()
        try:
            for batch in (state or {}).get("draws", []):
                self.pool.load_state_dict(batch["pool"])
                rebuilt.update(zip(batch["ids"], self.pool.draw(int(batch["n"])), strict=True))
        finally:
            self.pool.load_state_dict(live)
        lost, groups = [], (state or {}).get("groups", {})
        for rec in pending:
            task = rebuilt.get(rec.id)
            if task is None or task.id != rec.task_id:
                lost.append(rec.id)
                continue
            self.ledger.reopen(rec)
            self._rerun.append((task, rec.id, f"{groups.get(rec.id) or rec.group_id or rec.id}~{step}"))
        return lost

    def close(self) -> None:
        """Stop the pipeline (groups in flight are abandoned), its loop and the workers."""
        if self._serving is not None and not self._serving.done():
            assert self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            try:
                self._serving.result(timeout=60)
            except Exception:  # noqa: S110 - closing: a crash already surfaced from take()
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self.workers.close()
