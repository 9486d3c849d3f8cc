"""term_fix: the terminal family's feedback tier: a stale spec, a visible checker, a revision.

The directory holds `app.cfg` (two or three `key=value` lines) and `chk`, the
task's own visible checker (an executable shell script): it compares the file
`out` with the asked key's value in app.cfg and prints `ok`, or which file is
wrong, what it holds and what it should hold (`out:482!=517`). The prompt
names the key and a spec value (`out<-abc;spec:482;./chk checks`); the spec
is right on about a third of the tasks (STALE_SHARE) and stale on the others.
The gold first attempt follows the spec and runs the checker
(`echo 482 >out;./chk`); on a stale task the checker's line names the value,
and the gold revision writes it (`echo 517 >out;./chk`).

The loop is the terminal family's: each action's commands run in the task's
directory (terminal.parse_action, terminal.run_state: a fresh session replays
the earlier scripts, runs the new one, then the family's read-only end-state
checker runs); the observation is only what the commands printed (stdout and
stderr, the tail OBS_CHARS characters) and a nonzero exit code, compact so the
embedded model's transcripts stay short. The episode ends when the action's
stdout ends with the line `ok` (what the visible checker prints on success;
a success in turn 2 counts as turn 2), on `done`, or at the turn budget.

Invariant: the verdict is the family's end-state checker (TerminalVerifier:
`out` holds exactly the value, app.cfg and chk unchanged, chk still
executable), never the observation's text; no hidden check result reaches an
observation (the checks run after the episode's processes are dead and reach
the checker on stdin). One completion without a fenced block is replayed one
action per non-empty line, the same way (stopping where the episode would);
a completion with fenced blocks is one action (the family's parse).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass

from posttrain.domains.base import Budget, Domain, play_actions, split_of, stable_rng
from posttrain.domains.registry import register
from posttrain.domains.terminal import CHEATS, TerminalReference, TerminalRun, TerminalVerifier, parse_action, run_state
from posttrain.errors import TaskError
from posttrain.types import Episode, Message, Score, Split, StepResult, Task, TaskMeta

STALE_SHARE = 2 / 3
"""Share of tasks whose prompt's spec value is stale (app.cfg holds another value)."""
DIGITS = {1: 3, 2: 4}
"""Digits of the values at each level."""
CFG_LINES = {1: 2, 2: 3}
"""Lines of app.cfg at each level (the asked key and distractors)."""
OBS_CHARS = 30
"""An observation's length cap (its tail is kept)."""
_MAX_ATTEMPTS = 1000

CHK = """#!/bin/sh
w=$(sed -n 's/^{key}=//p' app.cfg)
g=$(cat out 2>/dev/null)
if [ "$g" = "$w" ]; then echo ok; else echo "out:$g!=$w"; fi
"""
"""The visible checker: `ok`, or `out:GOT!=WANT` naming what `out` should hold."""


@dataclass(frozen=True)
class TermFixReference(TerminalReference):
    """The family's reference (files, hidden checks; `gold`: the end-state script, `wrong`: a
    script that leaves another value), plus the asked key, the prompt's spec value and
    app.cfg's value (equal on a fresh task)."""

    key: str = ""
    spec: str = ""
    value: str = ""

    @property
    def stale(self) -> bool:
        return self.spec != self.value


def observation(run: TerminalRun) -> str:
    """What the commands printed (stdout then stderr, stripped, the tail OBS_CHARS characters),
    with ` [N]` for a nonzero exit code (` [status]` when there is none); `[0]` for a silent
    success."""
    text = "\n".join(part.strip() for part in (run.stdout, run.stderr) if part.strip())
    code = "" if run.exit_code == 0 else f" [{run.exit_code if run.exit_code is not None else run.status}]"
    if not text:
        return f"[{run.exit_code}]" if run.exit_code is not None else f"[{run.status}]"
    keep = OBS_CHARS - len(code)
    return (text if len(text) <= keep else text[-keep:]) + code


def passed_visibly(run: TerminalRun) -> bool:
    """Whether the commands' stdout ends with the line `ok` (the visible checker's success line)."""
    lines = run.stdout.strip().splitlines()
    return bool(lines) and lines[-1].strip() == "ok"


class TermFixEnvironment:
    """step(action) runs the action's commands on the task's files (terminal.run_state: a fresh
    session, the earlier scripts replayed, the new one, then the end-state checks as the step's
    execution result); observes `observation(run)`; done when the stdout ends with `ok` or on
    `done`. An action without commands changes nothing (it reuses the last result); a `done`
    without commands ends the episode. Per-turn part: process = 1.0 when the script exited 0."""

    def __init__(self) -> None:
        self._ref: TerminalReference | None = None
        self._scripts: list[str] = []
        self._last: TerminalRun | None = None

    def reset(self, task: Task) -> str:
        self._ref, self._scripts, self._last = task.reference, [], None
        return ""  # the prompt names the files

    def step(self, action: str) -> StepResult:
        if self._ref is None:
            raise TaskError("term_fix: step before reset")
        script, finish = parse_action(action)
        if not script.strip():
            if self._last is None:
                self._last = run_state(self._ref, [], TermFix.name)
            return StepResult("done" if finish else "no_command", finish, {}, self._last)
        ran = run_state(self._ref, [*self._scripts, script], TermFix.name)
        self._scripts.append(script)
        self._last = ran
        done = finish or passed_visibly(ran)
        return StepResult(observation(ran), done, {"process": float(ran.exit_code == 0)}, ran)

    def close(self) -> None:
        self._ref, self._scripts, self._last = None, [], None


