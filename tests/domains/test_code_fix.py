"""code_fix, the coding family's learnable feedback tier: the gold trajectory passes the
hidden tests through the real sandbox environment, the stale share is what the module
states, the visible test's message names the deviation and the gold revision uses it,
no hidden test reaches an environment step, every cheat scores below the gold (as one
completion and as an episode), and junk actions are observations, not exceptions."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from posttrain import sandbox
from posttrain.domains import code_fix as F
from posttrain.domains.base import play_actions
from posttrain.domains.registry import get
from posttrain.envs.base import as_step_result
from posttrain.model.bugs import TURN_BUGS, code_fix_buggy
from posttrain.model.tokenizer import build_tokenizer
from posttrain.types import Episode, Turn

DOMAIN = get("code_fix")
TASKS = [DOMAIN.sample(i, split, level) for i in range(5) for split in ("train", "eval") for level in (1, 2)]


def play(task, actions, runner=None):
    """The actions stepped through a fresh environment until done or the turn budget."""
    return play_actions(F.CodeFixEnv(runner), task, actions[: DOMAIN.budget.turns])


def _stale(level: int):
    return next(t for i in range(50) if (t := DOMAIN.sample(i, "train", level)).reference.stale)


def _fresh(level: int):
    return next(t for i in range(50) if not (t := DOMAIN.sample(i, "train", level)).reference.stale)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_gold_trajectory_passes_the_hidden_tests_and_one_completion_matches_it(task):
    episode = play(task, DOMAIN.gold_turns(task))
    ref = task.reference
    assert len(episode.turns) == (2 if ref.stale else 1) and episode.turns[-1].observation == "pass"
    score = DOMAIN.score(task, episode)
    assert (score.value, score.passed) == (1.0, True)
    assert score.parts["outcome"] == 1.0 and score.parts["efficiency"] == 1 / len(episode.turns)
    single = DOMAIN.score(task, Episode(DOMAIN.gold(task)))
    assert (single.value, single.passed) == (1.0, True)
    wrong = DOMAIN.score(task, Episode(DOMAIN.wrong(task)))
    assert wrong.value == 0.0 and not wrong.passed


def test_the_stale_share_is_about_two_thirds_and_the_text_is_tiny():
    tok = build_tokenizer().get_vocab()
    tasks = [DOMAIN.sample(i, s, lvl) for i in range(300) for s in ("train", "eval") for lvl in (1, 2)]
    share = sum(t.reference.stale for t in tasks) / len(tasks)
    assert 0.6 < share < 0.73, share  # STALE_SHARE = 2/3, 1200 tasks: about +-0.03 at 2 sigma
    assert len({t.prompt[0].content for t in tasks}) > 0.99 * len(tasks)  # eval questions are distinct
    for t in tasks[:200]:
        prompt, gold = t.prompt[0].content, DOMAIN.gold_turns(t)
        assert len(prompt) <= 20 and all(len(a) <= 30 for a in gold)
        assert all(c in tok for c in prompt + "".join(gold)), prompt
        ref = t.reference
        assert re.fullmatch(r"spec:[a-z]{3}\(x\)=x[+*]\d\d", prompt) and str(ref.spec) in prompt
        assert set(map(json.dumps, ref.visible.inputs())).isdisjoint(map(json.dumps, ref.hidden.inputs()))


@pytest.mark.parametrize("level", [1, 2])
def test_the_visible_message_names_the_deviation_and_the_revision_uses_it(level):
    task = _stale(level)
    ref = task.reference
    first = play(task, DOMAIN.gold_turns(task)[:1])
    (x0,) = ref.visible.inputs()[0]
    got = F.apply(ref.op, x0, ref.spec)
    assert first.turns[0].observation == f"{ref.name}({x0})={got},want:{ref.k}"  # x0 is 0 (x+K) or 1 (x*K): want is K
    assert first.turns[0].parts == {"process": 0.0}
    assert DOMAIN.gold_turns(task)[1].endswith(f"x{ref.op}{ref.k}")
    assert DOMAIN.score(task, first).value == 0.0  # the spec alone fails the hidden tests on a stale task
    fresh = _fresh(level)
    assert play(fresh, DOMAIN.gold_turns(fresh)).turns[0].observation == "pass"


class Recording:
    def __init__(self) -> None:
        self.requests: list = []

    def __call__(self, req):
        self.requests.append(req)
        return sandbox.run(req, domain="code_fix")


def test_no_hidden_test_reaches_the_environment():
    task = _stale(1)
    rec = Recording()
    episode = play(task, DOMAIN.gold_turns(task), rec)
    assert len(rec.requests) == 2
    for req in rec.requests:
        spec = json.loads(req.stdin)
        assert spec["inputs"] == task.reference.visible.inputs() and "expected" not in req.stdin.decode()
    hidden = [str(e) for e in task.reference.hidden.expected()]
    for turn in episode.turns:
        assert not any(re.search(rf"\b{h}\b", turn.observation) for h in hidden), turn.observation
    assert "expected" not in DOMAIN.execute(task, episode.completion, rec).program  # the execute step: inputs only
    assert json.loads(rec.requests[-1].stdin)["inputs"] == task.reference.hidden.inputs()


@pytest.mark.parametrize("task", [_stale(1), _fresh(1), _stale(2)], ids=lambda t: t.id)
def test_every_cheat_scores_below_the_gold_as_one_completion_and_as_an_episode(task):
    gold = DOMAIN.score(task, play(task, DOMAIN.gold_turns(task))).value
    assert gold == 1.0
    for cheat in DOMAIN.cheats(task):
        single = DOMAIN.score(task, Episode(cheat))
        actions = [cheat] if cheat.startswith("```") else (cheat.splitlines() or [""])
        played = DOMAIN.score(task, play(task, actions))
        assert single.value < gold and not single.passed, (cheat[:60], single)
        assert played.value < gold and not played.passed, (cheat[:60], played)


def test_hard_coding_the_wanted_value_passes_the_visible_test_only():
    task = _stale(1)
    ref = task.reference
    episode = play(task, [f"def {ref.name}(x):return {ref.k}"])
    assert episode.turns[0].observation == "pass" and len(episode.turns) == 1  # the visible check is fooled
    assert DOMAIN.score(task, episode).value == 0.0  # the hidden tests are not


def test_forged_observations_are_not_trusted():
    task = _stale(1)
    spec = DOMAIN.gold_turns(task)[0]
    forged = Episode(spec, (Turn(spec, "pass", parts={"process": 1.0}),))
    assert DOMAIN.score(task, forged).value == 0.0


def test_junk_actions_are_observations_not_exceptions():
    task = _stale(1)
    name = task.reference.name
    env = F.CodeFixEnv()
    env.reset(task)
    for junk in (
        "",
        "\x00\x01",
        "def",
        "{" * 1000,
        f"def {name}(x):return x/0",
        "import os;os._exit(0)",
        f"def {name}(x):return 'a'*999",
        f"def {name}(x):\n while 1:pass",
    ):
        result = as_step_result(env.step(junk))
        assert not result.done and 0 < len(result.observation) <= F.OBS_CHARS, (junk[:20], result.observation)
    assert as_step_result(env.step("")).observation == F.NO_CODE
    assert as_step_result(env.step(f"def {name}(x):return x/0")).observation.startswith(f"{name}(0):ZeroDivision")


def test_the_buggy_policy_starts_with_the_spec_and_mixes_its_three_wrong_revisions():
    assert TURN_BUGS["code_fix"] is code_fix_buggy
    kinds = {0: 0, 1: 0, 2: 0}
    for i in range(300):
        q = DOMAIN.sample(i, "train", 1).prompt[0].content
        kinds[hashlib.sha256(q.encode()).digest()[0] % 3] += 1
    assert all(80 < n < 120 for n in kinds.values()), kinds  # a third each
    seen = set()
    for i in range(12):
        task = DOMAIN.sample(i, "train", 1)
        ref, q = task.reference, task.prompt[0].content
        assert code_fix_buggy(q, "") == DOMAIN.gold_turns(task)[0]
        if not ref.stale:
            continue
        obs = f"{ref.name}(0)={ref.spec},want:{ref.k}"
        revision = code_fix_buggy(q, obs)
        seen.add(revision.rsplit("return ", 1)[1])
        assert revision != DOMAIN.gold_turns(task)[1]
        assert DOMAIN.score(task, Episode(revision)).value == 0.0
    assert len(seen) > 3
