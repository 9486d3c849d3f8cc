"""ifeval: instruction following with constraints a program checks exactly (the kinds IFEval uses).

A task is a short writing prompt about a topic (the held-out split's topics, EVAL_TOPICS, are
never drawn for training) ("Write a short text about the ocean.") with
one constraint (level 1) or two compatible ones (level 2), drawn from: a word count (at
least / at most N words), an exact sentence count, a required word, a forbidden word, all
lowercase, all uppercase, the whole reply one JSON object, exactly N markdown bullets, a
fixed ending phrase. The task also requires content: the topic word must appear (so an
empty reply, or one made of the constraints alone, scores 0). The verifier (`Constraints`)
checks each constraint exactly and the topic; the reward is 1 only when all hold (parts:
one per constraint, `topic`, `content`: at least CONTENT_WORDS words, and `own_words`: no
sentence of the prompt repeated). The gold is built by a program that satisfies the
constraints (`compose`), so it is correct for the verifier by construction; the contract
and cheat tests hold it to that.

Definitions the verifier uses: words are maximal runs of letters, digits and apostrophes;
sentences are the non-empty pieces between `.`, `!` or `?`; a word is present when it occurs
as a whole word, case-insensitively; a bullet is a line starting with `- ` or `* `; JSON is
the whole reply (or one ```json fenced block that is the whole reply) parsing as an object.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.domains.base import Budget, Domain, stable_rng
from posttrain.domains.registry import register
from posttrain.errors import TaskError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta

TOPICS = (
    "ocean", "garden", "winter", "bicycle", "library", "coffee", "mountain", "river", "city", "music",
    "forest", "school", "friendship", "rain", "train", "kitchen", "desert", "island", "market", "robot",
    "bridge", "castle", "farm", "holiday", "painting", "planet", "village", "volcano", "lake", "museum",
)  # fmt: skip
EVAL_TOPICS = ("harbor", "orchard", "lighthouse", "meadow", "festival", "canyon")
"""The held-out split's topics, never drawn for training: a held-out task shares its constraint
text with training tasks (the kinds are few), so the topic is what is new to the model."""
KEYWORDS = ("bright", "quiet", "simple", "gentle", "morning", "journey", "color", "story", "small", "warm")
FORBIDDEN = ("very", "really", "thing", "good", "nice", "big", "always", "never")
FILLER = ("people", "enjoy", "the", "calm", "place", "every", "day", "with", "friends", "and", "family")
END_PHRASE = "Is there anything else I can help with?"
KINDS = ("min_words", "max_words", "sentences", "include", "forbid", "lower", "upper", "json", "bullets", "ending")
CONFLICTS = {
    frozenset(p)
    for p in (
        ("lower", "upper"),
        ("min_words", "max_words"),
        ("json", "bullets"),
        ("json", "ending"),
        ("json", "sentences"),
        ("json", "min_words"),
        ("json", "max_words"),
        ("bullets", "sentences"),
        ("ending", "sentences"),
        ("ending", "lower"),
        ("ending", "upper"),
        ("ending", "max_words"),
    )
}
CONTENT_WORDS = 8
"""Every reply must hold at least this many words (the prompt says so): the content the task asks for."""
_WORD = re.compile(r"[A-Za-z0-9']+")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*)\n\s*```", re.DOTALL)


@dataclass(frozen=True)
class IFReference:
    """The task's topic word and its constraints, each `(kind, parameter)` (an int or a
    word; empty for the ones without a parameter)."""

    topic: str
    constraints: tuple[tuple[str, str | int], ...]


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def sentences(text: str) -> int:
    return sum(1 for piece in re.split(r"[.!?]+", text) if words(piece))


def has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9']){re.escape(word)}(?![A-Za-z0-9'])", text, re.IGNORECASE) is not None


def bullets(text: str) -> int:
    return sum(1 for ln in text.splitlines() if re.match(r"\s*[-*] \S", ln))


def json_object(text: str) -> dict | None:
    body = text.strip()
    m = _FENCE.fullmatch(body)
    try:
        obj = json.loads(m.group(1) if m else body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _norm(text: str) -> str:
    return " ".join(words(text)).lower()


def echoes(prompt: str, text: str) -> bool:
    """Whether `text` repeats a sentence of the prompt (its words, case and punctuation aside):
    the prompt's own instructions meet some constraints (a required word, a word count)."""
    reply = f" {_norm(text)} "
    pieces = [_norm(p) for p in re.split(r"(?<=[.!?])\s+|\(|\)", prompt)]
    return any(len(p.split()) >= 3 and f" {p} " in reply for p in pieces)


