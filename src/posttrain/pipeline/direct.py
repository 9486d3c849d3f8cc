"""The direct rollout path: a step's groups generated and verified inline, without the stages.

Invariant: for a step whose every domain is single-turn, runs nothing (no
execute step) and has a cheap in-process verifier (`EmbeddedWorkers.inline`),
`Direct.run_groups` returns what `Pipeline.run_groups` returns for the same
tasks: the same group ids and seeds (so the same samples), the same
admission order (long tier first) and scheduler bookkeeping, engine calls
split by token budget, shortest first, at most `generate_batch` groups per
call, the same retries of a failed generation, the same split of an engine
call that fails over several groups (halves until the failing group stands
alone) and the same masking (an infra error is masked and counted, never
scored 0; a model fault at the verifier is scored 0 and counted). Only the event loop,
the queues, the stage tasks and the thread hops are gone: the engine and
the verifier run in the caller's thread, one call after another. (The one
counter that may differ is generate_splits: the pipeline batches retried groups
together again, so a failing engine may be split more often there.)
Both drive each group through the one lifecycle (`GroupRun`, pipeline/group.py).
Admission is by waves, one engine call's groups at a time: a wave takes up to
`generate_batch` groups in the pipeline's admission order (priority, then long
tier first), each admitted only while its tier has a free slot and its domain
has room in its quota, and all of a wave's groups finish before the next wave
is admitted. So here a domain quota of q means at most q of that domain's
groups share one engine call (and are in flight at once), and the in-flight
cap (`max_inflight`, less the long slots for short groups) bounds a wave.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget
from posttrain.errors import ErrorRecord, GenerationError, capture
from posttrain.pipeline.core import PipelineStats, splits
from posttrain.pipeline.group import COUNTERS, GroupResult, GroupRun, RetryPolicy
from posttrain.pipeline.metrics import StageMeter
from posttrain.pipeline.scheduler import Scheduler
from posttrain.pipeline.workers import InlineWorkers
from posttrain.types import SamplingParams, Task


class Direct:
    """One step's rounds (the direct counterpart of one `Pipeline`): `run_groups` per
    round, then `stats()` (the same keys as the pipeline's, without queues)."""

    def __init__(
        self,
        config: PipelineConfig,
        workers: InlineWorkers,
        params: SamplingParams,
        scheduler: Scheduler,
        group_prefix: str = "",
        seed: int | None = None,
        budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        self.cfg, self.workers, self.params, self.scheduler = config, workers, params, scheduler
        self.budgets = budgets or {}
        self.seed = seed
        self._prefix = group_prefix
        self._next_seq = 0
        w = config.latency_window
        self.meters = {
            "generate": StageMeter("generate", 1, w),
            "execute": StageMeter("execute", 1, w),
            "verify": StageMeter("verify", 1, w),
        }
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._tokens = 0
        self._policy = RetryPolicy.of(config)

    def run_groups(self, tasks: Sequence[Task]) -> list[GroupResult | None]:
        """Results in task order; None for a task whose domain is paused (paused_skipped)."""
        first, self._next_seq = self._next_seq, self._next_seq + len(tasks)
        order = sorted(range(len(tasks)), key=lambda i: (self.scheduler.tier(tasks[i].domain) != "long", i))
        done: dict[int, GroupResult] = {}
        encoded = self._encode([t.prompt for t in tasks])  # encoding is pure: done up front, in one call
        waiting = list(order)
        while waiting:
            before = len(waiting)
            live = self._wave(first, tasks, encoded, waiting, done)
            if len(waiting) == before:  # nothing in flight here, so only a scheduler shared elsewhere blocks
                raise RuntimeError("direct path: no pending task is admissible (in-flight groups held elsewhere)")
            for item, rec in self._generate(live):
                done[item.seq] = self._mask(item, rec) if rec is not None else self._verify(item)
        return [done.get(first + i) for i in range(len(tasks))]

    def _wave(
        self, first: int, tasks: Sequence[Task], encoded: list[Any], waiting: list[int], done: dict[int, GroupResult]
    ) -> list[GroupRun]:
        """Admit the next engine call's groups, taking them out of `waiting`: tasks of paused
        domains are skipped and counted; then, in the staged pipeline's admission order
        (`Scheduler.next_admissible`: a free slot, room in the domain's quota, the highest
        priority first), up to `generate_batch` groups. What cannot start is masked into `done`."""
        for i in [i for i in waiting if self.scheduler.is_paused(tasks[i].domain)]:
            self.counters["paused_skipped"] += 1
            waiting.remove(i)
        live: list[GroupRun] = []
        while waiting and len(live) < self.cfg.generate_batch:
            k = self.scheduler.next_admissible([tasks[i] for i in waiting])
            if k is None:
                break
            i = waiting.pop(k)
            item, error = self._admit(first + i, tasks[i], encoded[i])
            if error is not None:  # a task that cannot start is masked and counted, as in the pipeline
                done[item.seq] = self._mask(item, capture(error, "infra"))
            else:
                live.append(item)
        return live

    def stats(self) -> PipelineStats:
        return PipelineStats(
            tuple(m.stats() for m in self.meters.values()), (), dict(self.counters), self.scheduler.cap.value
        )

    # ---- the steps of a group ------------------------------------------------
    def _encode(self, prompts: list[Any]) -> list[Any]:
        """Each prompt's ids or the error encoding it raised, in one call (`InlineWorkers.encode_many`)."""
        return list(self.workers.encode_many(prompts))

    def _admit(self, seq: int, task: Task, ids: Any) -> tuple[GroupRun, BaseException | None]:
        """Admit one task whose prompt encoded to `ids` (or raised the exception `ids`)."""
        tier = self.scheduler.admit(task.domain)
        budget = self.budgets.get(task.domain)
        item = GroupRun.admit(task, f"{self._prefix}{seq}", tier, seq, self.params, self._policy, self.counters, budget)
        item.end_sessions = self.workers.end_sessions
        if isinstance(ids, BaseException):
            return item, ids
        item.prompt_ids = ids
        return item, None

    def _generate(self, batch: list[GroupRun]) -> list[tuple[GroupRun, ErrorRecord | None]]:
        """Each group generated (with retries): (item, None) once it has its completions, or
        (item, the record of the error that masks it). One engine call per token budget, shortest first."""
        out: list[tuple[GroupRun, ErrorRecord | None]] = []
        buckets: dict[int, list[GroupRun]] = {}
        for it in batch:
            buckets.setdefault(it.max_tokens, []).append(it)
        for _, bucket in sorted(buckets.items()):
            out += self._generate_part(bucket)
        return out

    def _generate_part(self, bucket: list[GroupRun]) -> list[tuple[GroupRun, ErrorRecord | None]]:
        """`_generate` of one engine call's groups: a call that fails over several groups is
        split in halves (as `Pipeline._generate_bucket`); one group's failure, or a timeout,
        is retried after the backoff, then masks."""
        out: list[tuple[GroupRun, ErrorRecord | None]] = []
        while bucket:
            error = self._call_engine(bucket)
            if error is None:
                return out + [(it, None) for it in bucket]
            if splits(bucket) and not isinstance(error, TimeoutError):
                self.counters["generate_splits"] += 1
                half = len(bucket) // 2
                return out + self._generate_part(bucket[:half]) + self._generate_part(bucket[half:])
            rec, retry, delay = capture(error, "infra"), [], 0.0
            for it in bucket:
                wait = it.retry_group("generate", rec)
                if wait is None:
                    out.append((it, rec))
                else:
                    delay = max(delay, wait)
                    retry.append(it)
            if retry:
                time.sleep(delay)
            bucket = retry
        return out

    def _call_engine(self, bucket: list[GroupRun]) -> BaseException | None:
        requests = [it.requests(self.params, it.group_seed(self.seed)) for it in bucket]
        meter, token = self.meters["generate"], self._token()
        meter.begin(token)
        try:
            flat = [r for rs in requests for r in rs]
            outs = self.workers.generate_now(flat)
            if len(outs) != len(flat):
                raise GenerationError(f"engine returned {len(outs)} groups for {len(flat)} requests")
        except Exception as exc:
            meter.end(token, len(bucket), error=True)
            return exc
        took = meter.end(token, len(bucket))
        for it, got in zip(bucket, outs):
            it.generated([got], took / len(bucket))
        return None

    def _verify(self, item: GroupRun) -> GroupResult:
        item.timings["execute_s"] = 0.0  # nothing to execute: the direct path's condition
        meter, token = self.meters["verify"], self._token()
        meter.begin(token)
        while True:  # verify_group: an escape is blamed by cause; a transient one is retried
            todo, episodes = item.to_verify()
            delay = item.verified_some(todo, self.workers.verify_now(item.task, episodes))
            if delay is None:
                break
            time.sleep(delay)
        item.timings["verify_s"] = meter.end(token)
        verdicts = item.verdicts()
        self.scheduler.record_verification(item.task.domain, bool(item.infra_failed()))
        return self._finish(item, verdicts, item.episodes or ())

    def _mask(self, item: GroupRun, rec: ErrorRecord) -> GroupResult:
        return self._finish(item, item.mask_rest(rec))

    def _finish(self, item: GroupRun, verdicts: Any, episodes: Any = ()) -> GroupResult:
        result = item.finish(verdicts, episodes)
        self.scheduler.finish(item.task.domain)
        return result

    def _token(self) -> int:
        self._tokens += 1
        return self._tokens
