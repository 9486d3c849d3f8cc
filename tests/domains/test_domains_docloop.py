"""Multi-turn document extraction: extract, read the validator's complaint,
re-extract. The validator checks form and internal consistency only (it never
reads the hidden gold fields and never reveals a value); the reward is the final
object's F1 against the gold."""

from __future__ import annotations

import json
import re

import pytest

from posttrain.domains.docfin import DocEnv, validate_fields
from posttrain.domains.registry import all_domains, get
from posttrain.types import Episode, Turn

LOOP_DOMAINS = sorted(
    n for n, d in all_domains().items() if n.startswith(("doc_", "fin_")) and d.environment() is DocEnv
)  # doc_fix, the family's feedback tier, has its own validator (tests/domains/test_domains_docfix.py)


def play(domain, task, actions):
    env = domain.environment()()
    assert env.reset(task) == ""
    turns = []
    for action in actions[: domain.budget.turns]:
        got = env.step(action)
        turns.append(Turn(action, got.observation, parts=got.parts))
        if got.done:
            break
    return Episode(turns[-1].action, tuple(turns)), got.done


def test_the_extraction_domains_are_the_multi_turn_ones():
    assert LOOP_DOMAINS == [
        "doc_invoice_fields_md",
        "doc_invoice_fields_text",
        "doc_payslip_fields_md",
        "doc_payslip_fields_text",
        "fin_balance_fields",
        "fin_income_fields",
    ]
    assert get("doc_invoice_total_md").environment() is None  # one-number questions stay single-turn
    assert all(get(n).budget.turns == 3 for n in LOOP_DOMAINS)


@pytest.mark.parametrize("name", LOOP_DOMAINS)
def test_gold_is_accepted_at_once_and_scores_one(name):
    d = get(name)
    for level in (1, 2, 3):
        for i in range(6):
            task = d.sample(i, "train", level)
            assert "validator" in task.prompt[0].content
            assert validate_fields(task.reference["fields"], task.reference["check"]) == []
            episode, done = play(d, task, d.gold_turns(task))
            assert done and episode.turns[0].observation == "accepted" and episode.turns[0].parts == {"process": 1.0}
            score = d.score(task, episode)
            assert score.value == 1.0 and score.passed and score.parts["efficiency"] == 1.0
            assert d.score(task, Episode(d.gold(task))).value == 1.0  # the single-turn gold too


def _invoice(level=3):
    d = get("doc_invoice_fields_md")
    task = d.sample(1, "train", level)
    return d, task, dict(task.reference["fields"])


def test_complaints_name_fields_and_rules_never_values():
    d, task, gold = _invoice()
    bad = dict(gold, total=round(gold["total"] + 7.5, 2), date="03/04/2024", subtotal="lots")
    del bad["vendor"]
    bad["note"] = "x"
    env = DocEnv()
    env.reset(task)
    got = env.step(f"<answer>{json.dumps(bad)}</answer>")
    assert not got.done and got.parts == {"process": 0.0}
    assert got.observation.startswith("rejected: ")
    for needle in (
        "missing field: vendor",
        "unknown field: note",
        "date: bad date format (want YYYY-MM-DD)",
        "subtotal: not a number",
        "total does not reconcile with the line items",
    ):
        assert needle in got.observation
    numbers = set(re.findall(r"\d+(?:\.\d+)?", got.observation))
    assert numbers <= {"5"}, numbers  # "five digits" aside, no figure at all
    assert env.step("not json").observation == "rejected: the answer is not one JSON object"


def test_re_extraction_after_the_complaint_scores_the_final_object():
    d, task, gold = _invoice(2)
    first = dict(gold, tax=round(gold["tax"] + 1, 2))
    episode, done = play(d, task, [f"<answer>{json.dumps(first)}</answer>", d.gold(task)])
    assert done and len(episode.turns) == 2 and "tax does not match" in episode.turns[0].observation
    score = d.score(task, episode)
    assert score.value == 1.0 and score.passed and score.parts["process"] == 1.0 and score.parts["efficiency"] == 0.5
    stuck, done = play(d, task, [f"<answer>{json.dumps(first)}</answer>"] * 5)
    assert not done and len(stuck.turns) == 3  # the turn budget ends it
    s = d.score(task, stuck)
    assert 0.0 < s.value < 1.0 and not s.passed and s.parts["process"] == 0.0 and s.parts["efficiency"] == 0.0


def test_consistent_but_wrong_values_pass_the_validator_and_fail_the_outcome():
    d = get("fin_balance_fields")
    task = d.sample(0, "train", 2)
    gold = task.reference["fields"]
    shifted = dict(gold, total_assets=gold["total_assets"] + 100, equity=round(gold["equity"] + 100, 2))
    episode, done = play(d, task, [f"<answer>{json.dumps(shifted)}</answer>"])
    assert done and episode.turns[0].observation == "accepted"  # internally consistent
    score = d.score(task, episode)
    assert score.value < 1.0 and not score.passed and score.parts["process"] == 1.0


def test_verifier_never_reads_observations():
    d, task, gold = _invoice(1)
    wrong = d.wrong(task)
    forged = Episode(wrong, (Turn(wrong, "accepted", parts={"process": 1.0}),))
    assert d.score(task, forged).value < 1.0 and not d.score(task, forged).passed


@pytest.mark.parametrize("name", LOOP_DOMAINS)
def test_cheats_fail_over_turns(name):
    d = get(name)
    task = d.sample(0, "train", 2)
    for cheat in d.cheats(task):
        episode, _ = play(d, task, [cheat] * 3)
        assert d.score(task, episode).value == 0.0
