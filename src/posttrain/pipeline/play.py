"""The synchronous scheduler: groups run in the caller's thread, one call after another.

Invariant: every task's group runs through the one lifecycle (`GroupRun`, pipeline/group.py),
as in the staged pipeline: the same admission (domain and budget resolved once), the same
retry policy for generation, execute and environment steps and transient verifier
failures (backoffs slept), the same masking by cause. Single-turn groups are generated in
batches, one engine call per token budget (shortest first) and at most `batch_size` groups
each, so a short domain never pads to a long one; multi-turn groups play their episodes one
task at a time through `envs.driver`. Nothing here runs concurrently: it is the evaluator's
scheduler (evaluate/core.py) and the tests'.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.domains.base import Budget, stable_hash
from posttrain.engine.base import Engine
from posttrain.envs import driver
from posttrain.errors import ErrorRecord, GenerationError, capture
from posttrain.pipeline.group import COUNTERS, GroupResult, GroupRun, RetryPolicy
from posttrain.pipeline.workers import ExecuteFn, execute_one, verify_group
from posttrain.types import Completion, Episode, SamplingParams, Task


def domain_execute(task: Task, completion: Completion) -> Any:
    """The domain's declared execute step on the process-wide sandbox pool (`Domain.execute`)."""
    from posttrain.domains.registry import get

    return get(task.domain).execute(task, completion.text)


@dataclass(frozen=True)
class Played:
    """One episode run by `play`: the token ledger (with the loss mask), what the
    verifier would score, how many turns it used, the infra error kind that
    masked it (None when it ran to its end) and the model fault that ended it
    (scored 0 with that reason; None when there was none)."""

    completion: Completion
    episode: Episode
    turns: int
    error: str | None = None
    loss_mask: tuple[int, ...] = ()
    fault: str | None = None


