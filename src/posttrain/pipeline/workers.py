"""The pipeline's worker seams: generation, execution and verification calls.

Invariant: a stage only ever talks to its workers through `Workers`, whose
calls are awaitable and never block the event loop (blocking work runs in a
thread, a process pool, or a Ray actor); what escapes a verifier or an
execute step is blamed by its cause (`errors.blame`), per sample: a typed
infra error gives a masked Verdict (kind and message, no score), never reward
0; anything else the model's output made the host code raise gives a scored
Verdict (0, the reason in `Score.reason` and `Verdict.fault`), unless the
cause test shows the verifier raises on the task's gold answer too (then it
is the verifier's fault: masked, kind "verifier").
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor as _PoolExecutor
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from posttrain.contracts.engine import Engine
from posttrain.domains.base import is_cheap
from posttrain.envs.driver import require_utf8
from posttrain.errors import ErrorRecord, blame
from posttrain.types import Completion, Episode, GenerationRequest, Message, Score, Task


@dataclass(frozen=True)
class Verdict:
    """A verifier's answer for one episode: a score, or the infra error that masked it.
    `fault` is set when the model's output made host code fail: the score is then 0
    with the reason (scored, never masked)."""

    score: Score | None
    error_kind: str | None = None
    error: str | None = None
    fault: str | None = None


def fault_score(message: str) -> Score:
    """The score of a sample whose output made host code fail: 0, not passed, the reason."""
    return Score(0.0, {"outcome": 0.0}, False, f"model fault: {message}")


def verdict_of(rec: ErrorRecord) -> Verdict:
    """The verdict of a sample whose processing failed: scored 0 for a model fault,
    else masked with the infra kind."""
    if rec.kind == "model":
        return Verdict(fault_score(rec.message), fault=rec.message)
    return Verdict(None, rec.kind, rec.message)


def verify_one(task: Task, episode: Episode) -> Verdict:
    """The domain verifier's score; what escapes it is blamed by its cause (module docstring)."""
    from posttrain.domains.registry import get

    domain = get(task.domain)
    try:
        require_utf8(episode.completion)  # a lone surrogate is the model's, before any check reads it
        return Verdict(domain.score(task, episode))
    except Exception as exc:  # blamed: a typed infra error masks, anything else is the model's
        return verdict_of(cause_test(domain, task, blame(exc, "verifier")))


def cause_test(domain: Any, task: Task, rec: ErrorRecord) -> ErrorRecord:
    """`rec` for a verifier that raised on the model's episode, unless it also raises on the
    task's gold answer: then the verifier, not the model, is at fault (kind "verifier").
    Run where the gold completion alone is a whole episode: single-turn domains that
    execute nothing; elsewhere the model is blamed and the fault counted."""
    if rec.kind != "model" or domain.environment() is not None or domain.executes:
        return rec
    try:
        domain.score(task, Episode(domain.gold(task)))
    except Exception:  # noqa: BLE001 - the verifier fails on the gold answer: its own fault
        return ErrorRecord("verifier", f"{rec.message} (the verifier raises on the task's gold answer too)")
    return rec