def check(kind: str, param: str | int, text: str) -> bool:
    """Whether `text` meets one constraint, exactly as its instruction states it."""
    if kind == "min_words":
        return len(words(text)) >= int(param)
    if kind == "max_words":
        return len(words(text)) <= int(param)
    if kind == "sentences":
        return sentences(text) == int(param)
    if kind == "include":
        return has_word(text, str(param))
    if kind == "forbid":
        return not has_word(text, str(param))
    if kind == "lower":
        return any(c.isalpha() for c in text) and text == text.lower()
    if kind == "upper":
        return any(c.isalpha() for c in text) and text == text.upper()
    if kind == "json":
        return json_object(text) is not None
    if kind == "bullets":
        return bullets(text) == int(param) and all(
            re.match(r"\s*[-*] \S", ln) for ln in text.strip().splitlines() if ln.strip()
        )
    if kind == "ending":
        return text.rstrip().endswith(str(param))
    raise TaskError(f"ifeval: unknown constraint {kind!r}")


def instruction(kind: str, param: str | int) -> str:
    return {
        "min_words": f"Use at least {param} words.",
        "max_words": f"Use at most {param} words.",
        "sentences": f"Write exactly {param} sentences.",
        "include": f"Include the word '{param}'.",
        "forbid": f"Do not use the word '{param}'.",
        "lower": "Write everything in lowercase letters; no capital letters at all.",
        "upper": "Write everything in capital letters.",
        "json": "Format your whole reply as one JSON object.",
        "bullets": f"Answer with exactly {param} bullet points, each line starting with '- '.",
        "ending": f"End your reply with the exact phrase: {param}",
    }[kind]


def _param(kind: str, rng: random.Random, topic: str, taken: set[str]) -> str | int:
    if kind == "min_words":
        return rng.choice((15, 20, 30))
    if kind == "max_words":
        return rng.choice((12, 15, 20))
    if kind == "sentences":
        return rng.choice((1, 2, 3))
    if kind == "bullets":
        return rng.choice((2, 3, 4))
    if kind == "include":
        return rng.choice([w for w in KEYWORDS if w not in taken])
    if kind == "forbid":
        return rng.choice([w for w in FORBIDDEN if w not in taken])
    if kind == "ending":
        return END_PHRASE
    return ""


