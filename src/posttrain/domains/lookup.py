"""lookup: a two-turn tool task whose answer is only reachable through the observation.

The prompt names a key (three letters); its value (digits) is hidden in the
task's reference and nowhere in the prompt. The model calls the tool with
`look:KEY`, the environment answers `KEY=VALUE`, and the model replies with
the value. An answer ends the episode (so does `done`); a malformed action or
a lookup of another key is observed ("error:...", "no_key:xyz") and the
episode goes on until the turn budget. No text the model reads or writes has
whitespace (keys, values and actions are single words), so the transcripts
its base is pretrained on stay short.

Invariant: the verifier decides from the task's reference and the model's own
actions only (never from an observation's text): outcome is 1 exactly when
the final answer equals the hidden value AND an earlier action looked up the
asked key. So guessing (even a lucky guess), echoing the prompt, copying the
observation line, or stopping without an answer all score 0.
Reward parts: outcome, process (share of well-formed actions) and efficiency
(2 turns / turns used); value = outcome x (0.7 + 0.15 process + 0.15 efficiency);
passed = outcome (a retry that gets there passes, at a lower reward).
One completion holding the actions one per line is replayed the same way
(the contract test's single-completion gold).
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Any

from posttrain.domains.base import Budget, ProceduralDomain, actions_of, extract_answer
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, Task

DIGITS = {1: 3, 2: 5}
"""Digits of the hidden value at each level."""
MIN_TURNS = 2
_LOOK = re.compile(r"look[:\s]\s*([a-z]+)")
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Action:
    """One parsed action: `look` (with a key), `answer` (with digits), `done`, or `bad`."""

    kind: str
    arg: str = ""


def parse_action(text: str) -> Action:
    """An action is its first non-empty line: `look:KEY` (or `look KEY`), `done`, or a number (bare or in
    <answer> tags)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if m := _LOOK.fullmatch(line):
        return Action("look", m.group(1))
    if line == "done":
        return Action("done")
    body = extract_answer(line)
    return Action("answer", body) if _NUMBER.fullmatch(body) else Action("bad", line)


def key_of(task: Task) -> str:
    return str(task.reference["key"])


class LookupEnv:
    """The tool: `look:KEY` returns `KEY=VALUE` for the task's key; an answer or `done` ends the episode.
    `step` answers (observation, done), which the driver takes as a StepResult without parts; the
    verifier computes the process and efficiency parts from the actions."""

    def reset(self, task: Task) -> str:
        self.key, self.value = key_of(task), str(task.reference["value"])
        return ""

    def step(self, action: str) -> tuple[str, bool]:
        act = parse_action(action)
        if act.kind == "look":
            return (f"{self.key}={self.value}" if act.arg == self.key else f"no_key:{act.arg}"), False
        if act.kind in ("answer", "done"):
            return "", True
        return "error:say_look:KEY,then_the_value", False

    def close(self) -> None:
        pass


class LookupVerifier:
    name = "lookup_copy"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        key, value = key_of(task), str(task.reference["value"])
        looked, answer, used, good = False, None, 0, 0
        for text in actions_of(episode):
            act = parse_action(text)
            used += 1
            good += act.kind != "bad"
            if act.kind == "look" and act.arg == key:
                looked = True
            if act.kind in ("answer", "done"):
                answer = act.arg if act.kind == "answer" else None
                break
        outcome = float(looked and answer == value)
        process = good / used if used else 0.0
        efficiency = min(1.0, MIN_TURNS / used) if used else 0.0
        parts = {"outcome": outcome, "process": process, "efficiency": efficiency}
        if not outcome:
            why = "no answer" if answer is None else ("answered without looking up" if not looked else "wrong value")
            return Score(0.0, parts, False, why)
        return Score(0.7 + 0.15 * process + 0.15 * efficiency, parts, True)


class Lookup(ProceduralDomain):
    name = "lookup"
    category = "agents"
    description = "look a key up with a tool (look:KEY), then reply with its value: only the observation has it"
    levels = 2
    budget = Budget(turns=3, tokens=12)
    verifier = LookupVerifier()

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:  # type: ignore[override]
        key = "".join(rng.choices(string.ascii_lowercase, k=3))
        digits = DIGITS[difficulty]
        value = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        return f"value_of:{key}?", {"key": key, "value": value}

    def environment(self) -> type[LookupEnv]:
        return LookupEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: look the key up, then copy the value."""
        return [f"look:{key_of(task)}", str(task.reference["value"])]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        return f"look:{key_of(task)}\n{_miscopy(str(task.reference['value']))}"

    def cheats(self, task: Task) -> list[str]:
        """Completions that try for reward without using the observation: each scores 0
        (as one completion and as the turns of an episode)."""
        value = str(task.reference["value"])
        key = key_of(task)
        return [
            value,
            task.prompt[-1].content,
            "done",
            "",
            f"look:{key}\ndone",
            f"look:{key}\n{key}={value}",
            f"look:{_other_key(key)}\n{value}",
        ]


def _other_key(key: str) -> str:
    return chr((ord(key[0]) - ord("a") + 1) % 26 + ord("a")) + key[1:]


def _miscopy(value: str) -> str:
    """The value copied wrongly: reversed, or (a palindrome) with its last digit changed."""
    flipped = value[::-1]
    return flipped if flipped != value else value[:-1] + str((int(value[-1]) + 1) % 10)


register(Lookup())
