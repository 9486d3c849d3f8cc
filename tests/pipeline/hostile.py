"""A seeded corpus of hostile model outputs, and an engine that plays them turn by turn.

The corpus is what a policy under RL can write: absurd numbers (1e309, a 10001-digit
integer, NaN, inf), values nested 100k deep, lone surrogates and control characters,
very long strings, the empty output, tool calls to unknown tools or with arguments of the
wrong type, answers that game the answer tag (thousands of tags, nested ones, one in a
fence, unclosed ones), JSON with bools for numbers, and each task's own gold answer with
its numbers and strings replaced by those values (so the hostile value gets past the first parser into deeper code).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from pipeline_testlib import ScriptedEngine

from posttrain.types import Completion, GenerationRequest

DEEP = 100_000
NUMBERS = ("1e309", "-1e309", "9" * 10_001, "NaN", "nan", "Infinity", "-inf", "1e-400", "0x" + "f" * 300, "-0")
STRANGE = ("\ud800", "\udfff\ud800x", "\x00\x01\x02\x1b[2J\x7f", "\u202e\u2066", "\r\n" * 50, "A" * 200_000)


def generic() -> list[str]:
    """Outputs that are hostile whatever the task."""
    nest = "[" * DEEP + "]" * DEEP
    deep_obj = '{"a":' * DEEP + "1" + "}" * DEEP
    calls = [
        '{"name": "no_such_tool", "arguments": {}}',
        '{"name": 5, "arguments": "x"}',
        '{"name": "find_accounts", "arguments": [1, 2]}',
        '{"name": null}',
        '{"name": "transfer", "arguments": {"amount": 1e309, "from_id": NaN, "to_id": [[]]}}',
        '{"name": "transfer", "arguments": ' + deep_obj + "}",
        "[]",
        "null",
        '"just a string"',
    ]
    wrapped = [f"<answer>{x}</answer>" for x in (*NUMBERS, nest, deep_obj, "\ud800", "")]
    code = ["```python\n" + nest + "\n```", "```python\n" + "(" * DEEP + "\n```", "```bash\n" + "A" * 200_000 + "\n```"]
    tags = [  # answers that game `extract_answer`: many tags, nested ones, one inside a fence, unclosed ones
        "<answer>1</answer>" * 5000,
        "<answer><answer>1</answer></answer>",
        "```\n<answer>1</answer>\n```\n<answer>",
        "<answer>" * 50_000,
        '<answer>{"private": 1, "value": true, "n": false}</answer>',  # bools as numbers, and back
    ]
    odd = [*tags, "\\boxed{" * 5000, "look:" + nest]
    return ["", " ", *NUMBERS, *STRANGE, nest, deep_obj, *calls, *wrapped, *code, *odd]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_STRING = re.compile(r'"([^"\\]{1,40})"')


def mutated(gold: str, rng: random.Random, k: int = 3) -> list[str]:
    """`gold` with its numbers, then its quoted strings, replaced by hostile values, and
    `gold` truncated: a hostile value in a well-formed action."""
    out = [gold[: len(gold) // 2]]
    for _ in range(k):
        num = rng.choice(NUMBERS)
        out.append(_NUMBER.sub(lambda _m, num=num: num, gold))
        odd = rng.choice(("\ud800", "[" * 1000, "A" * 50_000, "\x00", "1e309"))
        out.append(_STRING.sub(lambda _m, odd=odd: '"' + odd.replace('"', "") + '"', gold))
    nested = _NUMBER.sub(lambda m: "[" * 5000 + m.group(0) + "]" * 5000, gold)
    return [*out, nested]


def corpus(golds: Sequence[str], seed: int = 0) -> list[str]:
    """The generic outputs and the mutations of each gold action, without repeats, in a seeded order."""
    rng = random.Random(seed)
    seen: dict[str, None] = dict.fromkeys(generic())
    for g in golds:
        seen.update(dict.fromkeys(mutated(g, rng)))
    out = list(seen)
    rng.shuffle(out)
    return out


def pick(items: Sequence[str], k: int, seed: int) -> list[str]:
    """`k` of `items`, seeded (all of them when there are no more than `k`)."""
    return list(items) if len(items) <= k else random.Random(seed).sample(list(items), k)


class PlanEngine(ScriptedEngine):
    """Sample i of a group plays `plans[i]`: its action at turn t is `plans[i][t]` (the last one
    repeated past its end). The first turn is one request of n; later turns are one request per
    trajectory, whose id ends in `:i` (envs.driver.requests)."""

    def __init__(self, plans: Sequence[Sequence[str]]) -> None:
        super().__init__(lambda context, j: "")
        self.plans = [list(p) for p in plans]
        self.turn: dict[int, int] = {}

    def _action(self, i: int) -> str:
        t = self.turn.get(i, 0)
        self.turn[i] = t + 1
        plan = self.plans[i]
        return plan[min(t, len(plan) - 1)]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        out = []
        for req in requests:
            head, _, tail = req.request_id.rpartition(":")
            index = [int(tail)] if head and tail.isdigit() and req.params.n == 1 else range(req.params.n)
            group = []
            for i in index:
                text = self._action(i)
                ids = self.encode(text) + (self.END,)
                group.append(Completion(req.prompt_ids, ids, text, (-0.5,) * len(ids), "stop", self.version))
            out.append(group)
        return out
