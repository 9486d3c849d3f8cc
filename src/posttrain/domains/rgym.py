"""rg_*: every usable reasoning-gym generator as its own posttrain domain.

Invariant: a task is a pure function of (generator, level, split, index):
each level's dataset is built from the curriculum's configuration at that
level with a seed derived from the generator's name, and an item is picked
by a stable hash, so two processes (with any PYTHONHASHSEED) produce the same
tasks. Scoring is exact: the shipped scorer must give 1.0, otherwise the
reward is 0 (no credit for an answer that merely contains the gold string);
a generator listed in PARTIAL_CREDIT passes the shipped value through.
Generators that depend on hash order, run bundled code, ship a gameable or
missing scorer, or are too slow are in EXCLUDED with the reason.

The registry is built from `rgym_catalog.json` (names, categories, levels,
cost classes measured with `build_catalog`), so registering these domains
does not import reasoning-gym; the first `sample` or `score` does.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from posttrain.domains import _safeexpr
from posttrain.domains._common import ANSWER_INSTRUCTION
from posttrain.domains.base import Budget, Domain, extract_answer, split_of, stable_hash
from posttrain.domains.registry import register
from posttrain.errors import TaskError, VerifierError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta

CATALOG_PATH = Path(__file__).with_name("rgym_catalog.json")
PREFIX = "rg_"
MAX_SPLIT_ATTEMPTS = 400
ENTRY_CACHE = 4096
SLOW_ITEM_S = 0.05  # an item slower than this makes the domain cost class "long"
MAX_ITEM_S = 0.5  # levels whose items take longer are not offered
ITEM_TIMEOUT_S = 20.0  # a generator stuck on one item (arc_1d level 4 loops forever on some seeds) is skipped;
# generous, because a timeout changes which item is drawn: on a loaded machine a slow (not stuck)
# item must not time out, or two processes would draw different tasks

EXCLUDED: dict[str, str] = {
    "composite": "meta-generator that mixes other generators (each is its own domain)",
    "codeio": "executes bundled code in process; items change across processes even with PYTHONHASHSEED fixed",
    "isomorphic_strings": "items depend on set iteration order (change with PYTHONHASHSEED)",
    "polynomial_multiplication": "items depend on set iteration order (change with PYTHONHASHSEED)",
    "ransom_note": "items depend on set iteration order (change with PYTHONHASHSEED)",
    "list_functions": "items change with PYTHONHASHSEED (found by the cross-process contract test)",
    "word_ladder": "items change with PYTHONHASHSEED (found by the cross-process contract test)",
    "sokoban": "items change with PYTHONHASHSEED; also seconds per item",
    "zebra_puzzles": "items change with PYTHONHASHSEED at high levels; seconds per item above level 3",
    "game_of_life_halting": "shipped scorer gives 1.0 to any non-empty answer (gameable)",
    "propositional_logic": "no gold answer; the scorer accepts any entailed statement, so copying a premise scores 1.0 "
    "(gameable)",
    "rush_hour": "no gold answer shipped (the scorer needs a solution we would have to search for)",
    "knight_swap": "every curriculum level fails validation (min_nodes), and about 320 ms per item",
    "coin_flip": "shipped scorer gives 1.0 to the answer '0' on every item (gameable)",
    "boxnet": "no gold answer shipped (answer is None; the scorer needs a plan)",
    "rubiks_cube": "no gold answer shipped (the shipped answer scores 0.01)",
}

# Levels measured usable but too slow in practice (seconds per eval task) or broken.
EVALUATING: dict[str, _safeexpr.Gate] = {
    "string_insertion": _safeexpr.literal_gate,  # eval(answer), for a list of characters
    "spiral_matrix": _safeexpr.literal_gate,  # eval(answer), for a list
    "binary_matrix": _safeexpr.literal_gate,  # eval(answer), for a list of lists
    "n_queens": _safeexpr.literal_gate,  # eval(answer), for a board
    "countdown": _safeexpr.arithmetic_gate,  # sympy.parse_expr(answer)
    "puzzle24": _safeexpr.arithmetic_gate,  # sympy.parse_expr(answer)
    "simple_integration": _safeexpr.sympy_gate,  # sympy.parse_expr(answer), then diff and simplify
    "intermediate_integration": _safeexpr.sympy_gate,
}
"""Generators whose shipped scorer evaluates the model's answer as code in this
process, and the gate an answer must pass before that scorer sees it."""
MAX_ANSWER_CHARS = 4000
"""Longest answer any shipped scorer is given (twice the gold's length where that is more)."""

LEVEL_CAPS: dict[str, tuple[int, str]] = {
    "bf": (2, "level 3 programs take about 2 s per item"),
    "n_queens": (4, "level 5 board generation times out"),
    "jugs": (1, "level 2 yields unsolvable items whose shipped answer scores 0"),
    "arc_1d": (3, "level 4 loops forever on some seeds (task_recolor_blocks_from_palette; 3 in 40 eval draws)"),
}

# Generators whose shipped scorer gives graded credit we keep (none by default).
PARTIAL_CREDIT: frozenset[str] = frozenset()


def _load_catalog() -> dict[str, dict[str, Any]]:
    return json.loads(CATALOG_PATH.read_text())


class RGymVerifier:
    """The generator's own scorer, made exact (1.0 or 0) unless partial credit is declared."""

    name = "reasoning_gym"
    version = "1"

    def __init__(self, domain: RGymDomain) -> None:
        self.domain = domain

    def score(self, task: Task, episode: Episode) -> Score:
        answer = extract_answer(episode.completion)
        refused = self.domain.refusal(task, answer)
        if refused:
            return Score(0.0, {"outcome": 0.0, "shipped": 0.0}, False, refused)
        raw = self.domain.shipped_score(task, answer)
        value = raw if self.domain.partial_credit else (1.0 if raw >= 1.0 - 1e-9 else 0.0)
        passed = raw >= 1.0 - 1e-9
        reason = "" if passed else ("truncated" if episode.finish_reason == "length" else "wrong answer")
        return Score(min(max(value, 0.0), 1.0), {"outcome": value, "shipped": raw}, passed, reason)


class RGymDomain(Domain):
    """One reasoning-gym generator; levels are its curriculum's global levels."""

    version = "1"
    budget = Budget(tokens=256)

    def __init__(self, generator: str, info: dict[str, Any]) -> None:
        self.generator = generator
        self.name = PREFIX + generator
        self.category = f"rg_{info['category']}"
        self.levels = min(int(info["levels"]), LEVEL_CAPS.get(generator, (10**6, ""))[0])
        self.cost_class = info["cost_class"]
        self.description = f"reasoning-gym {generator} ({info['category']})"
        self.size = int(info["size"])
        self.curriculum = bool(info["curriculum"])
        self.partial_credit = generator in PARTIAL_CREDIT
        self.verifier = RGymVerifier(self)
        self._datasets: dict[int, Any] = {}
        self._entries: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
        self._lock = threading.RLock()
        self.timeouts = 0

    # ---- generation ----------------------------------------------------
    def dataset(self, difficulty: int) -> Any:
        with self._lock:
            if difficulty not in self._datasets:
                self._datasets[difficulty] = build_dataset(self.generator, difficulty, self.size, self.curriculum)
            return self._datasets[difficulty]

    def entry(self, difficulty: int, idx: int) -> dict[str, Any]:
        key = (difficulty, idx)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            item = self.dataset(difficulty)[idx]
            self._entries[key] = item
            if len(self._entries) > ENTRY_CACHE:
                self._entries.popitem(last=False)
            return item

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.dataset(difficulty)  # built outside the item time limit: an interrupted build would leave it half-made
        for attempt in range(MAX_SPLIT_ATTEMPTS):
            idx = stable_hash(self.name, self.version, difficulty, split, index, attempt) % self.size
            try:
                with _time_limit(ITEM_TIMEOUT_S):
                    item = self.entry(difficulty, idx)
            except _ItemTimeout:
                self.timeouts += 1
                continue
            if split_of(self.name, item["question"]) == split and self._gold_passes(difficulty, item):
                return self._task(index, split, difficulty, idx, item)
        raise TaskError(f"{self.name}: no {split} task found at difficulty {difficulty}")

    def _task(self, index: int, split: Split, difficulty: int, idx: int, item: dict[str, Any]) -> Task:
        prompt = f"{item['question']}\n\n{ANSWER_INSTRUCTION}"
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", prompt),),
            reference={"answer": gold_answer(self.generator, item), "item": idx, "level": difficulty},
            meta=TaskMeta(
                split=split, difficulty=difficulty, source="reasoning-gym", taskset_version=self.taskset_version
            ),
        )

    def _gold_passes(self, difficulty: int, item: dict[str, Any]) -> bool:
        """Items whose own answer the shipped scorer rejects are never drawn."""
        try:
            return float(self.dataset(difficulty).score_answer(gold_answer(self.generator, item), item)) >= 1.0 - 1e-9
        except Exception:  # noqa: BLE001 - a broken item is skipped, not a crash
            return False

    # ---- scoring -------------------------------------------------------
    def _item_for(self, task: Task) -> dict[str, Any]:
        ref = task.reference
        item = self.entry(int(ref["level"]), int(ref["item"]))
        if gold_answer(self.generator, item) != ref["answer"]:
            raise VerifierError(f"{self.name}: item {ref['item']} regenerated differently (generator changed?)")
        return item

    def refusal(self, task: Task, answer: str) -> str:
        """Why `answer` is not given to the shipped scorer ("" when it is): over
        MAX_ANSWER_CHARS (or twice the gold's length, if longer), or refused by the
        generator's gate when its scorer evaluates answers as code (EVALUATING)."""
        limit = max(MAX_ANSWER_CHARS, 2 * len(str(task.reference["answer"])))
        if len(answer) > limit:
            return f"answer of {len(answer)} characters, over the limit of {limit}"
        gate = EVALUATING.get(self.generator)
        return gate(answer, limit) if gate is not None else ""

    def shipped_score(self, task: Task, answer: str) -> float:
        item = self._item_for(task)
        dataset = self.dataset(int(task.reference["level"]))  # a failure here is infra, not a wrong answer
        try:
            raw = float(dataset.score_answer(answer, item))
        except Exception:  # the shipped scorer rejecting malformed model output is a wrong answer
            return 0.0
        return raw if raw == raw else 0.0

    def gold(self, task: Task) -> str:
        return f"<answer>{task.reference['answer']}</answer>"

    def wrong(self, task: Task) -> str:
        gold = str(task.reference["answer"])
        for candidate in wrong_candidates(gold):
            if self.shipped_score(task, candidate) < 1.0:
                return f"<answer>{candidate}</answer>"
        return "<answer></answer>"

    def cheats(self, task: Task) -> list[str]:
        """Outputs the exact scorer must reject (the monitor probes them)."""
        gold = str(task.reference["answer"])
        junk = ["", "0", "yes", "None", "{}", "unknown"]
        out = [f"<answer>{j}</answer>" for j in junk if _same(j, gold) is False]
        out += [task.prompt[-1].content, f"{self.wrong(task)} {gold}"]
        return out