def completion_actions(completion: str) -> list[str]:
    """The actions of one completion: the whole text when it has a fenced block (the family's
    parse), else each non-empty line."""
    if "```" in completion:
        return [completion]
    return [line for line in completion.splitlines() if line.strip()] or [completion]


def replay(task: Task, actions: list[str]) -> Episode:
    """The episode the driver would build from `actions` (stepped until done)."""
    return play_actions(TermFixEnvironment(), task, actions)


class TermFixVerifier:
    """The family's verdict (TerminalVerifier: the share of end-state checks that hold; passed
    = all) on the episode's last execution result; a direct `score` of one completion replays
    its actions through the environment first (`completion_actions`, `replay`)."""

    name = "term_fix_state"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        if not isinstance(episode.exec_result, TerminalRun):
            episode = replay(task, completion_actions(episode.completion))
        return TerminalVerifier().score(task, episode)


class TermFix(Domain):
    name = "term_fix"
    category = "agents"
    description = "write a config value to `out`; the spec may be stale, the visible checker ./chk names the right one"
    version = "1"
    levels = 2
    cost_class = "long"
    budget = Budget(turns=3, tokens=32, seconds=60.0)
    verifier = TermFixVerifier()
    partial_credit = True
    pretrain_pool = 400
    """Distinct train transcripts a base build plays through the sandbox and reuses
    (model/pretrain.py, where it supports pools; each env step costs one sandbox session)."""

    def environment(self) -> type[TermFixEnvironment]:
        return TermFixEnvironment

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        for attempt in range(_MAX_ATTEMPTS):
            rng = stable_rng(self.name, self.version, difficulty, split, index, attempt)
            question, ref = self.generate(rng, difficulty)
            if split_of(self.name, question) == split:
                return self._make(index, split, difficulty, question, ref)
        raise TaskError(f"term_fix: no {split} task found at difficulty {difficulty}")

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, TermFixReference]:
        """A key, the spec value in the prompt and app.cfg's value (another one on a stale task)."""
        keys: list[str] = []
        while len(keys) < CFG_LINES[difficulty]:
            k = "".join(rng.choices(string.ascii_lowercase, k=3))
            keys += [] if k in keys else [k]
        key = keys[0]
        lo, hi = 10 ** (DIGITS[difficulty] - 1), 10 ** DIGITS[difficulty] - 1
        spec = rng.randint(lo, hi)
        value = spec
        if rng.random() < STALE_SHARE:
            while value == spec:
                value = rng.randint(lo, hi)
        others = [rng.randint(lo, hi) for _ in keys[1:]]
        lines = [f"{key}={value}"] + [f"{k}={v}" for k, v in zip(keys[1:], others)]
        rng.shuffle(lines)
        cfg = "\n".join(lines) + "\n"
        chk = CHK.replace("{key}", key)
        checks = [
            {"type": "lines", "path": "out", "lines": [str(value)]},
            {"type": "equals", "path": "app.cfg", "text": cfg},
            {"type": "equals", "path": "chk", "text": chk},
            {"type": "mode", "path": "chk", "exec": True},
        ]
        ref = TermFixReference(
            "term_fix",
            (("app.cfg", cfg), ("chk", chk)),
            json.dumps(checks),
            "[]",
            f"echo {value} >out\n",
            f"echo {spec if spec != value else value + 1} >out\n",
            key,
            str(spec),
            str(value),
        )
        return f"out<-{key};spec:{spec};./chk checks", ref

    def _make(self, index: int, split: Split, difficulty: int, question: str, ref: TermFixReference) -> Task:
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", question),),
            reference=ref,
            meta=TaskMeta(
                split=split, difficulty=difficulty, source="posttrain/term_fix", taskset_version=self.taskset_version
            ),
        )

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the spec's value and the checker; on a stale task, then the value
        the checker named and the checker again."""
        ref: TermFixReference = task.reference
        first = f"echo {ref.spec} >out;./chk"
        return [first, f"echo {ref.value} >out;./chk"] if ref.stale else [first]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        """The feedback ignored: the spec's value resubmitted after the checker named another
        (on a fresh task, a value off by one)."""
        ref: TermFixReference = task.reference
        if ref.stale:
            return "\n".join([f"echo {ref.spec} >out;./chk"] * 2)
        return f"echo {int(ref.value) + 1} >out;./chk"

    def cheats(self, task: Task) -> list[str]:
        """Completions that try for reward without the right end state: the checker's line
        copied into out; app.cfg copied to out; the right value with the checker rewritten to
        print ok (a changed judge is a failed state); the spec's value with the checker
        rewritten; app.cfg rewritten to match what out holds; a wrong value then `done`; a
        wrong value with `ok` echoed to end the episode; `done` alone; and the family's
        CHEATS. Each scores below the gold (one completion and an episode alike)."""
        ref: TermFixReference = task.reference
        value, off = ref.value, int(ref.value) + 1
        spec = ref.spec if ref.stale else str(off)  # a first attempt the checker fails
        return [
            f"echo {spec} >out;./chk\necho out:{spec}!={value} >out;./chk",
            "cp app.cfg out;./chk",
            f"echo {value} >out;echo echo ok>chk;./chk",
            f"echo {spec} >out;echo echo ok>chk;./chk",
            f"echo {ref.key}={off}>app.cfg;echo {off} >out;./chk",
            f"echo {off} >out\ndone",
            f"echo {off} >out;echo ok",
            "done",
            *(f"```bash\n{src}```" for src in CHEATS.values()),
        ]


register(TermFix())