class Play:
    """Run groups synchronously: `groups(tasks)` (generated, executed, not verified) or
    `run(tasks)` (verified too, each GroupRun finished with its GroupResult)."""

    def __init__(
        self,
        engine: Engine,
        params: SamplingParams,
        budgets: Mapping[str, Budget] | None = None,
        policy: RetryPolicy | None = None,
        batch_size: int = 256,
        execute: ExecuteFn = domain_execute,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine, self.params = engine, params
        self.policy = policy or RetryPolicy()
        """The one retry policy (None: `RetryPolicy()`, the defaults of `pipeline.max_retries` and `backoff_s`)."""
        self.budgets = budgets or {}
        """Per-domain budgets (None for a domain: its declared turns and seconds, `params.max_tokens`)."""
        self.batch_size = batch_size
        self.execute = execute
        self.sleep = sleep
        self.counters = dict.fromkeys(COUNTERS, 0)

    def run(self, tasks: Sequence[Task]) -> list[GroupRun]:
        """Every task's group, verified and finished (`GroupRun.result`), in task order."""
        runs = self.groups(tasks)
        for run in runs:
            if run.result is None:
                self._verify(run)
        return runs

    def groups(self, tasks: Sequence[Task]) -> list[GroupRun]:
        """Every task's group generated and executed (not verified), in task order; a group a
        stage masked past its retries is finished already. Multi-turn episodes are seeded by
        (params.seed, their index among this call's multi-turn tasks); single-turn groups by
        params.seed."""
        runs = [self._admit(i, t) for i, t in enumerate(tasks)]
        single = [r for r in runs if r.result is None and not r.episodic]
        by_tokens: dict[int, list[GroupRun]] = {}
        for r in single:
            by_tokens.setdefault(r.max_tokens, []).append(r)
        for _, batch in sorted(by_tokens.items()):
            for start in range(0, len(batch), self.batch_size):
                self._generate(batch[start : start + self.batch_size])
        multi = [r for r in runs if r.episodic]
        for k, r in enumerate(multi):
            seed = None if self.params.seed is None else stable_hash("play", self.params.seed, k)
            if r.result is None:
                self._episodes(r, seed)
            if r.result is None and r.executes:
                self._retrying(r, self._run_execute)
            if r.result is None:
                r.settle()  # its environments close before the next task's open
        for r in single:
            if r.result is None and r.executes:
                self._retrying(r, self._run_execute)
        return runs

    # ---- the stages, in the caller's thread ---------------------------------------
    def _admit(self, seq: int, task: Task) -> GroupRun:
        run = GroupRun.admit(
            task, task.id, None, seq, self.params, self.policy, self.counters, self.budgets.get(task.domain)
        )
        run.end_sessions = self.engine.end_sessions  # Engine contract: a no-op where nothing is kept
        try:
            if not run.episodic:
                run.prompt_ids = self.engine.encode_chat(task.prompt)
            else:
                envs = run.open_envs()
                try:
                    encoded = {o: self.engine.encode_chat(driver.first_messages(task, o)) for _, o in envs}
                except BaseException:
                    driver.close_envs(e for e, _ in envs)
                    raise
                run.start(envs, encoded)
        except Exception as exc:  # a task that cannot start is masked and counted, as in the pipeline
            run.finish(run.mask_rest(capture(exc)))
        return run

    def _generate(self, batch: list[GroupRun]) -> None:
        """One engine call for `batch` (single-turn groups); a call that fails over several
        groups is split in halves (as the pipeline and the direct path do), so only the group
        whose own request fails is masked; one group's failed call, or a timeout, is retried
        while its retries last, then masks it."""
        while batch:
            requests = [r.requests(self.params, self.params.seed)[0] for r in batch]
            t0 = time.perf_counter()
            try:
                outs = self.engine.generate(requests)
                if len(outs) != len(requests):
                    raise GenerationError(f"engine returned {len(outs)} groups for {len(requests)} requests")
            except Exception as exc:
                if len(batch) > 1 and not isinstance(exc, TimeoutError):
                    self.counters["generate_splits"] += 1
                    half = len(batch) // 2
                    self._generate(batch[:half])
                    self._generate(batch[half:])
                    return
                rec, again, delay = capture(exc), [], 0.0
                for r in batch:
                    wait = r.retry_group("generate", rec)
                    if wait is None:
                        r.finish(r.mask_rest(rec))
                    else:
                        again.append(r)
                        delay = max(delay, wait)
                self.sleep(delay)
                batch = again
                continue
            took = (time.perf_counter() - t0) / len(batch)
            for r, got in zip(batch, outs):
                r.generated([got], took)
            return

    def _episodes(self, run: GroupRun, seed: int | None) -> None:
        """Play the group's episodes to their end: generate each turn, step the environments
        (an infra failure retried, then masked alone), encode the observations."""
        while run.playing:
            reqs = run.requests(self.params, seed)
            t0 = time.perf_counter()
            try:
                driver.generate_each(self.engine.generate, reqs, run.targets)
            except Exception as exc:
                delay = run.retry_group("generate", capture(exc))
                if delay is None:
                    run.finish(run.mask_rest(capture(exc)))
                    return
                self.sleep(delay)
                continue
            run.spent(time.perf_counter() - t0)
            self._retrying(run, self._step)

    def _retrying(self, run: GroupRun, stage: Callable[[GroupRun], dict[int, ErrorRecord]]) -> None:
        """`stage` (stepping or the execute step), run again for the samples that failed for the
        infra while the policy retries them (`GroupRun.retry_samples`, which masks them after)."""
        while (failed := stage(run)) and (delay := run.retry_samples(failed)) is not None:
            self.sleep(delay)

    def _step(self, run: GroupRun) -> dict[int, ErrorRecord]:
        failed: dict[int, ErrorRecord] = {}
        for i, t in run.stepping():
            try:
                driver.step(t)  # raises only infra errors; a model fault ends t inside
            except Exception as exc:
                failed[i] = capture(exc, "sandbox")
                continue
            driver.observe(t, self.engine.encode_chat)
            run.stepped(i, t)
        return failed

    def _run_execute(self, run: GroupRun) -> dict[int, ErrorRecord]:
        todo, comps = run.to_execute()
        return run.executed(todo, [execute_one(self.execute, run.task, c) for c in comps])

    def _verify(self, run: GroupRun) -> GroupResult:
        """Verify the group (transient verifier failures retried after the backoff) and finish it."""
        while True:
            todo, episodes = run.to_verify()
            delay = run.verified_some(todo, verify_group(run.task, episodes) if episodes else ())
            if delay is None:
                return run.finish(run.verdicts(), run.episodes or ())
            self.sleep(delay)


def played(run: GroupRun) -> list[Played]:
    """The group's episodes as `play` returns them (a group masked by a stage: no episodes)."""
    episodes = run.settle() if run.result is None else run.episodes or ()
    out = []
    for i in range(run.n):
        v = run.decided.get(i) or (run.final[i] if run.final else None)
        error = v.error_kind if v is not None and v.score is None else None
        fault = v.fault if v is not None else None
        if run.trajectories:
            t = run.trajectories[i]
            c, turns, mask = t.completion(), len(t.turns), tuple(t.mask)
        else:
            c = run.completions[i] if run.completions else Completion(run.prompt_ids, (), "", (), "error", 0)
            turns, mask = 1, (1,) * len(c.token_ids)
        ep = episodes[i] if episodes else Episode(c.text, finish_reason=c.finish_reason)
        out.append(Played(c, ep, turns, error, mask, fault))
    return out


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
    return [played(r) for r in runs]
