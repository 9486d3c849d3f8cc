"""doc_fix: a learnable tier of the documents family, extract -> reconciliation report -> revise.

The prompt is a tiny invoice, `inv:a=120,b=24,tot=154`: line items and a printed
total. The task is to extract the fields with `tot` the invoice's true total
(the sum of the line items). The printed total is right on about a third of the
tasks (STALE_SHARE of them carry a one-digit typo), so the gold first attempt
copies the printed fields, and it is accepted only when the print was right.
The validator (the family's reconciliation check) sees only the submitted
object: it answers `ok` (the episode ends), or says which field does not
reconcile and by how much, `tot_not_sum:144` (the sum of the SUBMITTED items),
or what is malformed (`missing:tot`, `unknown:x`, `nan:a`, `error:...`). The
gold revision resubmits the fields with the reported sum as `tot`. `done` ends
the episode.

Actions are one line: `a=120,b=24,tot=144` (the compact form) or the family's
JSON object in <answer> tags. No text the model reads or writes has whitespace.

Invariants: the validator's report is a function of the submission alone (it
never reads the task's reference, so no hidden value reaches an observation
that the submission did not already imply), and the verifier decides from the
task's reference and the model's own actions (never an observation's text):
the final object (the last one submitted, up to the first the validator
accepts) is compared field by field with the hidden gold (`field_matches`, the
family's comparison). An object that reconciles internally but misreads an item
(the visible check passes) still fails.
Reward parts: outcome, precision, recall, process (the validator accepts the
final object), efficiency (turns needed / turns used: 1 when the print was
right, else 2); value = 0.85 + 0.15 efficiency when every field is right, else
0.5 x the credit beyond the printed fields (`beyond_printed`: copying the print pays
nothing). One completion holding the actions one per line is replayed the same
way (the contract test's single-completion gold).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from posttrain.domains._common import answer_json, f1
from posttrain.domains.base import Budget, ProceduralDomain, actions_of
from posttrain.domains.docfin import field_matches
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, StepResult, Task

ITEMS = {1: ("a", "b"), 2: ("a", "b", "c")}
"""The line-item keys at each level; the total's key is TOTAL."""
TOTAL = "tot"
RANGES = {"a": (100, 499), "b": (10, 99), "c": (100, 399)}
"""Each item's range: totals stay three digits."""
STALE_SHARE = 2 / 3
"""Share of tasks whose printed total is a typo."""
PREFIX = "inv:"
_COMPACT = re.compile(r"[a-z]+=\d{1,6}(,[a-z]+=\d{1,6})*")
_DIGITS = re.compile(r"\d{1,6}")


@dataclass(frozen=True)
class Action:
    """One parsed action: `fields` (a dict), `done`, or `bad` (with the line)."""

    kind: str
    fields: dict[str, Any] | None = None
    line: str = ""