class _ItemTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Interrupt the block after `seconds` (SIGALRM; only on the main thread and
    only when no other interval timer is running, else no limit)."""
    usable = threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL) == (
        0.0,
        0.0,
    )
    if not usable:
        yield
        return

    def on_alarm(*_: Any) -> None:
        raise _ItemTimeout()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def gold_answer(generator: str, item: dict[str, Any]) -> str:
    """The reference answer string (graph_color ships its solution in metadata)."""
    if item.get("answer") is None and generator == "graph_color":
        return json.dumps({str(k): v for k, v in _literal_dict(item["metadata"]["possible_answer"]).items()})
    return str(item["answer"]).strip()


def _literal_dict(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    import ast

    return ast.literal_eval(value)  # our generator's own metadata, never model output


def _same(a: str, b: str) -> bool:
    """Whether two answers are the same up to case, spacing and numeric form."""
    x, y = " ".join(a.split()).casefold(), " ".join(b.split()).casefold()
    try:
        return float(x) == float(y)
    except ValueError:
        return x == y


def wrong_candidates(gold: str) -> list[str]:
    """Plausible near-misses of `gold`, most plausible first."""
    out = []
    digits = list(re.finditer(r"\d", gold))
    if digits:
        m = digits[-1]
        out.append(gold[: m.start()] + str((int(m.group()) + 1) % 10) + gold[m.end() :])
    if len(gold) > 1 and gold[::-1] != gold:
        out.append(gold[::-1])
    out += [gold + " 1", gold[:-1], "0", "x", ""]
    return out


def build_dataset(generator: str, difficulty: int, size: int, curriculum: bool) -> Any:
    """The reasoning-gym dataset of `generator` at `difficulty` (1-based level)."""
    CURRICULA, DATASETS = _factory()

    dataset_cls, config_cls = DATASETS[generator]
    if generator == "bf":
        _quiet_bf_optimizer()
    seed = stable_hash("rgym-seed", generator, difficulty) % 2**31
    if curriculum:
        cur = CURRICULA[generator]()
        cur.set_global_level(difficulty - 1)
        config = cur.generate_configuration({"seed": seed, "size": size})
    else:
        config = config_cls(seed=seed, size=size)
    return dataset_cls(config)


def _factory() -> tuple[Any, Any]:
    """reasoning-gym's CURRICULA and DATASETS. Its first import compiles its dependency cellpylib,
    whose `memoize is "recursive"` lines each print a SyntaxWarning (two lines of stderr each,
    on every run where the bytecode cannot be cached): ignored during this import only."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SyntaxWarning, message='"is" with a literal')
        from reasoning_gym.factory import CURRICULA, DATASETS
    return CURRICULA, DATASETS


