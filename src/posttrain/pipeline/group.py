"""One group's lifecycle, from admission to finish, whatever schedules it.

Invariant: a `GroupRun` carries one task's group of samples from admission to one
`GroupResult`, and it alone decides the sequence. A scheduler asks it for its next call
(`next_call`: Open, Encode, Generate, Step, Execute, Verify, Wait or Done) and hands back what
came of it (`feed`). Its domain and budget are resolved once, at admission (`GroupRun.admit`);
every retry of a stage goes through its one `RetryPolicy`, counted, its backoff handed out once
as a Wait; masking is by cause (`errors.blame`): a model fault scores its sample 0 with the
reason, an infra failure masks that sample alone after its retries, never its group-mates; a
call that fails for the whole group is retried, then masks every sample not decided and
finishes the group; each Rollout has its id from birth (`rollout_id`). Generation is batched
across groups by one helper, `generation`, for every scheduler: an engine call that fails over
several groups is halved down to the group that failed it, and a multi-turn group's prompt too
long for the engine down to its single requests, so one bad prompt masks only its own samples.
The schedulers (pipeline/core.py, which maps call kinds to its queues; pipeline/play.py, which
training's direct path and the evaluator share) supply only concurrency and admission.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
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
from posttrain.types import (
    Completion,
    CostClass,
    Episode,
    GenerationRequest,
    Image,
    Message,
    SamplingParams,
    Task,
)

COUNTERS = tuple(
    "admitted finished retries masked_groups masked_rollouts paused_skipped long_sampled masked_execute"
    " model_faults generate_splits prompt_computed prompt_new engine_faults gathered gather_ms".split()
)
"""The pipeline's counters (`pipe_<name>` in the per-step metrics): masked_groups counts
groups every sample of which was masked, masked_rollouts the masked samples;
model_faults the samples scored 0 because their output made host code raise (a
verifier or environment bug shows here); generate_splits the failed engine calls
split in halves; prompt_computed and prompt_new the prompt tokens of finished multi-turn
episodes that the engine computed and that were new to the episode (`Trajectory`);
engine_faults the samples masked because the engine's answer was refused (engine/validate.py),
also in masked_rollouts; gathered the groups a generation call took after waiting for them
(`PipelineConfig.gather_share`) and gather_ms the milliseconds its calls waited (the staged
pipeline's; 0 on the direct path)."""


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


@dataclass(frozen=True)
class Played:
    """One episode as `GroupRun.played` gives it: the token ledger (with the loss mask), what the
    verifier would score, its turns, the infra error kind that masked it (None: it ran to its
    end) and the model fault that ended it (scored 0 with that reason; None: there was none)."""

    completion: Completion
    episode: Episode
    turns: int
    error: str | None = None
    loss_mask: tuple[int, ...] = ()
    fault: str | None = None


_PENDING: Any = object()
"""An execute-stage result not produced yet (the sample has not run, or its run failed)."""


@dataclass(frozen=True)
class Open:
    """Open the group's environments (blocking: a scheduler may run `envs` in a thread); feed
    back what `envs()` returned, or what it raised."""

    domain: Domain
    task: Task
    n: int

    def envs(self) -> list[tuple[Environment, str]]:
        """The group's fresh environments, each reset on the task, with its first observation."""
        return driver.open_envs(self.domain, self.task, self.n)


@dataclass(frozen=True)
class Encode:
    """Encode `prompts` (chat messages each); feed back their ids in order, or what encoding raised."""

    prompts: tuple[Sequence[Message], ...]


@dataclass(frozen=True)
class Generate:
    """The group's next turn is due: the scheduler batches it with other groups' through
    `generation`, which feeds the group itself. `tokens`: its tokens per turn (groups are
    batched by it); `turn`: an episode group's turn (the staged pipeline queues it for
    continuation)."""

    tokens: int
    turn: bool


@dataclass(frozen=True)
class Step:
    """Step each `(index, trajectory)` (`driver.step`, then its observation encoded); feed back,
    in order, None for a step that ran, or what `driver.step` raised (an infra error)."""

    pending: list[tuple[int, Trajectory]]


@dataclass(frozen=True)
class Execute:
    """Run the execute step on `completions` (`workers.execute_one` each); feed back each result
    or ErrorRecord in order, or what the whole call raised. `declared`: the domain declares an
    execute step (without one, the default ExecuteFn gives None for each)."""

    task: Task
    completions: list[Completion]
    declared: bool


@dataclass(frozen=True)
class Verify:
    """Verify `episodes` (none: no call needed); feed back their verdicts in order, or what the
    call raised."""

    task: Task
    episodes: list[Episode]


@dataclass(frozen=True)
class Wait:
    """Wait `seconds` (a retry's backoff), then ask again."""

    seconds: float


@dataclass(frozen=True)
class Done:
    """The group finished: its `result`; `health`: what its domain's health record gets (True:
    an infra failure, its sandbox or verifier past retries; False: it verified cleanly; None:
    nothing to record)."""

    result: GroupResult
    health: bool | None


Call = Open | Encode | Generate | Step | Execute | Verify | Wait | Done
"""What a group asks its scheduler for next (`GroupRun.next_call`)."""


@dataclass(eq=False)
class GroupRun:
    """One group in flight (mutable; only its GroupResult leaves). Made by `admit`."""

    task: Task
    _group_id: str
    _tier: CostClass
    _seq: int
    _n: int
    _policy: RetryPolicy
    _counters: dict[str, int]
    """The scheduler's counters (`COUNTERS`), which this group's retries, faults and masks add to."""
    _domain: Domain
    _budget: Budget
    """The domain's effective budget (the override of `tasks.domains.X`, else its declaration)."""
    _executes: bool = False
    """The domain declares an execute step (`Domain.executes`)."""
    _admitted_at: float = field(default_factory=time.perf_counter)
    _prompt_ids: tuple[int, ...] = ()
    _completions: list[Completion] = field(default_factory=list)
    _trajectories: list[Trajectory] | None = None
    """Multi-turn groups: one episode per sample, stepped by `envs.driver`."""
    _targets: list[list[Trajectory]] = field(default_factory=list)
    """The trajectories each of the last generation requests feeds (driver.requests)."""
    _execs: list[Any] = field(default_factory=list)
    _decided: dict[int, Verdict] = field(default_factory=dict)
    """Samples whose verdict is known before verification: masked by an infra error after
    their retries, or scored 0 for a model fault. The rest of the group goes on."""
    _sandbox_failed: bool = False
    """Some sample's execute or environment step failed past its retries (`Done.health`)."""
    episodes: list[Episode] | None = None
    """The group's episodes, what the verifier scores (built once, when verification is asked for)."""
    _verified: dict[int, Verdict] = field(default_factory=dict)
    """Samples verified so far (a verification retry verifies only the others)."""
    _attempts: dict[str, int] = field(default_factory=dict)
    """Per stage: the retries taken (`RetryPolicy.delay`'s `attempts`)."""
    _group_retries: int = 0
    """Retries of a stage call for the whole group (every sample went through them)."""
    _retried: Counter[int] = field(default_factory=Counter)
    """Per sample: retries of its own (its execute or environment step, its verification)."""
    _timings: dict[str, float] = field(default_factory=dict)
    _closed: bool = False
    _end_sessions: Callable[[Sequence[str]], None] | None = None
    """Told the group's session keys when its episodes close (`Engine.end_sessions`)."""
    result: GroupResult | None = None
    """What `_finish` made (None until then)."""
    final: list[Verdict] = field(default_factory=list)
    """Each sample's verdict, as `_finish` was given them (empty until then)."""
    _backoff: float | None = None
    """The seconds to wait before a retried call runs again (`next_call` hands it out once)."""
    _stage: str = "encode"
    """The stage due: "open", "encode", "generate", "step", "execute" or "verify"."""
    _envs: list[tuple[Environment, str]] | None = None
    """An episode group's opened environments, until their first observations are encoded."""
    _pending: list[Any] = field(default_factory=list)
    """What the call handed out last serves (samples, trajectories, first observations)."""
    _health: bool | None = None

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
        end_sessions: Callable[[Sequence[str]], None] | None = None,
    ) -> GroupRun:
        """A group of `params.n` samples admitted, counted: its domain resolved from the
        registry and its budget fixed (`budget`, the run's override; None: the domain's
        declared turns and seconds, `params.max_tokens` tokens per turn); `tier` None: the
        domain's cost class (a scheduler without tiers). `end_sessions` is told the group's
        session keys when its episodes close (`Engine.end_sessions`)."""
        from posttrain.domains.registry import get

        domain = get(task.domain)
        tier = tier or domain.cost_class
        counters["admitted"] += 1
        counters["long_sampled"] += tier == "long"
        budget = budget or dataclasses.replace(domain.budget, tokens=params.max_tokens)
        run = cls(task, group_id, tier, seq, params.n, policy, counters, domain, budget, domain.executes)
        run._end_sessions, run._stage = end_sessions, "open" if domain.environment() is not None else "encode"
        return run

    # ---- the sequence: what a scheduler asks for, and hands back ------------------
    def next_call(self) -> Call:
        """The call the group needs next. A Wait is handed out once (then the call it delays);
        any other call until it is fed. Asking for the verification closes the group's
        environments (their sandbox sessions free their slots)."""
        if self.result is not None:
            return Done(self.result, self._health)
        if self._backoff is not None:
            wait, self._backoff = self._backoff, None
            return Wait(wait)
        stage = self._stage
        if stage == "open":
            return Open(self._domain, self.task, self._n)
        if stage == "encode":
            if self._envs is None:
                return Encode((self.task.prompt,))
            self._pending = list(dict.fromkeys(o for _, o in self._envs))
            return Encode(tuple(driver.first_messages(self.task, o) for o in self._pending))
        if stage == "generate":
            return Generate(self._budget.tokens, self._trajectories is not None)
        if stage == "step":
            assert self._trajectories is not None
            self._pending = [(i, t) for i, t in enumerate(self._trajectories) if t.awaiting_step]
            return Step(list(self._pending))
        if stage == "execute":
            self._pending, comps = self._to_execute()
            return Execute(self.task, comps, self._executes)
        episodes = self._settle()
        self._pending = [i for i in range(len(episodes)) if i not in self._decided and i not in self._verified]
        return Verify(self.task, [episodes[i] for i in self._pending])

    def feed(self, got: Any, seconds: float = 0.0) -> None:
        """What came of the call `next_call` handed out (its value as the call says, or the
        exception that failed the whole call) and the seconds it took; the group decides what
        follows: the next stage, a retry after a backoff, masks by cause, or its finish."""
        stage = self._stage
        if stage == "open":
            if isinstance(got, BaseException):
                self._fail("admit", got)
            else:
                self._envs, self._stage = list(got), "encode"
        elif stage == "encode":
            self._encoded(got)
        elif stage == "step":
            self._stepped(got)
        elif stage == "execute":
            self._timings["execute_s"] = self._timings.get("execute_s", 0.0) + seconds
            if isinstance(got, BaseException):
                self._fail("execute", got)
                self._health = True if self.result is not None else None
                return
            failed = self._executed(self._pending, got)
            if not failed or self._retry_samples(failed) is None:
                self._stage = "generate" if self._playing else "verify"
        elif stage == "verify":
            self._timings["verify_s"] = self._timings.get("verify_s", 0.0) + seconds
            if isinstance(got, BaseException):
                self._fail("verify", got)
            elif self._verified_some(self._pending, got) is None:
                self._timings.setdefault("execute_s", 0.0)
                final = list(self._verified.values())
                self._counters["model_faults"] += sum(v.fault is not None for v in final)
                # the domain's health record: infra failed (its sandbox past retries, or its verifier)
                ran = final or self._sandbox_failed
                self._health = (self._sandbox_failed or any(v.error_kind == "verifier" for v in final)) if ran else None
                both = {**self._decided, **self._verified}
                self._finish([both[i] for i in range(len(self.episodes or ()))], self.episodes or ())
        else:
            raise ValueError(f"GroupRun.feed: no call of the group's is out in stage {stage!r}")

    def played(self) -> list[Played]:
        """The group's episodes as played (a group masked by a stage: no episodes)."""
        episodes = self._settle() if self.result is None else self.episodes or ()
        comps, out = self._samples(), []
        for i in range(self._n):
            v = self._decided.get(i) or (self.final[i] if self.final else None)
            error = v.error_kind if v is not None and v.score is None else None
            fault = v.fault if v is not None else None
            c = comps[i]
            if self._trajectories:
                turns, mask = len(self._trajectories[i].turns), self._trajectories[i].loss_mask
            else:
                turns, mask = 1, (1,) * len(c.token_ids)
            ep = episodes[i] if episodes else Episode(c.text, finish_reason=c.finish_reason)
            out.append(Played(c, ep, turns, error, mask, fault))
        return out

    def _encoded(self, got: Any) -> None:
        """The admission's encoding came back: the group starts generating (an episode group's
        episodes begin, `got` the ids of each distinct first observation), or cannot start."""
        envs, self._envs = self._envs, None
        try:
            if isinstance(got, BaseException):
                raise got
            if envs is None:
                self._prompt_ids = got[0]
            else:
                encoded = dict(zip(self._pending, got))
                self._prompt_ids = encoded[envs[0][1]]
                ids = [encoded[o] for _, o in envs]
                turns = driver.turns_of(self._domain, self._budget, self.task)
                budget = self._budget
                self._trajectories = driver.start(envs, self.task, ids, turns, budget.seconds, budget.train_from)
        except Exception as exc:
            if envs is not None:
                driver.close_envs(e for e, _ in envs)
            self._fail("admit", exc)
            return
        self._stage = "generate"

    def _stepped(self, got: Sequence[BaseException | None]) -> None:
        """After the environment steps: a model fault a trajectory ended on decides it (0); an
        observation that could not be encoded masks it; a step that raised is retried, then masked."""
        failed: dict[int, ErrorRecord] = {}
        for (i, t), exc in zip(self._pending, got):
            if exc is not None:
                failed[i] = capture(exc, "sandbox")
            elif t.fault is not None and i not in self._decided:
                self._decide(i, ErrorRecord("model", t.fault), "model_faults")
            elif t.error is not None and i not in self._decided:
                why = f": {t.error_message}" if t.error_message else ""
                self._decided[i] = Verdict(None, t.error, f"the observation could not be encoded{why}")
                self._counters["masked_rollouts"] += 1
        if failed and self._retry_samples(failed) is not None:
            return
        self._stage = "generate" if self._playing else "execute" if self._executes else "verify"

    @property
    def _playing(self) -> bool:
        """Some episode of the group is not done (it generates again)."""
        return any(not t.done for t in self._trajectories or ())

    # ---- retries ---------------------------------------------------------------
    def _take_retry(self, stage: str, rec: ErrorRecord) -> float | None:
        """The backoff before `stage` runs again after the error `rec`, the attempt and the retry
        counted; None when it is not retried (the policy: a kind never retried, or retries spent)."""
        n = self._attempts.get(stage, 0)
        delay = self._policy.delay(n, rec)
        if delay is not None:
            self._attempts[stage] = n + 1
            self._counters["retries"] += 1
            self._backoff = delay
        return delay

    def _fail(self, stage: str, exc: BaseException | ErrorRecord) -> None:
        """A call of `stage` ("admit", "generate", "execute", "verify") failed for the whole group:
        it runs again after a backoff (`_take_retry`), or every sample not decided is masked
        (`_mask_rest`) and the group finished. Admission is never retried."""
        rec = exc if isinstance(exc, ErrorRecord) else capture(exc, "sandbox" if stage == "execute" else "infra")
        self._backoff = None if stage == "admit" else self._take_retry(stage, rec)
        self._group_retries += self._backoff is not None  # every sample went through it
        if self._backoff is None:
            self._finish(self._mask_rest(rec, stage))

    # ---- generation -------------------------------------------------------------
    def _requests(self, params: SamplingParams, base: int | None) -> list[GenerationRequest]:
        """The generation requests of the group's next turn (one request of `params.n` for a
        single-turn group, seeded `base`; an episode's turn: `driver.requests`), with the
        budget's tokens per turn."""
        params = dataclasses.replace(params, max_tokens=self._budget.tokens)
        if self._trajectories is not None:
            reqs, self._targets = driver.requests(self._trajectories, params, base, self._group_id)
            return reqs
        images = tuple(i for m in self.task.prompt for i in m.images)  # the engine reads or refuses them
        seeded = dataclasses.replace(params, seed=base)
        return [GenerationRequest(self._prompt_ids, seeded, self._group_id, images=images)]

    def _generated(self, got: Sequence[Sequence[Completion]], seconds: float) -> None:
        """The completions of `_requests`' call (its share: `seconds`) join the group: the
        group's generate time, and its episodes' own time. A completion the engine's check
        refused (`Completion.fault`, engine/validate.py) masks its sample alone."""
        self._timings["generate_s"] = self._timings.get("generate_s", 0.0) + seconds
        refused: list[tuple[int, Completion]] = []
        if self._trajectories is not None:
            driver.spent([t for ts in self._targets for t in ts], seconds)
            driver.add_actions(self._targets, got)
            for ts, cs in zip(self._targets, got):
                for t, c in zip(ts, cs):
                    if c.fault:
                        driver.mask(t, "engine")
                        refused.append((next(k for k, u in enumerate(self._trajectories) if u is t), c))
        else:
            self._completions = list(got[0])
            refused = [(i, c) for i, c in enumerate(self._completions) if c.fault]
        for i, c in refused:
            self._decide(i, ErrorRecord("engine", c.fault))
            self._counters["engine_faults"] += 1
        self._after_turn()

    def _after_turn(self) -> None:
        """After an engine call the group took: its episodes step, a single-turn group executes."""
        self._stage = "step" if self._trajectories is not None else "execute"

    def _no_room(self, ts: Sequence[Trajectory], exc: PromptTooLong) -> None:
        """The trajectories `ts`, whose request the engine can never take, end: as truncated
        after turns of their own, masked (kind "prompt") before any."""
        assert self._trajectories is not None
        for t in ts:
            if t.turns:
                driver.out_of_context(t)
                continue
            i = next(k for k, u in enumerate(self._trajectories) if u is t)
            driver.mask(t, "prompt")
            self._decide(i, capture(exc))

    # ---- per-sample outcomes ----------------------------------------------------
    def _decide(self, i: int, rec: ErrorRecord, counter: str = "masked_rollouts") -> None:
        """Sample `i`'s verdict before verification (`verdict_of`: scored 0 with the reason for a
        model fault, masked for an infra failure past its retries), counted under `counter`."""
        self._decided[i] = verdict_of(rec)
        self._counters[counter] += 1

    def _retry_samples(self, failed: Mapping[int, ErrorRecord]) -> float | None:
        """After the infra failures `failed` (sample -> record) of some samples' execute or
        environment steps: the backoff before the stage runs again for them (the others keep
        what they have); or None, each of them masked alone, and the group goes on."""
        delay = self._take_retry("execute", next(iter(failed.values())))
        if delay is not None:
            self._retried.update(failed.keys())
            return delay
        for i, rec in failed.items():
            self._decide(i, rec)
            if self._trajectories is not None:
                driver.mask(self._trajectories[i], rec.kind)
        self._counters["masked_execute"] += len(failed)
        self._sandbox_failed = True  # a failing sandbox degrades its domain (recorded once the group verified)
        return None

    def _to_execute(self) -> tuple[list[int], list[Completion]]:
        """The samples whose execute step runs now (not run yet, not decided: a retry runs only
        those) and what each runs: its completion, or its episode's last action."""
        if self._trajectories is None:
            comps = self._completions
        else:
            comps = [driver.exec_action(t) for t in self._trajectories]
        if not self._execs:
            self._execs = [_PENDING] * len(comps)
        todo = [i for i, e in enumerate(self._execs) if e is _PENDING and i not in self._decided]
        return todo, [comps[i] for i in todo]

    def _executed(self, todo: Sequence[int], got: Sequence[Any]) -> dict[int, ErrorRecord]:
        """The execute results `got` of the samples `todo` (a result, or the ErrorRecord of a
        failure, `workers.execute_one`): a run the model's output broke decides its sample
        (scored 0); returns the infra failures, sample -> record."""
        failed: dict[int, ErrorRecord] = {}
        for i, res in zip(todo, got):
            if not isinstance(res, ErrorRecord):
                self._execs[i] = res
            elif res.kind == "model":
                self._execs[i] = None
                self._decide(i, res, "model_faults")
            else:
                failed[i] = res
        return failed

    # ---- verification -----------------------------------------------------------
    def _settle(self) -> list[Episode]:
        """The group's episodes, what the verifier scores (built once, after generation and the
        execute step; a run that never produced a result reaches it as None), its environments
        closed (their sandbox sessions free their slots)."""
        if self.episodes is None:
            execs = [None if e is _PENDING else e for e in self._execs]
            if self._trajectories is None:
                execs = execs or [None] * len(self._completions)
                self.episodes = [
                    Episode(c.text, finish_reason=c.finish_reason, exec_result=e)
                    for c, e in zip(self._completions, execs)
                ]
            elif self._executes and execs:
                self.episodes = [driver.episode(t, e) for t, e in zip(self._trajectories, execs)]
            else:
                self.episodes = [driver.episode(t) for t in self._trajectories]
        self._close()
        return self.episodes

    def _verified_some(self, todo: Sequence[int], got: Sequence[Verdict]) -> float | None:
        """After verifying the samples `todo`: the backoff before verification runs again for
        those whose verdict is a transient infra error (not config, task, prompt or model), with
        `_take_retry`; None when none is, or the retries are spent (the masked verdicts stand)."""
        self._verified.update(zip(todo, got))
        v = self._verified
        again = [i for i in todo if v[i].score is None and v[i].error_kind not in (None, *NOT_RETRIED)]
        if not again:
            return None
        delay = self._take_retry("verify", ErrorRecord("verifier", self._verified[again[0]].error or ""))
        if delay is None:
            return None
        for i in again:
            del self._verified[i]
        self._retried.update(again)
        return delay

    # ---- endings ------------------------------------------------------------------
    def _mask_rest(self, rec: ErrorRecord, stage: str = "") -> list[Verdict]:
        """A stage call failed for the whole group past its retries: every sample not already
        decided is masked with `rec` (a sample scored for a model fault keeps its score)."""
        n = len(self._completions) or (len(self._trajectories) if self._trajectories else self._n)
        masked = [i for i in range(n) if i not in self._decided]
        self._counters["masked_rollouts"] += len(masked)
        if stage == "execute":
            self._counters["masked_execute"] += len(masked)
        verdict = Verdict(None, rec.kind, rec.message)
        return [self._decided.get(i, verdict) for i in range(n)]

    def _finish(self, verdicts: Sequence[Verdict], episodes: Sequence[Episode] = ()) -> GroupResult:
        """The finished group: one Rollout per verdict (a group masked before generation gets `n`
        empty completions with finish reason "error"), the group's timings on each, and each
        sample's exec result and turns from `episodes` (none: a group masked by a stage call); counted."""
        self._close()
        self.final = list(verdicts)
        self._counters["masked_groups"] += all(v.score is None for v in verdicts)
        self._counters["finished"] += 1
        for t in self._trajectories or ():
            self._counters["prompt_computed"] += t.prompt_computed
            self._counters["prompt_new"] += t.prompt_new
        comps = self._samples()
        self._timings["total_s"] = time.perf_counter() - self._admitted_at
        staged = sum(self._timings.get(k, 0.0) for k in ("generate_s", "execute_s", "verify_s"))
        self._timings["queue_s"] = max(0.0, self._timings["total_s"] - staged)
        rollouts = tuple(
            self._rollout(i, c, v, episodes[i] if episodes else None) for i, (c, v) in enumerate(zip(comps, verdicts))
        )
        version = min((c.model_version for c in comps), default=0)
        self.result = GroupResult(self._seq, self._tier, rollouts, version)
        return self.result

    def _samples(self) -> list[Completion]:
        """Each sample's completion (a group masked before generation: empty, finish reason "error")."""
        if self._trajectories:
            return [t.completion() for t in self._trajectories]
        return self._completions or [Completion(self._prompt_ids, (), "", (), "error", 0) for _ in range(self._n)]

    def _rollout(self, i: int, c: Completion, v: Verdict, ep: Episode | None) -> Rollout:
        timings = dict(self._timings)
        first, mask = "", None
        seen: tuple[Image, ...] = ()
        if self._trajectories:
            t = self._trajectories[i]
            timings["turns"] = float(len(t.turns))
            timings["episode_s"] = round(t.own_s, 6)
            timings["prompt_computed"], timings["prompt_new"] = float(t.prompt_computed), float(t.prompt_new)
            if t.timed_out:
                timings["timed_out"] = 1.0
            mask, first, seen = t.loss_mask, t.first_observation, t.seen_images[len(self.task.images) :]
        if c.spec:  # engine.speculation: this sample's drafts (the trace and the loop's per-domain figures)
            timings["spec_drafts"], timings["spec_proposed"], timings["spec_accepted"] = map(float, c.spec)
        ex, turns = (ep.exec_result, ep.turns) if ep else (None, ())
        retries = self._group_retries + self._retried[i]
        row = (self.task, c, self._group_id, v.score, v.error_kind, v.error, timings, mask, ex, turns, first, retries)
        return Rollout(*row, observation_images=seen, id=rollout_id(self._group_id, i))

    def _close(self) -> None:
        """Close every environment of the group once (a terminal env holds a sandbox
        session, and so a pool slot, until closed)."""
        if self._trajectories is not None and not self._closed:
            self._closed = True
            driver.close_envs(t.env for t in self._trajectories)
            if self._end_sessions is not None:
                self._end_sessions(driver.session_keys(self._group_id, len(self._trajectories)))


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
        it._backoff = None
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
            it._fail("generate", GenerationError(str(got)))
    elif len(batch) > 1:
        batch[0]._counters["generate_splits"] += 1
        half = len(batch) // 2
        yield from generation(batch[:half], params, seed)
        yield from generation(batch[half:], params, seed)
    elif isinstance(got, PromptTooLong) and batch[0]._trajectories is not None:
        yield from _one_by_one(batch[0], requests[0])
    else:
        batch[0]._fail("generate", got)


