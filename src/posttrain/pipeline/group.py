"""One group's lifecycle, from admission to finish, whatever schedules it.

Invariant: a `GroupRun` carries one task's group of samples from admission to
one `GroupResult`: its domain and budget are resolved once, at admission
(`GroupRun.admit`); every retry of a stage (generation, an execute or
environment step, a transient verifier failure) goes through its one
`RetryPolicy`, and its attempts and retries are recorded on it and counted;
masking is by cause (`errors.blame`): a model fault scores its sample 0 with
the reason, an infra failure masks that sample alone after its retries, never
its group-mates; a stage call that fails for the whole group (`fail`) is
retried after its backoff (`backoff`), then masks every sample not decided and
finishes the group; `finish` makes the group's Rollouts, each with its id from
birth (`rollout_id`). Generation is batched across groups by one helper,
`generation`, for every scheduler: an engine call that fails over several
groups is halved down to the group that failed it, and a multi-turn group's
prompt too long for the engine down to its single requests, so one bad prompt
masks only its own samples. The schedulers (the staged pipeline,
pipeline/core.py; the inline scheduler, pipeline/play.py, which training's
direct path and the evaluator share) only admit, batch and run the calls;
what a call's outcome does to the group is decided here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget, Domain, stable_hash
from posttrain.envs import driver
from posttrain.envs.base import Environment, Trajectory
from posttrain.errors import NOT_RETRIED, ErrorRecord, GenerationError, PromptTooLong, capture
from posttrain.pipeline.workers import Verdict, verdict_of
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
    "engine_faults",
)
"""The pipeline's counters (`pipe_<name>` in the per-step metrics): masked_groups counts
groups every sample of which was masked, masked_rollouts the masked samples;
model_faults the samples scored 0 because their output made host code raise (a
verifier or environment bug shows here); generate_splits the failed engine calls
split in halves; prompt_computed and prompt_new the prompt tokens of finished multi-turn
episodes that the engine computed and that were new to the episode (`Trajectory`);
engine_faults the samples masked because the engine's answer was refused (engine/validate.py),
also in masked_rollouts."""


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry policy of a group's stages: an infra error is retried up to
    `max_retries` times per stage, after `backoff_s` doubling each time; a config, task,
    prompt or model error (`errors.NOT_RETRIED`) never is."""

    max_retries: int = 2
    backoff_s: float = 0.05

    @classmethod
    def of(cls, cfg: PipelineConfig) -> RetryPolicy:
        """The policy `pipeline.max_retries` and `pipeline.backoff_s` set."""
        return cls(cfg.max_retries, cfg.backoff_s)

    def delay(self, attempts: int, rec: ErrorRecord) -> float | None:
        """The backoff before retry number `attempts` + 1 after the error `rec`; None: not retried."""
        if rec.kind in NOT_RETRIED or attempts >= self.max_retries:
            return None
        return float(self.backoff_s * 2.0**attempts)


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


_PENDING: Any = object()
"""An execute-stage result not produced yet (the sample has not run, or its run failed)."""


def _lie(c: Completion) -> ErrorRecord:
    """The record of a sample whose completion the engine's check refused (`Completion.fault`)."""
    return ErrorRecord("engine", c.fault)


def _ran(result: Any) -> Any:
    """An execute-stage result as the verifier reads it (None for a run that never produced one)."""
    return None if result is _PENDING else result


