"""For every registered domain, its declared cheats (proxy-satisfying ones included:
`true` for numbers, numbers as text, a different solid meeting every scalar check) score
below its gold and never pass. The code and terminal families, whose cheats need
sandbox sessions, are held to the same property in tests/sandbox and
tests/domains/test_code_revise.py / test_terminal_loop.py."""

from __future__ import annotations

import json

import pytest

from posttrain.domains.registry import all_domains
from posttrain.types import Episode

DOMAINS = all_domains()
SANDBOX_HEAVY = ("code", "code_revise", "terminal")
NAMES = sorted(n for n in DOMAINS if n not in SANDBOX_HEAVY)


@pytest.mark.parametrize("name", NAMES)
def test_every_declared_cheat_scores_below_the_gold(name):
    d = DOMAINS[name]
    task = d.sample(0, "train", 1)
    gold = d.score(task, Episode(d.gold(task)))
    cheats = list(d.cheats(task))
    assert gold.value == d.gold_value(task) and gold.passed and cheats, (name, gold)
    for cheat in cheats:
        s = d.score(task, Episode(cheat))
        assert s.value < gold.value and not s.passed, (name, cheat[:80], s)


def _fields_names() -> list[str]:
    return [n for n in NAMES if n.startswith(("doc_", "fin_")) and "fields" in n]


@pytest.mark.parametrize("name", _fields_names())
def test_field_extraction_declares_the_wrong_json_type_proxies(name):
    d = DOMAINS[name]
    task = d.sample(0, "train", 1)
    objects = [json.loads(c[len("<answer>") : -len("</answer>")]) for c in d.cheats(task)[-2:]]
    assert all(v is True for v in objects[0].values()) and set(objects[0]) == set(task.reference["fields"])
    assert any(isinstance(v, bool) for v in objects[1].values())


def test_tool_worlds_and_sql_declare_typed_proxies():
    tools = [n for n in NAMES if n.startswith("tool_")]
    retyped = [n for n in tools if any('": true' in c for c in DOMAINS[n].cheats(DOMAINS[n].sample(0, "train", 1)))]
    assert len(retyped) >= 3, retyped  # the worlds whose gold calls carry numbers
    sql = [n for n in NAMES if n.startswith("sql_")]
    as_text = [n for n in sql if any("AS TEXT" in c for c in DOMAINS[n].cheats(DOMAINS[n].sample(0, "train", 1)))]
    assert len(as_text) >= 8, as_text  # the queries whose result holds a number