def _quiet_bf_optimizer() -> None:
    """reasoning-gym's bf generator compiles each program with an optimizer that prints "." to
    stdout on every pass (the stray dots before `posttrain domains`' header, and in any run's
    output). Its module-level `print` is shadowed by a no-op: that module only, thread-safe,
    no stdout swap."""
    from reasoning_gym.code.contrib.bfit.Compiler import Optimizer

    Optimizer.print = _no_print  # type: ignore[attr-defined]


def _no_print(*_: Any, **__: Any) -> None:
    return None


def build_catalog(level_timeout_s: int = 8) -> dict[str, dict[str, Any]]:
    """Measure every non-excluded generator: usable levels (consecutive from 1,
    each builds within `level_timeout_s` and yields items faster than
    MAX_ITEM_S), size, category and cost class. Takes minutes; run by hand
    (`python -m posttrain.domains.rgym`) to refresh rgym_catalog.json."""
    CURRICULA, DATASETS = _factory()

    catalog = {}
    for gen in sorted(set(DATASETS) - set(EXCLUDED)):
        info = _measure(gen, gen in CURRICULA, level_timeout_s)
        if info:
            catalog[gen] = info
    return catalog


def _measure(gen: str, curriculum: bool, level_timeout_s: int) -> dict[str, Any] | None:
    import signal
    import time

    CURRICULA, DATASETS = _factory()

    def on_alarm(*_: Any) -> None:
        raise TimeoutError(gen)

    top = max((len(a.levels) for a in CURRICULA[gen]().attributes.values()), default=1) if curriculum else 1
    sizes = (10**9, 20_000) if curriculum else (500,)
    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        for size in sizes:
            usable, worst = 0, 0.0
            for level in range(1, top + 1):
                try:
                    signal.alarm(level_timeout_s)
                    ds = build_dataset(gen, level, size, curriculum)
                    start = time.perf_counter()
                    for idx in (1, size // 3, size - 1):
                        ds[idx]
                    per_item = (time.perf_counter() - start) / 3
                except Exception as exc:  # noqa: BLE001 - a level that fails is not offered
                    if "size" in str(exc).lower() and level == 1:
                        usable = -1
                    break
                finally:
                    signal.alarm(0)
                if per_item > MAX_ITEM_S:
                    break
                usable, worst = level, max(worst, per_item)
            if usable >= 0:
                break
    finally:
        signal.signal(signal.SIGALRM, old)
    if usable <= 0:
        return None
    module = DATASETS[gen][0].__module__.split(".")
    return {
        "category": module[1] if len(module) > 2 else "other",
        "levels": usable,
        "size": size,
        "curriculum": curriculum,
        "cost_class": "long" if worst > SLOW_ITEM_S else "short",
    }


if __name__ == "__main__":
    CATALOG_PATH.write_text(json.dumps(build_catalog(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {CATALOG_PATH}")


def _register_all() -> None:
    if not CATALOG_PATH.exists():
        return
    for gen, info in sorted(_load_catalog().items()):
        if gen not in EXCLUDED:
            register(RGymDomain(gen, info))


if __name__ != "__main__":
    _register_all()