@dataclass
class GroupRun:
    """One group in flight (mutable; only its GroupResult leaves). Made by `admit`."""

    task: Task
    group_id: str
    tier: CostClass
    seq: int
    n: int
    """Samples in the group (`SamplingParams.n`)."""
    policy: RetryPolicy
    counters: dict[str, int]
    """The scheduler's counters (`COUNTERS`), which this group's retries, faults and masks add to."""
    domain: Domain
    """The task's domain, resolved once at admission."""
    budget: Budget
    """The domain's effective budget (the override of `tasks.domains.X`, else its declaration)."""
    episodic: bool = False
    """The domain runs episodes (it declares an environment), resolved at admission."""
    executes: bool = False
    """The domain declares an execute step (`Domain.executes`), resolved at admission."""
    admitted_at: float = field(default_factory=time.perf_counter)
    prompt_ids: tuple[int, ...] = ()
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
    """Per stage: the retries taken (`RetryPolicy.delay`'s `attempts`)."""
    group_retries: int = 0
    """Retries of a stage call for the whole group (every sample went through them)."""
    retried: dict[int, int] = field(default_factory=dict)
    """Per sample: retries of its own (its execute step or environment step, its verification)."""
    timings: dict[str, float] = field(default_factory=dict)
    closed: bool = False
    end_sessions: Callable[[Sequence[str]], None] | None = None
    """Told the group's session keys when its episodes close (`Engine.end_sessions`, through
    the scheduler's workers), so an engine that keeps an episode's context drops it."""
    result: GroupResult | None = None
    """What `finish` made (None until then)."""
    final: list[Verdict] = field(default_factory=list)
    """Each sample's verdict, as `finish` was given them (empty until then)."""
    backoff: float | None = None
    """Set by `fail` when the failed call is retried: the seconds to wait before it runs again
    (cleared when `generation` takes the group again)."""

    # ---- admission -------------------------------------------------------------
    @classmethod
    def admit(
        cls,
        task: Task,
        group_id: str,
        tier: CostClass | None,
        seq: int,
        params: SamplingParams,
        policy: RetryPolicy,
        counters: dict[str, int],
        budget: Budget | None = None,
    ) -> GroupRun:
        """A group of `params.n` samples admitted, counted: its domain resolved from the
        registry and its budget fixed (`budget`, the run's override; None: the domain's
        declared turns and seconds, `params.max_tokens` tokens per turn); `tier` None: the
        domain's cost class (a scheduler without tiers)."""
        from posttrain.domains.registry import get

        domain = get(task.domain)
        tier = tier or domain.cost_class
        counters["admitted"] += 1
        counters["long_sampled"] += tier == "long"
        budget = budget or dataclasses.replace(domain.budget, tokens=params.max_tokens)
        episodic, executes = domain.environment() is not None, domain.executes
        return cls(task, group_id, tier, seq, params.n, policy, counters, domain, budget, episodic, executes)

    @property
    def multi_turn(self) -> bool:
        return self.trajectories is not None

    @property
    def max_tokens(self) -> int:
        """Tokens per turn (the budget's)."""
        return self.budget.tokens

    def open_envs(self) -> list[tuple[Environment, str]]:
        """The group's fresh environments, each reset on the task, with its first observation
        (blocking: a scheduler may run it in a thread)."""
        return driver.open_envs(self.domain, self.task, self.n)

    def start(self, envs: Sequence[tuple[Environment, str]], encoded: Mapping[str, tuple[int, ...]]) -> None:
        """The group's episodes begin: `encoded` maps each first observation to its prompt's ids."""
        self.prompt_ids = encoded[envs[0][1]]
        ids = [encoded[o] for _, o in envs]
        self.trajectories = driver.start(
            envs, self.task, ids, driver.turns_of(self.domain, self.budget), self.budget.seconds
        )

    # ---- retries ---------------------------------------------------------------
    def _take_retry(self, stage: str, rec: ErrorRecord) -> float | None:
        """The backoff before `stage` runs again after the error `rec`, the attempt and the retry
        counted; None when it is not retried (the policy: a kind never retried, or retries spent)."""
        n = self.attempts.get(stage, 0)
        delay = self.policy.delay(n, rec)
        if delay is not None:
            self.attempts[stage] = n + 1
            self.counters["retries"] += 1
        return delay

    def fail(self, stage: str, exc: BaseException | ErrorRecord) -> float | None:
        """A call of `stage` ("admit", "generate", "execute", "verify") failed for the whole group:
        the backoff before it runs again (`_take_retry`; also left in `backoff`), or None: every
        sample not decided is masked (`mask_rest`) and the group finished (`result`). Admission
        is never retried."""
        rec = exc if isinstance(exc, ErrorRecord) else capture(exc, "sandbox" if stage == "execute" else "infra")
        self.backoff = None if stage == "admit" else self._take_retry(stage, rec)
        self.group_retries += self.backoff is not None  # every sample went through it
        if self.backoff is None:
            self.finish(self._mask_rest(rec, stage))
        return self.backoff

    # ---- generation -------------------------------------------------------------
    def group_seed(self, seed: int | None) -> int | None:
        """The base seed of the group's requests in a run seeded `seed`: (seed, group id,
        generation attempt), the same whatever the batching, the worker or the runtime."""
        return None if seed is None else stable_hash("group", seed, self.group_id, self.attempts.get("generate", 0))

    def _requests(self, params: SamplingParams, base: int | None) -> list[GenerationRequest]:
        """The generation requests of the group's next turn (one request of `params.n` for a
        single-turn group, seeded `base`; an episode's turn: `driver.requests`), with the
        budget's tokens per turn."""
        params = dataclasses.replace(params, max_tokens=self.max_tokens)
        if self.trajectories is not None:
            reqs, self.targets = driver.requests(self.trajectories, params, base, self.group_id)
            return reqs
        return [GenerationRequest(self.prompt_ids, dataclasses.replace(params, seed=base), self.group_id)]

    def _generated(self, got: Sequence[Sequence[Completion]], seconds: float) -> None:
        """The completions of `_requests`' call (its share: `seconds`) join the group: the
        group's generate time, and its episodes' own time."""
        self.timings["generate_s"] = self.timings.get("generate_s", 0.0) + seconds
        if self.trajectories is not None:
            driver.spent([t for ts in self.targets for t in ts], seconds)
            driver.add_actions(self.targets, got)
            for ts, cs in zip(self.targets, got):
                for t, c in zip(ts, cs):
                    if c.fault:  # the engine's answer was refused (engine/validate.py): masked alone
                        driver.mask(t, "engine")
                        self._mask_sample(next(k for k, u in enumerate(self.trajectories) if u is t), _lie(c))
                        self.counters["engine_faults"] += 1
        else:
            self.completions = list(got[0])
            for i, c in enumerate(self.completions):
                if c.fault:
                    self._mask_sample(i, _lie(c))
                    self.counters["engine_faults"] += 1

    def _no_room(self, ts: Sequence[Trajectory], exc: PromptTooLong) -> None:
        """The trajectories `ts`, whose request the engine can never take, end: as truncated
        after turns of their own, masked (kind "prompt") before any."""
        assert self.trajectories is not None
        for t in ts:
            if t.turns:
                driver.out_of_context(t)
                continue
            i = next(k for k, u in enumerate(self.trajectories) if u is t)
            driver.mask(t, "prompt")
            self._mask_sample(i, capture(exc))

    # ---- per-sample outcomes ----------------------------------------------------
    def _fault(self, i: int, rec: ErrorRecord) -> None:
        """Sample `i`'s output made host code raise: scored 0 with the reason, counted."""
        self.decided[i] = verdict_of(rec)
        self.counters["model_faults"] += 1

    def _mask_sample(self, i: int, rec: ErrorRecord) -> None:
        """Sample `i` failed for the infra past its retries: masked alone, counted."""
        self.decided[i] = verdict_of(rec)
        self.counters["masked_rollouts"] += 1

    def retry_samples(self, failed: Mapping[int, ErrorRecord]) -> float | None:
        """After the infra failures `failed` (sample -> record) of some samples' execute or
        environment steps: the backoff before the stage runs again for them (the others keep
        what they have); or None, each of them masked alone, and the group goes on."""
        delay = self._take_retry("execute", next(iter(failed.values())))
        if delay is not None:
            for i in failed:
                self.retried[i] = self.retried.get(i, 0) + 1
            return delay
        for i, rec in failed.items():
            self._mask_sample(i, rec)
            if self.trajectories is not None:
                driver.mask(self.trajectories[i], rec.kind)
        self.counters["masked_execute"] += len(failed)
        self.sandbox_failed = True  # a failing sandbox degrades its domain (recorded once the group verified)
        return None

    def stepping(self) -> list[tuple[int, Trajectory]]:
        """The trajectories whose last action the environment has not answered yet."""
        assert self.trajectories is not None
        return [(i, t) for i, t in enumerate(self.trajectories) if t.awaiting_step]

    def stepped(self, i: int, t: Trajectory) -> None:
        """After trajectory `i`'s step (`driver.step`, and the observation encoded): a model
        fault it ended on decides it (0); an observation that could not be encoded masks it."""
        if t.fault is not None and i not in self.decided:
            self._fault(i, ErrorRecord("model", t.fault))
        elif t.error is not None and i not in self.decided:
            self.decided[i] = Verdict(None, t.error, "the observation could not be encoded")
            self.counters["masked_rollouts"] += 1

    @property
    def playing(self) -> bool:
        """Some episode of the group is not done (it generates again)."""
        return any(not t.done for t in self.trajectories or ())

    def to_execute(self) -> tuple[list[int], list[Completion]]:
        """The samples whose execute step runs now (not run yet, not decided: a retry runs only
        those) and what each runs: its completion, or its episode's last action."""
        if self.trajectories is None:
            comps = self.completions
        else:
            comps = [driver.exec_action(t) for t in self.trajectories]
        if not self.execs:
            self.execs = [_PENDING] * len(comps)
        todo = [i for i, e in enumerate(self.execs) if e is _PENDING and i not in self.decided]
        return todo, [comps[i] for i in todo]

    def executed(self, todo: Sequence[int], got: Sequence[Any]) -> dict[int, ErrorRecord]:
        """The execute results `got` of the samples `todo` (a result, or the ErrorRecord of a
        failure, `workers.execute_one`): a run the model's output broke decides its sample
        (scored 0); returns the infra failures, sample -> record."""
        failed: dict[int, ErrorRecord] = {}
        for i, res in zip(todo, got):
            if not isinstance(res, ErrorRecord):
                self.execs[i] = res
            elif res.kind == "model":
                self.execs[i] = None
                self._fault(i, res)
            else:
                failed[i] = res
        return failed

    # ---- verification -----------------------------------------------------------
    def to_verify(self) -> tuple[list[int], list[Episode]]:
        """The samples verified now (not decided, not verified yet) and their episodes; the
        group's environments are closed first (their sandbox sessions free their slots)."""
        self.settle()
        assert self.episodes is not None
        todo = [i for i in range(len(self.episodes)) if i not in self.decided and i not in self.verified]
        return todo, [self.episodes[i] for i in todo]

    def settle(self) -> list[Episode]:
        """The group's episodes, what the verifier scores (built once, after generation and the
        execute step), its environments closed."""
        if self.episodes is None:
            self.episodes = self._episodes()
        self._close()
        return self.episodes

    def verified_some(self, todo: Sequence[int], got: Sequence[Verdict]) -> float | None:
        """After verifying the samples `todo`: the backoff before verification runs again for
        those whose verdict is a transient infra error (a VerifierError, an OSError, a timeout:
        not config, task, prompt or model), with `take_retry`; None when none is, or the retries
        are spent (the masked verdicts stand): the group is then verified."""
        self.verified.update(zip(todo, got))
        v = self.verified
        again = [i for i in todo if v[i].score is None and v[i].error_kind not in (None, *NOT_RETRIED)]
        if not again:
            return None
        delay = self._take_retry("verify", ErrorRecord("verifier", self.verified[again[0]].error or ""))
        if delay is None:
            return None
        for i in again:
            del self.verified[i]
            self.retried[i] = self.retried.get(i, 0) + 1
        return delay

    def verdicts(self) -> list[Verdict]:
        """Every sample's verdict, once verified (decided ones as decided), model faults counted."""
        final = list(self.verified.values())
        self.counters["model_faults"] += sum(v.fault is not None for v in final)
        both = {**self.decided, **self.verified}
        return [both[i] for i in range(len(self.episodes or ()))]

    def infra_failed(self) -> bool | None:
        """Whether the group, once verified, counts as an infra failure of its domain (its
        sandbox past retries, or its verifier); None: nothing was verified or ran (no record)."""
        final = list(self.verified.values())
        if not final and not self.sandbox_failed:
            return None
        return self.sandbox_failed or any(v.error_kind == "verifier" for v in final)

    def _episodes(self) -> list[Episode]:
        if self.trajectories is not None:
            if self.executes and self.execs:
                return [driver.episode(t, _ran(e)) for t, e in zip(self.trajectories, self.execs)]
            return [driver.episode(t) for t in self.trajectories]
        execs = [_ran(e) for e in self.execs] or [None] * len(self.completions)
        return [Episode(c.text, finish_reason=c.finish_reason, exec_result=e) for c, e in zip(self.completions, execs)]

    # ---- endings ------------------------------------------------------------------
    def _mask_rest(self, rec: ErrorRecord, stage: str = "") -> list[Verdict]:
        """A stage call failed for the whole group past its retries: every sample not already
        decided is masked with `rec` (a sample scored for a model fault keeps its score)."""
        n = len(self.completions) or (len(self.trajectories) if self.trajectories else self.n)
        masked = [i for i in range(n) if i not in self.decided]
        self.counters["masked_rollouts"] += len(masked)
        if stage == "execute":
            self.counters["masked_execute"] += len(masked)
        verdict = Verdict(None, rec.kind, rec.message)
        return [self.decided.get(i, verdict) for i in range(n)]

    def finish(self, verdicts: Sequence[Verdict], episodes: Sequence[Episode] = ()) -> GroupResult:
        """The finished group: one Rollout per verdict (a group masked before generation gets `n`
        empty completions with finish reason "error"), the group's timings on each, and each
        sample's exec result and turns from `episodes` (none: a group masked by a stage call); counted."""
        self._close()
        self.final = list(verdicts)
        self.counters["masked_groups"] += all(v.score is None for v in verdicts)
        self.counters["finished"] += 1
        for t in self.trajectories or ():
            self.counters["prompt_computed"] += t.prompt_computed
            self.counters["prompt_new"] += t.prompt_new
        if self.trajectories:
            comps = [t.completion() for t in self.trajectories]
        else:
            comps = self.completions or [Completion(self.prompt_ids, (), "", (), "error", 0) for _ in range(self.n)]
        self.timings["total_s"] = time.perf_counter() - self.admitted_at
        staged = sum(self.timings.get(k, 0.0) for k in ("generate_s", "execute_s", "verify_s"))
        self.timings["queue_s"] = max(0.0, self.timings["total_s"] - staged)
        rollouts = tuple(
            self._rollout(i, c, v, episodes[i] if episodes else None) for i, (c, v) in enumerate(zip(comps, verdicts))
        )
        version = min((c.model_version for c in comps), default=0)
        self.result = GroupResult(self.seq, self.tier, rollouts, version)
        return self.result

    def _rollout(self, i: int, c: Completion, v: Verdict, ep: Episode | None) -> Rollout:
        timings = dict(self.timings)
        first, mask = "", None
        if self.trajectories:
            t = self.trajectories[i]
            timings["turns"] = float(len(t.turns))
            timings["episode_s"] = round(t.own_s, 6)
            timings["prompt_computed"], timings["prompt_new"] = float(t.prompt_computed), float(t.prompt_new)
            if t.timed_out:
                timings["timed_out"] = 1.0
            mask, first = tuple(t.mask), t.first_observation
        return Rollout(
            self.task,
            c,
            self.group_id,
            v.score,
            v.error_kind,
            v.error,
            timings,
            mask,
            ep.exec_result if ep else None,
            ep.turns if ep else (),
            first,
            self.group_retries + self.retried.get(i, 0),
            id=rollout_id(self.group_id, i),
        )

    def _close(self) -> None:
        """Close every environment of the group once (a terminal env holds a sandbox
        session, and so a pool slot, until closed)."""
        if self.trajectories is not None and not self.closed:
            self.closed = True
            driver.close_envs(t.env for t in self.trajectories)
            if self.end_sessions is not None:
                self.end_sessions(driver.session_keys(self.group_id, len(self.trajectories)))