def verify_group(task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
    """One group's verdicts in one call (one pickling round trip in a process pool)."""
    return tuple(verify_one(task, e) for e in episodes)


ExecuteFn = Callable[[Task, Completion], Any]
"""Runs one completion (a sandbox run, a simulated delay): a single-turn
sample, or a finished multi-turn episode's last action (domains that execute);
its result reaches the verifier as Episode.exec_result. It raises SandboxError
(or any infra error) when the sandbox, not the program, failed; anything else it
raises on the completion is the model's (`execute_one` blames it)."""


def execute_one(run: ExecuteFn, task: Task, completion: Completion) -> Any:
    """`run`'s result for one completion, or the ErrorRecord of what it raised, blamed at
    the sandbox boundary (a picklable record: Ray workers return it too)."""
    try:
        require_utf8(completion.text)
        return run(task, completion)
    except Exception as exc:  # noqa: BLE001 - blamed per sample; the group's other runs go on
        return blame(exc, "sandbox")


@dataclass(frozen=True)
class DomainExecute:
    """The default ExecuteFn: the domain's declared execute step (`Domain.execute`),
    its sandbox runs on this process's sandbox pool (configured from `pool`
    the first time, so a Ray actor configures its own) with each request's
    limits capped at `max_memory_mb` / `max_wall_s`. None for a domain with no
    execute step."""

    pool: Any = None
    """A SandboxConfig for the process-wide pool (None: leave the pool as configured)."""
    max_memory_mb: int | None = None
    max_wall_s: float | None = None
    seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Per-domain budget seconds (`Budget.seconds`, `tasks.domains.<name>.max_seconds`): the
    time of one execute step's runs together. Each run's wall and CPU limits are capped at
    what is left of it (the seconds the step's earlier runs took, by their `wall_s`; the wait
    for a pool slot does not count); once it is spent, a further run of the step does not
    start and returns status "timeout": the program the model wrote was too slow, so the
    verifier scores it (normally 0), never a mask."""

    def __call__(self, task: Task, completion: Completion) -> Any:
        from posttrain.domains.registry import get

        domain = get(task.domain)
        if not domain.executes:
            return None
        return domain.execute(task, completion.text, self.runner(task.domain))

    def runner(self, domain: str) -> Callable[[Any], Any]:
        from posttrain import sandbox

        configure_pool(self.pool)

        cap = self.max_wall_s
        budget = self.seconds.get(domain)
        used = [0.0]  # seconds this execute step's runs took so far

        def run(req: Any) -> Any:
            left = None if budget is None else budget - used[0]
            if left is not None and left <= 0:
                return sandbox.ExecResult("timeout", error=f"the domain's {budget:g}s per execute step are spent")
            wall = min((x for x in (cap, left) if x), default=None)
            result = sandbox.run(self.capped(req, wall), domain=domain)
            used[0] += result.wall_s
            return result

        return run

    def capped(self, req: Any, wall: float | None) -> Any:
        """`req` with its limits capped at max_memory_mb and `wall` seconds (wall and CPU)."""
        lim, changes = req.limits, {}
        if self.max_memory_mb and lim.memory_bytes > self.max_memory_mb << 20:
            changes["memory_bytes"] = self.max_memory_mb << 20
        if wall:
            changes.update({k: wall for k in ("wall_s", "cpu_s") if getattr(lim, k) > wall})
        return dataclasses.replace(req, limits=dataclasses.replace(lim, **changes)) if changes else req


_POOL_CONFIG: list[Any] = [None]
_POOL_LOCK = threading.Lock()


def configure_pool(config: Any) -> None:
    """Configure this process's sandbox pool for `config` (a SandboxConfig; None: leave it):
    a no-op once it is configured with an equal config, so a pool that runs with it (and the
    sessions it holds) is never closed; a different config replaces the pool. The loop calls
    it when the run opens, before the first sandbox use (cheat probes, the evaluation before
    training), so the execute stage's own call (`DomainExecute.runner`) finds it done."""
    if config is None or _POOL_CONFIG[0] == config:
        return
    from posttrain import sandbox

    with _POOL_LOCK:
        if _POOL_CONFIG[0] != config:
            sandbox.set_pool_config(config)
            _POOL_CONFIG[0] = config


class Workers(Protocol):
    async def encode(self, messages: Sequence[Message]) -> tuple[int, ...]: ...

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]: ...

    async def execute(self, task: Task, completions: Sequence[Completion]) -> tuple[Any, ...]:
        """Each completion's execution result, or the ErrorRecord of its failure (`execute_one`)."""

    async def verify(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]: ...

    def sync(self) -> None:
        """Bring the generating engine's weights up to the trainer's (before a step's generation)."""

    def end_sessions(self, keys: Sequence[str]) -> None:
        """The episodes `keys` ended: the engine drops their kept contexts (`Engine.end_sessions`).
        Returns at once (never waits for an engine call in progress)."""

    def cheap_verifier(self, domain: str) -> bool:
        """Whether `domain`'s verifier may run in the caller's thread (no verify stage hop)."""

    def inline(self, domain: str) -> bool:
        """Whether `domain`'s groups may take the direct path (pipeline/play.py, no stages)."""

    def pool_stats(self) -> dict[str, float]:
        """The step's stage-pool metrics (`pool_*`: actors per stage, changes so far); empty for
        a runtime whose pools are fixed."""

    def close(self) -> None: ...


