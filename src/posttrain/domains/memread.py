"""memread: a long document read in chunks over turns, keeping a bounded memory (MemAgent's shape).

The document is a keychain task's (`keychain.py`: key chains, questions, depot records
among filler) at the domain's context, cut at line ends into chunks of at most `CHUNK`
characters. The prompt gives the question (the start key) and chunk 1; each turn the
model replies with its memory, at most `MEMORY` characters, which replaces the previous
one; the environment answers with the next chunk, and after the last one asks for the
answer. So an episode is one memory per chunk, then `Answer: X`.

The verifier reads only the actions (never an observation): outcome is 1 exactly when
there are a memory per chunk and then an answer, every memory is within `MEMORY`
characters, the answer is right (`_longctx.final_answer`), and the last memory already
holds the answer and no other record's count (the answer was worked out while reading,
and a memory listing every count does not count). Parts: outcome, process (share of
memories within the bound), efficiency (1 when the episode took exactly chunks + 1 turns).

Limit, stated: the episode driver keeps every turn in the context, so the earlier chunks
stay readable; the bound is on what the model writes, not on what it sees (MemAgent's
overwrite-only context needs a driver that drops old turns; issue 39 item 3). With the
embedded model (one token per character) an episode holds the whole document plus a
memory per chunk: `memread` (1,000 characters, 2 chunks) and `memread@4000` (8 chunks)
fit its 8,192 positions; `memread@8000` does not.

Difficulty (level): keychain's levels. Context length: `memread@N` (characters).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from posttrain.domains._longctx import NUMBER, Canon, Core, LongContextDomain, final_answer, integer, weave
from posttrain.domains.base import Budget, actions_of
from posttrain.domains.keychain import KeyChain, follow, parse, start_key
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, StepResult, Task

CHUNK = 500
"""Most characters of one chunk (cut at a line end)."""
MEMORY = 160
"""Most characters of one memory."""


def chunks(text: str, size: int = CHUNK) -> list[str]:
    """`text` cut at line ends into pieces of at most `size` characters (a longer line alone)."""
    out: list[str] = []
    for line in text.split("\n"):
        if out and len(out[-1]) + 1 + len(line) <= size:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def prompt_of(question: str, first: str, n: int) -> str:
    return (
        f"Read a document in {n} chunks. After each chunk reply with your memory: one line of at most "
        f"{MEMORY} characters keeping what you need; it replaces your previous memory. After the last "
        f"chunk, give the final answer alone on the last line as 'Answer: X'.\n"
        f"Question: {question}\nChunk 1/{n}:\n{first}"
    )


class MemReadEnv:
    """Feeds the task's chunks, one per memory; after the last, asks for the answer; the
    answer ends the episode. A memory over the bound is observed (and scored by the verifier)."""

    def reset(self, task: Task) -> str:
        self.rest: list[str] = list(task.reference["chunks"][1:])
        self.n = len(task.reference["chunks"])
        self.read = 1
        return ""

    def step(self, action: str) -> StepResult:
        if self.read > self.n:
            return StepResult("", done=True)
        note = f"(memory over {MEMORY} characters)\n" if len(action.strip()) > MEMORY else ""
        self.read += 1
        if self.rest:
            return StepResult(f"{note}Chunk {self.read}/{self.n}:\n{self.rest.pop(0)}")
        return StepResult(
            f"{note}That was the last chunk. Give the final answer alone on the last line as 'Answer: X'."
        )

    def close(self) -> None:
        pass


class MemReadVerifier:
    name = "memread"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        ref = task.reference
        n, answer, others = len(ref["chunks"]), ref["answer"], set(ref["counts"]) - {ref["answer"]}
        actions = actions_of(episode)
        memories, rest = actions[:n], actions[n:]
        within = [len(m.strip()) <= MEMORY for m in memories]
        process = sum(within) / n
        efficiency = 1.0 if len(actions) == n + 1 else 0.0
        got = final_answer(rest[0], integer)[0] if rest else None
        held = set(NUMBER.findall(memories[-1])) if len(memories) == n else set()
        why = ""
        if not rest:
            why = "no answer after the last chunk"
        elif not all(within):
            why = f"a memory over {MEMORY} characters"
        elif got != int(answer):
            why = "wrong answer"
        elif answer not in held or held & others:
            why = "the last memory does not hold the answer alone"
        ok = not why
        parts = {"outcome": float(ok), "process": process, "efficiency": efficiency if ok else 0.0}
        return Score(1.0 if ok else 0.0, parts, ok, why)


class MemRead(LongContextDomain):
    base_name = "memread"
    description = "read a long document in chunks over turns, keep a bounded memory, answer from it; @N: context"
    head = KeyChain.head
    levels = KeyChain.levels
    verifier = MemReadVerifier()
    _chain = KeyChain()

    def __init__(self, context: int | None = None) -> None:
        super().__init__(context)
        # a memory per chunk (chunks cut at line ends run short: at most twice as many), the answer
        self.budget = Budget(turns=2 * self.context // CHUNK + 3, tokens=MEMORY + 16, seconds=600.0)  # type: ignore[misc]

    @property
    def canon(self) -> Canon:
        return integer

    def build(self, rng: random.Random, difficulty: int) -> Core:
        return self._chain.build(rng, difficulty)

    def compose(self, rng: random.Random, core: Core) -> tuple[str, Any]:
        question = core.tail.split(". Give the final answer")[0] + "."
        document, _ = weave(rng, core.facts, self.context, self.head, "")
        parts = chunks(document.rstrip("\n"))
        counts = [n for _, n in sorted(parse(document)[2].items())]
        ref = {"answer": core.answer, "counts": counts, "chunks": parts}
        return prompt_of(question, parts[0], len(parts)), ref

    def environment(self) -> type[MemReadEnv]:
        return MemReadEnv

    def solve(self, question: str) -> str | None:
        """The chain followed in a text holding the question and the whole document."""
        return follow(question, start_key(question))[1]

    def audit(self, task: Task, completion: str) -> bool:
        """The answer worked out again from the whole document, and the episode scored against it."""
        answer = self.solve(task.prompt[-1].content + "\n" + self._document(task))
        return answer == task.reference["answer"] and self.verifier.score(task, Episode(completion)).passed

    def _document(self, task: Task) -> str:
        return "\n".join(task.reference["chunks"])

    def position_answers(self, question: str) -> dict[str, str]:
        return self._chain.position_answers(question)

    def gold_turns(self, task: Task) -> list[str]:
        """A memory per chunk keeping the start key's chain, its question and the asked
        record as they are met (the answer once all are in), then the answer."""
        doc = self._document(task)
        chain, _ = follow(doc, start_key(task.prompt[-1].content))
        _, asks, records = parse(doc)
        item, city = asks[chain[-1]]
        wanted = {f"Key {a} points to key {b}." for a, b in zip(chain, chain[1:], strict=False)}
        notes: list[str] = []
        out = []
        for piece in task.reference["chunks"]:
            for line in piece.split("\n"):
                if line in wanted:
                    notes.append(line[4:13] + ">" + line[-10:-1])
                elif line.startswith(f"Key {chain[-1]} asks"):
                    notes.append(f"{chain[-1]} asks {city} {item}")
                elif line == f"The {city} depot holds {records[(city, item)]} {item}.":
                    notes.append(f"{city} {item} {records[(city, item)]}")
            done = len(notes) == len(chain) + 1
            out.append(f"answer {task.reference['answer']}" if done else "; ".join(notes) or "nothing yet")
        return [*out, f"Answer: {task.reference['answer']}"]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        turns = self.gold_turns(task)
        return "\n".join([*turns[:-1], f"Answer: {int(task.reference['answer']) + 1}"])

    def cheats(self, task: Task) -> Sequence[str]:
        """No memories; memories that list every count; a memory over the bound; the answer
        without it in the last memory; position answers; the format cheats on the last turn."""
        ref = task.reference
        n, answer = len(ref["chunks"]), ref["answer"]
        blank = ["nothing"] * n
        every = " ".join(ref["counts"])
        doc = self._document(task)
        wrong_by_position = [a for a in self.position_answers(doc).values() if a and a != answer]
        return [
            f"Answer: {answer}",
            "\n".join([*blank, f"Answer: {answer}"]),
            "\n".join([*blank[:-1], f"counts {every}", f"Answer: {answer}"]),
            "\n".join([*blank[:-1], f"answer {answer} " + "x" * MEMORY, f"Answer: {answer}"]),
            "\n".join([*blank[:-1], f"answer {answer}", f"Answer: {answer} or {int(answer) + 1}"]),
            "\n".join([*blank[:-1], f"answer {answer}", f"The answer is {answer}."]),
            *("\n".join([*blank[:-1], f"answer {a}", f"Answer: {a}"]) for a in dict.fromkeys(wrong_by_position)),
            "",
        ]


register(MemRead())