EngineCall = tuple[int, list[GenerationRequest]]
"""One engine call `generation` asks for: how many groups it serves, and its requests."""
Outcome = tuple["Sequence[Sequence[Completion]] | BaseException", float]
"""What came of an engine call: its completions per request (or what it raised; a TimeoutError
for a call past the scheduler's deadline), and the seconds it took."""


def generation(
    batch: Sequence[GroupRun], params: SamplingParams, seed: Callable[[GroupRun], int | None]
) -> Generator[EngineCall, Outcome, None]:
    """The engine calls of `batch` (groups due a turn, requests seeded by `seed(group)`), for every
    scheduler: it yields each call and is sent what came of it. A call that fails over several
    groups is halved down to the group that failed it (generate_splits), a multi-turn group's
    PromptTooLong down to its single requests (`_no_room`); a timeout, or what else fails a
    group, is its `fail("generate", ...)`: retried after `backoff`, then masked."""
    for it in batch:
        it.backoff = None
    requests = [it._requests(params, seed(it)) for it in batch]
    flat = [r for rs in requests for r in rs]
    got, took = yield len(batch), flat
    if not isinstance(got, BaseException) and len(got) != len(flat):
        got = GenerationError(f"engine returned {len(got)} groups for {len(flat)} requests")
    if not isinstance(got, BaseException):
        cursor = 0
        for it, rs in zip(batch, requests):
            it._generated(got[cursor : cursor + len(rs)], took / len(batch))
            cursor += len(rs)
    elif isinstance(got, TimeoutError):
        for it in batch:
            it.fail("generate", GenerationError(str(got)))
    elif len(batch) > 1:
        batch[0].counters["generate_splits"] += 1
        half = len(batch) // 2
        yield from generation(batch[:half], params, seed)
        yield from generation(batch[half:], params, seed)
    elif isinstance(got, PromptTooLong) and batch[0].multi_turn:
        yield from _one_by_one(batch[0], requests[0])
    else:
        batch[0].fail("generate", got)


def _one_by_one(item: GroupRun, requests: list[GenerationRequest]) -> Generator[EngineCall, Outcome, None]:
    """A multi-turn group's PromptTooLong: its requests one by one; an episode that can never fit
    ends (`_no_room`), its mates play on; another failure fails the group's call."""
    for req, ts in zip(requests, list(item.targets)):
        got, _ = yield 1, [req]
        if isinstance(got, PromptTooLong):
            item._no_room(ts, got)
        elif isinstance(got, BaseException):
            item.fail("generate", got)
            return
        else:
            driver.add_actions([ts], got)