def compose(ref: IFReference, topic: str | None = None) -> str:
    """A reply that meets every constraint of `ref` (about `topic`, default the task's): a gold
    built by program. n sentences (or bullets) of `per` words, the topic in the first, the required word
    in the second (or the first, when there is one), then the format the constraints ask."""
    topic = ref.topic if topic is None else topic
    cons = dict(ref.constraints)
    include = str(cons["include"]) if "include" in cons else None
    n = (
        int(cons["sentences"])
        if "sentences" in cons
        else int(cons["bullets"])
        if "bullets" in cons
        else 3
        if "min_words" in cons
        else 2
    )
    if "max_words" in cons and "sentences" not in cons and "bullets" not in cons:
        n = min(n, 2)
    per = max(3, -(-CONTENT_WORDS // n))  # n * per stays within every max_words (n <= 4: at most 12)
    if "min_words" in cons:
        per = max(per, -(-int(cons["min_words"]) // n) + 1)
    rows = []
    for i in range(n):
        head = [f"The {topic}"] if i == 0 else ["It"]
        body = [include] if include and (i == 1 or n == 1) else []
        fill = [FILLER[(i * 3 + j) % len(FILLER)] for j in range(per)]
        rows.append(" ".join(head + body + fill[: max(1, per - len(body) - (2 if i == 0 else 1))]) + ".")
    if "json" in cons:
        text = json.dumps({"topic": topic, "text": " ".join(rows)})
    elif "bullets" in cons:
        text = "\n".join(f"- {r}" for r in rows)
    else:
        text = " ".join(rows)
    if "ending" in cons:
        text = f"{text} {END_PHRASE}"
    if "lower" in cons:
        text = text.lower()
    if "upper" in cons:
        text = text.upper()
    return text


class Constraints:
    """1.0 when the topic word appears, the reply holds at least CONTENT_WORDS words, repeats no
    sentence of the prompt (`echoes`) and every constraint holds (`check`), else 0.0; parts:
    `topic`, `content`, `own_words` and one per constraint kind (1.0 met, 0.0 not)."""

    name = "ifeval_constraints"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        ref: IFReference = task.reference
        text = episode.completion
        parts = {
            "topic": float(has_word(text, ref.topic)),
            "content": float(len(words(text)) >= CONTENT_WORDS),
            "own_words": float(not echoes(task.prompt[-1].content, text)),
        }
        for kind, param in ref.constraints:
            parts[kind] = float(check(kind, param, text))
        failed = [k for k, v in parts.items() if v < 1.0]
        ok = not failed
        reason = (
            "" if ok else ("truncated; " if episode.finish_reason == "length" else "") + "unmet: " + ",".join(failed)
        )
        return Score(1.0 if ok else 0.0, parts, ok, reason)


class IFEval(Domain):
    name = "ifeval"
    category = "instruction"
    description = "a short text about a topic under one (level 1) or two (level 2) IFEval-style checkable constraints"
    levels = 2
    budget = Budget(turns=1, tokens=160, seconds=60.0)
    verifier = Constraints()

    def _draw(self, rng: random.Random, difficulty: int, split: Split) -> IFReference:
        topic = rng.choice(EVAL_TOPICS if split == "eval" else TOPICS)
        kinds: list[str] = []
        while len(kinds) < difficulty:
            k = rng.choice(KINDS)
            if k not in kinds and all(frozenset((k, o)) not in CONFLICTS for o in kinds):
                kinds.append(k)
        taken = {topic}
        cons: list[tuple[str, str | int]] = []
        for k in kinds:
            p = _param(k, rng, topic, taken)
            taken.add(str(p))
            cons.append((k, p))
        return IFReference(topic, tuple(cons))

    def _prompt(self, ref: IFReference) -> str:
        rules = " ".join(instruction(k, p) for k, p in ref.constraints)
        return (
            f"Write a short text of at least {CONTENT_WORDS} words about the {ref.topic} "
            f"(use the word '{ref.topic}'). {rules}"
        )

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        ref = self._draw(stable_rng(self.name, self.version, difficulty, split, index), difficulty, split)
        prompt = self._prompt(ref)
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", prompt),),
            reference=ref,
            meta=TaskMeta(split=split, difficulty=difficulty, source="posttrain", taskset_version=self.taskset_version),
        )

    def gold(self, task: Task) -> str:
        return compose(task.reference)

    def wrong(self, task: Task) -> str:
        """The gold's text about another topic: every constraint met, the content missed."""
        ref: IFReference = task.reference
        return compose(ref, next(t for t in TOPICS if t != ref.topic))

    def cheats(self, task: Task) -> Sequence[str]:
        """Replies that meet constraints without the asked content, or content without the
        constraints: empty, the prompt echoed, the constraints alone (the required word, the
        ending phrase, `{}`, empty bullets), the gold about another topic, the topic alone."""
        ref: IFReference = task.reference
        cons = dict(ref.constraints)
        prompt = task.prompt[-1].content
        out = [
            "",
            prompt,
            prompt.lower(),
            prompt.upper(),
            f"{prompt} {self.gold(task)}",
            "{}",
            "- a\n- b",
            END_PHRASE,
            self.wrong(task),
        ]
        if "include" in cons:
            out.append(str(cons["include"]))
        if "json" in cons:
            out.append(json.dumps({"text": ""}))
        out += [ref.topic, f"The {ref.topic}."]
        return out


register(IFEval())