class EmbeddedWorkers:
    """In-process workers: the engine in its own thread (one call at a time), the
    executor and the verifiers in thread pools sized for their stages (asyncio's
    default pool has only cores + 4 threads), or verification in a process pool."""

    def __init__(
        self,
        engine: Engine,
        execute: ExecuteFn | None = DomainExecute(),
        verify_processes: int = 0,
        verify: Callable[[Task, Sequence[Episode]], tuple[Verdict, ...]] = verify_group,
        execute_threads: int = 64,
        verify_threads: int = 16,
        source: Any = None,
    ) -> None:
        self.engine = engine
        self.source = source
        """With a source engine (the trainer's), `engine` is a detached copy that `sync()` refreshes."""
        self._execute = execute
        self._verify = verify
        self._lock = threading.Lock()
        self._staged: tuple[dict[str, Any], int] | None = None
        """Weights `sync` staged for the detached copy and their version (loaded between calls)."""
        self._synced = None if source is None else int(engine.version)
        self._gen_pool = ThreadPoolExecutor(1, thread_name_prefix="generate")
        self._exec_pool = ThreadPoolExecutor(execute_threads, thread_name_prefix="execute")
        self._verify_pool: _PoolExecutor = ThreadPoolExecutor(verify_threads, thread_name_prefix="verify")
        if verify_processes:
            import multiprocessing as mp

            from posttrain.domains import registry

            self._verify_pool = ProcessPoolExecutor(
                verify_processes,
                mp_context=mp.get_context("forkserver"),
                initializer=registry.adopt_sources,  # file domains rebuilt from this run's specs
                initargs=(registry.sources(),),
            )

    def sync(self) -> None:
        """Stage a copy of the source engine's weights for the detached copy when its version
        moved, and load it now unless an engine call is running; then the next call loads it
        before it generates (`generate_now`). Either way the copy changes only between engine
        calls: a call runs on the weights it started with, and its completions carry them."""
        if self.source is None or self._synced == self.source.version:
            return
        state = {k: v.detach().clone() for k, v in self.source.model.state_dict().items()}
        self._staged = (state, int(self.source.version))
        self._synced = int(self.source.version)
        if self._lock.acquire(blocking=False):
            try:
                self._load_staged()
            finally:
                self._lock.release()

    def _load_staged(self) -> None:
        """Load the weights `sync` staged, if any (the caller holds the engine lock)."""
        staged, self._staged = self._staged, None
        if staged is not None:
            self.engine.update_weights(staged[0])
            self.engine.version = staged[1]

    def cheap_verifier(self, domain: str) -> bool:
        """Whether `domain`'s verifier may be called inline, in the caller's thread: it declares
        itself `cheap` and runs in this process through the default `verify_group` (which
        turns any escape into a Verdict, blamed by its cause)."""
        from posttrain.domains.registry import get

        if isinstance(self._verify_pool, ProcessPoolExecutor) or self._verify is not verify_group:
            return False
        return is_cheap(get(domain).verifier)

    def inline(self, domain: str) -> bool:
        """Whether groups of `domain` may skip the stages (pipeline/play.py): single-turn,
        nothing to execute, and a cheap verifier (`cheap_verifier`)."""
        from posttrain.domains.registry import get

        if self._execute is not None and not isinstance(self._execute, DomainExecute):
            return False  # a custom ExecuteFn runs for every completion: it needs the execute stage
        d = get(domain)
        return self.cheap_verifier(domain) and d.environment() is None and not d.executes

    def encode_now(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return self.engine.encode_chat(messages)

    def encode_many(self, prompts: Sequence[Sequence[Message]]) -> list[tuple[int, ...] | Exception]:
        """Each prompt's ids as `encode_now` gives them, or the error that encoding it raised
        (`Engine.encode_chats`: the in-process HF engine's is one batched chat-template call)."""
        return self.engine.encode_chats(prompts)

    def end_sessions(self, keys: Sequence[str]) -> None:
        self.engine.end_sessions(keys)  # the Engine contract's (a no-op default); not under the call lock

    def pool_stats(self) -> dict[str, float]:
        return {}  # one process, fixed pools: nothing resizes

    def generate_now(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """The engine's call in the caller's thread (the direct path)."""
        with self._lock:
            self._load_staged()
            return self.engine.generate(requests)

    def verify_now(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
        """The group's verdicts in the caller's thread (the direct path)."""
        return self._verify(task, tuple(episodes))

    async def encode(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return self.encode_now(messages)

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return await asyncio.get_running_loop().run_in_executor(self._gen_pool, self.generate_now, requests)

    async def execute(self, task: Task, completions: Sequence[Completion]) -> tuple[Any, ...]:
        """Each completion's execution result or the ErrorRecord of its failure (`execute_one`),
        the group's runs concurrently."""
        from posttrain.domains.registry import get

        run = self._execute
        if run is None or (isinstance(run, DomainExecute) and not get(task.domain).executes):
            return (None,) * len(completions)  # nothing to run: no thread hop per completion
        loop = asyncio.get_running_loop()
        return tuple(
            await asyncio.gather(
                *(loop.run_in_executor(self._exec_pool, execute_one, run, task, c) for c in completions)
            )
        )

    async def verify(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
        return await asyncio.get_running_loop().run_in_executor(self._verify_pool, self._verify, task, tuple(episodes))

    def close(self) -> None:
        for pool in (self._gen_pool, self._exec_pool, self._verify_pool):
            # processes are joined (none outlive the run); threads finish their call on their own
            pool.shutdown(wait=isinstance(pool, ProcessPoolExecutor), cancel_futures=True)
