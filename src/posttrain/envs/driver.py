"""The one episode driver: every multi-turn episode, in training and in evaluation, steps here.

Invariant: an episode's first observation (`reset`'s return) is in the prompt
before the first generation; each turn appends the model's action (loss mask 1)
and, unless the episode ended, the observation rendered by the chat template
(mask 0); the episode ends when `step` says done, at the turn budget, when
the action was truncated at its token budget, when its context no longer fits
the model (`out_of_context`: as truncated), when its own seconds (its steps
and its share of the engine calls) pass its time budget (`Budget.seconds`:
as truncated, scored: the model's turns and the code they ran made it long),
or when the action made the environment raise (a model fault: scored 0 with
the reason, never masked);
each Turn keeps the step's observation, parts, exec_result and its images' digests (the
images themselves ride on the observation's tool message into every later turn's request). Every scheduler of
a group's lifecycle (`pipeline.group.GroupRun`: the staged pipeline, embedded and Ray
runtimes alike, and the synchronous `pipeline.play`, for evaluation and tests) steps
episodes with these same functions; retries and verification are never done here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.domains.base import Budget, stable_hash
from posttrain.envs.base import Environment, Trajectory, as_step_result, make_environment
from posttrain.errors import ErrorRecord, ModelFault, PromptTooLong, blame
from posttrain.rollout import rollout_id
from posttrain.types import Completion, Episode, GenerationRequest, Message, SamplingParams, StepResult, Task

_UNSET: Any = object()


def open_envs(domain: Any, task: Task, n: int) -> list[tuple[Environment, str]]:
    """`n` fresh environments of `domain`, each reset on `task`, with its first
    observation. If one fails to start, those already open are closed."""
    opened: list[tuple[Environment, str]] = []
    try:
        for _ in range(n):
            env = make_environment(domain)
            if env is None:
                raise TypeError(f"domain {domain.name} has no environment")
            opened.append((env, ""))
            opened[-1] = (env, env.reset(task) or "")
    except BaseException:
        close_envs(e for e, _ in opened)
        raise
    return opened


def first_messages(task: Task, observation: str) -> list[Message]:
    """The prompt of an episode: the task's messages, then the first observation as a tool message."""
    return [*task.prompt, Message("tool", observation)] if observation else list(task.prompt)


def start(
    envs: Sequence[tuple[Environment, str]],
    task: Task,
    prompt_ids: Sequence[tuple[int, ...]],
    max_turns: int,
    max_seconds: float | None = None,
    train_from: int = 1,
) -> list[Trajectory]:
    """One trajectory per opened environment; `prompt_ids[i]` is `first_messages` of env i, encoded;
    `max_seconds`: each episode's time budget (`Trajectory.max_seconds`); `train_from`: the
    domain's first turn that carries the loss (`Budget.train_from`), counted from the turns a
    derived task's prompt already holds (`TaskMeta.branched`)."""
    first = max(1, train_from - task.meta.branched)
    return [
        Trajectory(
            env,
            first_messages(task, obs),
            ids,
            max_turns,
            first_observation=obs,
            max_seconds=max_seconds,
            train_from=first,
        )
        for (env, obs), ids in zip(envs, prompt_ids)
    ]


def spent(trajectories: Sequence[Trajectory], seconds: float) -> None:
    """`seconds` of generation joins each of `trajectories`' own time (their share of an engine call)."""
    for t in trajectories:
        t.own_s += seconds


def requests(
    trajectories: Sequence[Trajectory], params: SamplingParams, base_seed: int | None, request_id: str
) -> tuple[list[GenerationRequest], list[list[Trajectory]]]:
    """The generation requests of the trajectories due a turn, and for each request
    the trajectories its completions go to (in order). On the first turn, samples
    that share a prompt are one request of n (shared-prefix group sampling). Each
    sample names its episode's session (`session_keys`), so an engine that keeps
    contexts computes only each later turn's new tokens. Each request carries every image of
    its context (`Trajectory.images`: the task prompt's, then each observation's), which the
    engine reads or refuses."""
    due = [(i, t) for i, t in enumerate(trajectories) if not t.done and not t.awaiting_step]
    one = dataclasses.replace(params, n=1)
    if due and all(not t.turns for _, t in due) and len({t.prompt_ids for _, t in due}) == 1:
        group = dataclasses.replace(params, n=len(due), seed=base_seed)
        keys = tuple(rollout_id(request_id, i) for i, _ in due)
        first = due[0][1]
        return [GenerationRequest(first.prompt_ids, group, request_id, keys, first.images)], [[t for _, t in due]]
    reqs = [
        GenerationRequest(
            t.context(),
            dataclasses.replace(one, seed=None if base_seed is None else stable_hash(base_seed, i, len(t.turns))),
            f"{request_id}:{i}",
            (rollout_id(request_id, i),),
            t.images,
        )
        for i, t in due
    ]
    return reqs, [[t] for _, t in due]


def session_keys(request_id: str, n: int) -> list[str]:
    """The session keys (rollout ids) of a group's `n` episodes, as `requests` names them: what
    `Engine.end_sessions` takes once the episodes ended."""
    return [rollout_id(request_id, i) for i in range(n)]


