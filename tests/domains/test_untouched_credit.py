"""Partial credit never pays for the untouched state (issue 35 item 10), as a property.

For every registered multi-turn domain and every domain that declares partial credit, a
junk or no-op action (the empty action, a junk command, `done` alone, shell commands that
change nothing, an empty object, and for doc_fix the printed invoice copied back) scores 0,
the value of doing nothing; the gold keeps its score. Before: term_fix paid 0.75 for any of
them (three of its four end-state checks hold on the untouched files), terminal 1/6 on
many tasks, doc_fix 0.33 for the printed fields of a stale invoice.
"""

from __future__ import annotations

import os

import pytest

from posttrain.domains.docfix import render
from posttrain.domains.registry import all_domains
from posttrain.types import Episode

DOMAINS = all_domains()
NAMES = sorted(n for n, d in DOMAINS.items() if d.environment() is not None or getattr(d, "partial_credit", False))
SANDBOXED = ("terminal", "term_fix", "code_fix", "code_revise")
JUNK = (
    "",
    "xyzzy plugh",
    "done",
    "{}",
    "<answer></answer>",
    "```bash\ntrue\n```",
    "```bash\nls -la; cat *\n```\ndone",
)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")


def noops(name: str, task) -> list[str]:
    """The junk actions, and the domain's own ways of doing nothing."""
    own = []
    if name == "term_fix":
        own = ["./chk", "cat app.cfg;./chk\ndone"]  # the visible checker run, nothing written
    if name == "doc_fix":
        own = [render(task.reference["printed"])]  # the invoice as printed, copied back
    return [*JUNK, *own]


def _check(name: str, seeds: range) -> None:
    d = DOMAINS[name]
    for index in seeds:
        task = d.sample(index, "train", 1)
        paid = [(a[:40], s.value) for a in noops(name, task) if (s := d.score(task, Episode(a))).value != 0.0]
        assert not paid, (name, index, paid)
        if not name.startswith("geo_"):  # the geo golds' scripts need the geo sandbox set-up (test_domains_geo)
            assert d.score(task, Episode(d.gold(task))).value == d.gold_value(task)


@pytest.mark.parametrize("name", [n for n in NAMES if n not in SANDBOXED])
def test_doing_nothing_scores_zero_and_the_gold_keeps_its_score(name):
    _check(name, range(3) if name == "doc_fix" else range(1))


@root_only
@pytest.mark.parametrize("name", [n for n in NAMES if n in SANDBOXED])
def test_doing_nothing_in_the_sandbox_scores_zero_and_the_gold_keeps_its_score(name):
    _check(name, range(1))


@root_only
def test_term_fix_pays_only_for_what_the_commands_changed():
    """The checks the untouched files meet (app.cfg and chk intact, chk executable) earn nothing;
    breaking one takes credit away; the right value is the whole credit."""
    d = DOMAINS["term_fix"]
    task = d.sample(0, "train", 1)
    ref = task.reference
    wrong = d.score(task, Episode(f"echo {int(ref.value) + 1} >out")).value
    broke = d.score(task, Episode(f"echo {ref.value} >out;rm chk")).value
    right = d.score(task, Episode(f"echo {ref.value} >out")).value
    assert (wrong, broke, right) == (0.0, 0.0, 1.0)