def _one_by_one(item: GroupRun, requests: list[GenerationRequest]) -> Generator[EngineCall, Outcome, None]:
    """A multi-turn group's PromptTooLong: its requests one by one; an episode that can never fit
    ends (`_no_room`), its mates play on; another failure fails the group's call."""
    for req, ts in zip(requests, list(item._targets)):
        got, _ = yield 1, [req]
        if isinstance(got, PromptTooLong):
            item._no_room(ts, got)
        elif isinstance(got, BaseException):
            item._fail("generate", got)
            return
        else:
            driver.add_actions([ts], got)
    item._after_turn()


BUDGET_SPAN = 2
"""Token budgets within this factor of a call's shortest share its engine call."""


def by_budget(runs: Sequence[GroupRun], tokens: Callable[[GroupRun], int]) -> list[list[GroupRun]]:
    """`runs` in engine calls by token budget (`tokens(run)`), shortest first, for every scheduler:
    a budget within `BUDGET_SPAN` of a call's shortest shares that call (each row still stops at
    its own budget, the engines honour every request's max_tokens), a longer one starts the next.
    A 16-token row neither waits for nor pads to a 1024-token one, and a 96- and a 160-token
    domain (arith_fmt beside ifeval) cost one engine call, not two in series."""
    calls: list[list[GroupRun]] = []
    shortest = 0
    for run in sorted(runs, key=tokens):  # stable: runs of one budget keep their order
        if not calls or tokens(run) > BUDGET_SPAN * shortest:
            calls.append([])
            shortest = tokens(run)
        calls[-1].append(run)
    return calls


def group_seed(run: GroupRun, seed: int | None) -> int | None:
    """The base seed of `run`'s requests in a run seeded `seed`: (seed, group id, generation
    attempt), the same whatever the batching, the worker or the runtime."""
    return None if seed is None else stable_hash("group", seed, run._group_id, run._attempts.get("generate", 0))