def parse_action(text: str) -> Action:
    """An action is its first non-empty line: `done`, `k=N,k=N` or a JSON object (in <answer> tags or bare)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if line == "done":
        return Action("done")
    if _COMPACT.fullmatch(line):
        pairs = [pair.split("=", 1) for pair in line.split(",")]
        keys = [k for k, _ in pairs]
        return Action("fields", dict(pairs)) if len(set(keys)) == len(keys) else Action("bad", line=line)
    got = answer_json(line)
    return Action("fields", got) if isinstance(got, dict) else Action("bad", line=line)


def _whole(value: Any) -> int | None:
    """A whole number from a JSON int or a digit string; None otherwise (bools and floats included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 10**6 else None
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        return int(value.strip())
    return None


def report(fields: dict[str, Any], keys: tuple[str, ...]) -> str:
    """The validator's answer to one submitted object ("ok" when it accepts): the first missing,
    unknown or non-numeric field, else whether the total reconciles with the submitted items."""
    for key in keys:
        if key not in fields:
            return f"missing:{key}"
    for key in fields:
        if key not in keys:
            return f"unknown:{key}"[:24]
    values = {key: _whole(fields[key]) for key in keys}
    for key in keys:
        if values[key] is None:
            return f"nan:{key}"
    total = sum(v for k, v in values.items() if k != TOTAL and v is not None)
    return "ok" if values[TOTAL] == total else f"{TOTAL}_not_sum:{total}"


def render(fields: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in fields.items())


def keys_of(task: Task) -> tuple[str, ...]:
    """The asked keys, items first, the total last (the reference's order)."""
    return tuple(task.reference["fields"])


def malformed(keys: tuple[str, ...]) -> str:
    return "error:say_" + ",".join(f"{k}=N" for k in keys)


class DocFixEnv:
    """The reconciliation validator (the Environment contract): each action is the extracted
    object; the observation is `ok` (the episode ends) or the validator's report; `done` ends the
    episode. It reads only the asked keys from the task. Turn parts: {"process": 1.0 when accepted}."""

    def __init__(self) -> None:
        self.keys: tuple[str, ...] = ()

    def reset(self, task: Task) -> str:
        self.keys = keys_of(task)
        return ""  # the invoice is in the prompt

    def step(self, action: str) -> StepResult:
        act = parse_action(action)
        if act.kind == "done":
            return StepResult("", True, {"process": 0.0})
        if act.kind == "bad" or act.fields is None:
            return StepResult(malformed(self.keys), False, {"process": 0.0})
        seen = report(act.fields, self.keys)
        return StepResult(seen, seen == "ok", {"process": float(seen == "ok")})

    def close(self) -> None:
        self.keys = ()


def final_object(actions: list[str], keys: tuple[str, ...], turns: int) -> tuple[dict[str, Any] | None, int, bool]:
    """(the last object submitted up to the first accepted one, actions used, accepted), replaying
    the validator on at most `turns` actions; `done` stops the replay."""
    final, used, accepted = None, 0, False
    for text in actions[:turns]:
        used += 1
        act = parse_action(text)
        if act.kind == "done":
            break
        if act.kind == "fields" and act.fields is not None:
            final = act.fields
            if report(final, keys) == "ok":
                accepted = True
                break
    return final, used, accepted


class DocFixVerifier:
    """Field comparison of the final object with the hidden gold (the family's `field_matches`)."""

    name = "doc_fix_fields"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        gold: dict[str, int] = task.reference["fields"]
        got, used, accepted = final_object(actions_of(episode), keys_of(task), DocFix.budget.turns)
        if got is None:
            parts = {"outcome": 0.0, "precision": 0.0, "recall": 0.0, "process": 0.0, "efficiency": 0.0}
            return Score(0.0, parts, False, "no object")
        tp = sum(1 for k, v in got.items() if k in gold and field_matches(gold[k], v))
        precision, recall, _ = f1(tp, len(got), len(gold))
        ok = tp == len(gold) == len(got)
        need = 2 if task.reference["stale"] else 1
        efficiency = min(1.0, need / used) if ok else 0.0
        parts = {
            "outcome": float(ok),
            "precision": precision,
            "recall": recall,
            "process": float(accepted),
            "efficiency": efficiency,
        }
        if not ok:
            value = 0.5 * beyond_printed(got, gold, task.reference["printed"])
            reason = f"{tp}/{len(gold)} fields right (credit counts the fields the print got wrong)"
            return Score(value, parts, False, reason)
        return Score(0.85 + 0.15 * efficiency, parts, True)


def beyond_printed(got: dict[str, Any], gold: dict[str, int], printed: dict[str, int]) -> float:
    """Partial credit for what the submission changed, never for the untouched document: the share
    of the fields the print got wrong (the task's work: the total of a stale task) that the
    submission gets right, less one for each field the print had right that it gets wrong and for
    each unknown key, never below 0; 0 where the print was right throughout. Copying the printed
    fields scores 0 (before: 0.5 x F1, 0.33 for the printed fields of a stale task)."""
    work = [k for k in gold if printed.get(k) != gold[k]]
    if not work:
        return 0.0
    right = sum(1 for k in work if k in got and field_matches(gold[k], got[k]))
    broke = sum(1 for k in gold if k not in work and not (k in got and field_matches(gold[k], got[k])))
    extra = sum(1 for k in got if k not in gold)
    return max(0.0, (right - broke - extra) / len(work))


def typo(value: int, rng: random.Random) -> int:
    """`value` with one digit changed (a three-digit number stays three digits)."""
    digits = list(str(value))
    i = rng.randrange(len(digits))
    choices = [d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0")]
    digits[i] = rng.choice(choices)
    return int("".join(digits))


class DocFix(ProceduralDomain):
    name = "doc_fix"
    category = "documents"
    description = "extract an invoice's fields with its true total: a validator reports a total that does not reconcile"
    levels = 2
    budget = Budget(turns=3, tokens=32, seconds=10.0)
    partial_credit = True
    verifier = DocFixVerifier()

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:
        items = {k: rng.randint(*RANGES[k]) for k in ITEMS[difficulty]}
        total = sum(items.values())
        stale = rng.random() < STALE_SHARE
        printed = {**items, TOTAL: typo(total, rng) if stale else total}
        return PREFIX + render(printed), {"fields": {**items, TOTAL: total}, "printed": printed, "stale": stale}

    def environment(self) -> type[DocFixEnv]:
        return DocFixEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: copy the printed fields; when the validator reports the total, resubmit
        with the reported sum."""
        printed, fields = task.reference["printed"], task.reference["fields"]
        return [render(printed), render(fields)] if task.reference["stale"] else [render(printed)]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        fields = dict(task.reference["fields"])
        fields[TOTAL] = _miscopy(fields[TOTAL])
        return render(fields)

    def cheats(self, task: Task) -> list[str]:
        """Completions that try for reward without extracting the invoice right; each scores below the
        gold and never passes, as one completion and as the turns of an episode: stopping, the prompt
        echoed, only the total, the validator's line copied, an object that satisfies the validator but
        misreads two items, the printed total kept (stale tasks), an item changed so the printed total
        reconciles (stale tasks), and the family's wrong-JSON-type proxies."""
        fields, printed = task.reference["fields"], task.reference["printed"]
        keys, total = keys_of(task), fields[TOTAL]
        shifted = {**fields, keys[0]: fields[keys[0]] + 1, keys[1]: fields[keys[1]] - 1}
        out = [
            "",
            "done",
            task.prompt[-1].content,
            f"{TOTAL}={total}",
            f"{TOTAL}_not_sum:{total}",
            f"{render(fields)[:-1]}\n{TOTAL}_not_sum:{total}",
            render(shifted),
            "<answer>{}</answer>",
            f"<answer>{json.dumps(dict.fromkeys(fields, True))}</answer>",
            f"<answer>{json.dumps({k: str(v) + '.5' for k, v in fields.items()})}</answer>",
        ]
        if task.reference["stale"]:
            forced = {**printed, keys[0]: max(0, printed[TOTAL] - sum(printed[k] for k in keys[1:-1]))}
            out += [render(printed), "\n".join([render(printed)] * 3), render(forced)]
        return out


def _miscopy(value: int) -> int:
    """The number copied wrongly: reversed, or (a palindrome) with its last digit changed."""
    flipped = int(str(value)[::-1])
    return flipped if flipped != value else value - value % 10 + (value + 1) % 10


register(DocFix())