def add_actions(targets: Sequence[Sequence[Trajectory]], outputs: Sequence[Sequence[Completion]]) -> None:
    """Each request's completions become the next action of its trajectories."""
    for ts, group in zip(targets, outputs):
        for t, c in zip(ts, group):
            t.add_action(c)


def step(t: Trajectory) -> None:
    """Give the last action to the environment and record its answer (blocking:
    the pipeline runs it in a thread). What the step raises is blamed by its
    cause (`errors.blame`): an infra error (SandboxError: the sandbox failed)
    propagates and the action stays unstepped, so a retry steps it again;
    anything else the action made the environment raise ends the episode as
    the model's fault (`fault`), with the reason as its last observation."""
    t0 = time.perf_counter()
    try:
        got = t.env.step(require_utf8(t.turns[-1].action))
    except Exception as exc:
        rec = blame(exc, "sandbox")
        if rec.kind != "model":
            raise  # the sandbox's failure: its time is not the episode's
        fault(t, rec.message)
        return
    t.own_s += time.perf_counter() - t0  # the step ran what the action asked: the episode's own time
    t.record(as_step_result(got))


def require_utf8(text: str) -> str:
    """`text`, when it can be encoded as UTF-8 (what every host tool and sandbox takes);
    else ModelFault: a lone surrogate in what the model wrote is the model's, decided here
    before host code (a sandbox request, a file write) would fail on it as its own error."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ModelFault(f"the output is not valid UTF-8 (lone surrogate at position {exc.start})") from None
    return text


def fault(t: Trajectory, message: str) -> None:
    """End the episode as the model's fault: the last action is answered with the reason
    (what the model would have seen), and `t.fault` keeps it for scoring (0, never masked)."""
    if t.awaiting_step:
        t.record(StepResult(f"error: {message}", done=True))
    t.fault, t.done = message, True


def out_of_context(t: Trajectory) -> None:
    """End the episode whose context the engine can no longer take (PromptTooLong on a
    later turn: the model's own turns filled it): as if its last action was truncated."""
    t.finish_reason, t.done = "length", True


def generate_each(
    generate: Callable[[list[GenerationRequest]], Sequence[Sequence[Completion]]],
    reqs: Sequence[GenerationRequest],
    targets: Sequence[Sequence[Trajectory]],
) -> None:
    """Generate the turn's requests in one call; when it fails with PromptTooLong over several
    requests, one by one, so only the episodes whose context no longer fits end there."""
    try:
        add_actions(targets, generate(list(reqs)))
        return
    except PromptTooLong:
        if len(reqs) == 1 and all(t.turns for t in targets[0]):
            for t in targets[0]:
                out_of_context(t)
            return
        if len(reqs) == 1:
            raise  # the task's own prompt: not an episode's doing
    for req, ts in zip(reqs, targets):
        generate_each(generate, [req], [ts])


def end_failed(t: Trajectory, rec: ErrorRecord) -> None:
    """End the episode by what failed it: a model fault (scored 0) or an infra error (masked)."""
    if rec.kind == "model":
        fault(t, rec.message)
    else:
        mask(t, rec.kind, rec.message)


def mask(t: Trajectory, kind: str, message: str = "") -> None:
    """End the episode as masked by an infra error of `kind` (after its retries); `message` says
    what failed (`Trajectory.error_message`)."""
    t.error, t.error_message, t.done, t.awaiting_step = kind, message, True, False


def observe(t: Trajectory, encode: Callable[[Sequence[Message]], Sequence[int]]) -> None:
    """After a step that did not end the episode: the observation's tokens join the context.
    An observation that cannot be encoded (the action put text in it the tokenizer refuses)
    ends the episode as the model's fault; an infra error of the encoder masks it."""
    if t.done:
        return
    try:
        rendered = [encode(m) for m in t.render_inputs()]
    except Exception as exc:
        end_failed(t, blame(exc, "infra"))
        return
    t.add_observation(*rendered)


def exec_action(t: Trajectory) -> Completion:
    """What the execute stage runs after the episode: the last action."""
    c = t.completion()
    return dataclasses.replace(c, token_ids=(), logprobs=(), text=t.turns[-1].action if t.turns else "")


def episode(t: Trajectory, exec_result: Any = _UNSET) -> Episode:
    """What the verifier scores: the last action, every turn, and the execute stage's
    result (for a domain that executes) or else the last turn's exec_result."""
    last = t.turns[-1].exec_result if t.turns else None
    return Episode(
        t.turns[-1].action if t.turns else "",
        tuple(t.turns),
        t.finish_reason,
        last if exec_result is _UNSET else exec_result,
    )


def close_envs(envs: Any) -> None:
    """Close each environment once (a terminal env holds a sandbox session until closed)."""
    seen: set[int] = set()
    for env in envs:
        if env is None or id(env) in seen:
            continue
        seen.add(id(env))
        try:
            env.close()  # a declared member of the contract (make_environment checks it)
        except Exception:  # closing is best effort; the pool replaces a broken worker
            pass


def turns_of(domain: Any, budget: Budget | None, task: Task | None = None) -> int:
    """The episode's turn budget: the override (tasks.domains.X) or the domain's declaration,
    less the turns a derived task's prompt already holds (`TaskMeta.branched`); at least 1."""
    return max(1, (budget or domain.budget).turns - (task.meta.branched if task is not None else 0))
