"""keychain: a chain of keys hidden among distractor chains, records and prose (LoongRL's KeyChain shape).

The prompt mixes, in a seeded order among filler sentences: key lines (`Key 3f9a-1c2e
points to key 8b07-55d1.`), lines where a key asks a question (`Key 8b07-55d1 asks: how
many lamps are in the Oslo depot?`) and depot records (`The Oslo depot holds 482
lamps.`). The last line names a start key; the model follows its chain to the question
at its end and answers it from the records (an integer). Distractor chains end at
questions about other records, and other records share the asked city or item.

Difficulty (level): hops of the real chain, distractor chains (each 1 to that many hops)
and records no question asks about, `LEVELS`. Context length: `keychain@N` (characters,
`_longctx`). Declared cheats: the first, last and most frequent number of the prompt and
the answers of the first and the last question in it (a chain read by position), where
they are wrong; the first key and the start key copied; every record's number listed or
given on its own answer line; and the format cheats.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from posttrain.domains._longctx import INSTRUCTION, Core, LongAnswer, LongContextDomain, integer, position_numbers
from posttrain.domains.registry import register
from posttrain.errors import VerifierError
from posttrain.types import Task

LEVELS = {1: (1, 2, 1), 2: (2, 2, 1), 3: (3, 2, 1), 4: (3, 2, 2), 5: (4, 2, 1)}
"""level -> (hops of the real chain, distractor chains, records no question asks about)."""
CITIES = ("Oslo", "Lima", "Kyiv", "Bern", "Riga", "Quito", "Dakar", "Hanoi", "Perth", "Turin", "Cork", "Porto")
ITEMS = ("lamps", "crates", "barrels", "ropes", "bells", "sacks", "tiles", "jars")

_K = r"[0-9a-f]{4}-[0-9a-f]{4}"
_HOP = re.compile(rf"Key ({_K}) points to key ({_K})\.")
_ASKS = re.compile(rf"Key ({_K}) asks: how many (\w+) are in the (\w+) depot\?")
_RECORD = re.compile(r"The (\w+) depot holds (\d+) (\w+)\.")
_START = re.compile(rf"Start at key ({_K}),")
_KEY = re.compile(_K)


def _key(rng: random.Random) -> str:
    return f"{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}"


def parse(text: str) -> tuple[dict[str, str], dict[str, tuple[str, str]], dict[tuple[str, str], str]]:
    """The key links, the questions keys ask ((item, city), in text order) and the records
    ((city, item) -> count) of a prompt."""
    hops = dict(_HOP.findall(text))
    asks = {k: (item, city) for k, item, city in _ASKS.findall(text)}
    records = {(city, item): n for city, n, item in _RECORD.findall(text)}
    return hops, asks, records


def follow(text: str, start: str) -> tuple[list[str], str | None]:
    """The keys from `start` to the one asking a question, and that question's answer from
    the records (None when the chain or the record is missing, or the chain loops)."""
    hops, asks, records = parse(text)
    chain = [start]
    while chain[-1] in hops and len(chain) <= len(hops):
        chain.append(hops[chain[-1]])
    if chain[-1] not in asks:
        return chain, None
    item, city = asks[chain[-1]]
    return chain, records.get((city, item))


def start_key(text: str) -> str:
    m = _START.search(text)
    if m is None:
        raise VerifierError(f"keychain: no start key in the question {text[-200:]!r}")
    return m.group(1)


class KeyChain(LongContextDomain):
    base_name = "keychain"
    description = "follow a chain of keys past distractor chains to a question, answer it from records; @N: context"
    head = "Notes: a key points to a key or asks a question; records give counts."
    levels = len(LEVELS)
    verifier = LongAnswer(integer)

    def build(self, rng: random.Random, difficulty: int) -> Core:
        hops, n_distract, n_extra = LEVELS[difficulty]
        pairs = rng.sample([(c, i) for c in CITIES for i in ITEMS], 1 + n_distract + n_extra)
        counts = rng.sample(range(100, 1000), len(pairs))
        keys: set[str] = set()
        while len(keys) < (hops + 1) * (1 + n_distract):
            keys.add(_key(rng))
        pool = sorted(keys)
        rng.shuffle(pool)
        facts = [f"The {c} depot holds {n} {i}." for (c, i), n in zip(pairs, counts, strict=True)]
        start = ""
        for chain_no in range(1 + n_distract):
            chain = [pool.pop() for _ in range(1 + (hops if chain_no == 0 else rng.randint(1, hops)))]
            start = start or chain[0]
            facts += [f"Key {a} points to key {b}." for a, b in zip(chain, chain[1:], strict=False)]
            city, item = pairs[chain_no]
            facts.append(f"Key {chain[-1]} asks: how many {item} are in the {city} depot?")
        rng.shuffle(facts)
        tail = f"Start at key {start}, follow its chain to a question, answer it from the records. {INSTRUCTION}"
        return Core(facts, tail, str(counts[0]))

    def solve(self, question: str) -> str | None:
        """The start key's chain followed in the text to its question, answered from the records."""
        return follow(question, start_key(question))[1]

    def position_answers(self, question: str) -> dict[str, str]:
        """The first, last and most frequent number, and the answers of the first and the
        last question asked in the text."""
        _, asks, records = parse(question)
        asked = [records.get((city, item), "") for item, city in asks.values()]
        return {**position_numbers(question), "first_question": asked[0], "last_question": asked[-1]}

    def gold(self, task: Task) -> str:
        text = task.prompt[-1].content
        chain, _ = follow(text, start_key(text))
        return f"{' -> '.join(chain)}\nAnswer: {task.reference}"

    def wrong(self, task: Task) -> str:
        return f"Answer: {int(task.reference) + 1}"

    def cheats(self, task: Task) -> Sequence[str]:
        text = task.prompt[-1].content
        _, _, records = parse(text)
        first_key = _KEY.search(text)
        return [
            *self.format_cheats(task, str(int(task.reference) + 1)),
            *self.position_cheats(task),
            f"Answer: {first_key.group(0) if first_key else ''}",
            f"Answer: {start_key(text)}",
            f"Answer: {', '.join(records.values())}",
            "\n".join(f"Answer: {n}" for n in records.values()),
        ]


register(KeyChain())
