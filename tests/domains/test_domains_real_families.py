"""The task families for a real small instruct model (issue 37 item 3): arith_fmt's required last
line, ifeval's constraint checks and held-out topics, pyfunc's tests that tell the wrong body apart
and its split by function. Their gold, wrong and cheats are covered by the contract and cheat
tests (tests/domains/test_domains_contract.py, test_domains_cheats.py)."""

from __future__ import annotations

import pytest

from posttrain.domains import ifeval, pyfunc
from posttrain.domains.arith_fmt import final_answer
from posttrain.domains.base import split_of
from posttrain.domains.registry import all_domains
from posttrain.types import Episode

D = all_domains()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("7 + 5 = 12\nAnswer: 12", "12"),
        ("Answer: **12**", "12"),
        ("**Answer:** 12.", "12"),
        ("Answer: -3", "-3"),
        ("Answer: 12\nAnswer: 13", None),  # two answers
        ("answer: 12\nAnswer: 12", None),  # the same answer twice is still two lines
        ("Answer: 12\nthat is all", None),  # not the last line
        ("Answer: 12 or 13", None),
        ("12", None),
        ("<answer>12</answer>", None),
        ("", None),
    ],
)
def test_arith_fmt_reads_only_one_answer_line_that_ends_the_reply(text, want):
    assert final_answer(text) == want


def test_arith_fmt_scores_the_number_on_the_required_line():
    d = D["arith_fmt"]
    task = d.sample(0, "train", 1)
    ref = task.reference
    assert d.score(task, Episode(f"working\nAnswer: {ref}")).value == 1.0
    wrong = d.score(task, Episode(f"Answer: {int(ref) + 1}"))
    assert (wrong.value, wrong.parts["format"], wrong.reason) == (0.0, 1.0, "wrong answer")
    assert d.score(task, Episode(str(ref))).reason == "no 'Answer: N' last line"


@pytest.mark.parametrize(
    ("kind", "param", "text", "ok"),
    [
        ("min_words", 3, "one two three", True),
        ("min_words", 3, "one two", False),
        ("max_words", 2, "one two three", False),
        ("sentences", 2, "One. Two!", True),
        ("sentences", 2, "One. Two! Three?", False),
        ("include", "color", "The Color is red.", True),
        ("include", "color", "colorful", False),  # a whole word only
        ("forbid", "very", "every day", True),
        ("forbid", "very", "Very good", False),
        ("lower", "", "all lower here", True),
        ("lower", "", "Not lower", False),
        ("lower", "", "123", False),  # no letters: not a lowercase text
        ("upper", "", "ALL UPPER", True),
        ("json", "", '{"a": 1}', True),
        ("json", "", '```json\n{"a": 1}\n```', True),
        ("json", "", "[1, 2]", False),
        ("json", "", 'Here: {"a": 1}', False),
        ("bullets", 2, "- one\n- two", True),
        ("bullets", 2, "- one\n- two\n- three", False),
        ("bullets", 2, "Intro\n- one\n- two", False),  # every line a bullet
        ("ending", ifeval.END_PHRASE, f"Text. {ifeval.END_PHRASE}", True),
        ("ending", ifeval.END_PHRASE, f"{ifeval.END_PHRASE} More.", False),
    ],
)
def test_ifeval_checks_each_constraint_exactly(kind, param, text, ok):
    assert ifeval.check(kind, param, text) is ok


def test_ifeval_needs_the_topic_content_and_own_words():
    d = D["ifeval"]
    task = d.sample(0, "train", 1)
    gold = d.gold(task)
    assert d.score(task, Episode(gold)).passed
    echoed = d.score(task, Episode(f"{task.prompt[-1].content} {gold}"))
    assert echoed.parts["own_words"] == 0.0 and not echoed.passed
    short = d.score(task, Episode(task.reference.topic))
    assert short.parts["content"] == 0.0 and not short.passed


def test_ifeval_holds_out_its_eval_topics():
    d = D["ifeval"]
    for level in (1, 2):
        assert {d.sample(i, "train", level).reference.topic for i in range(200)} <= set(ifeval.TOPICS)
        assert {d.sample(i, "eval", level).reference.topic for i in range(50)} <= set(ifeval.EVAL_TOPICS)
    assert not set(ifeval.TOPICS) & set(ifeval.EVAL_TOPICS)


def test_pyfunc_tests_tell_the_wrong_body_apart_in_both_suites():
    for level in (1, 2, 3):
        for i in range(20):
            task = D["pyfunc_revise"].sample(i, "train", level)
            t, k = pyfunc.parse_name(task.reference.name)
            bad = pyfunc.reference_function(t, k, bad=True)
            for suite in (task.reference.visible, task.reference.hidden):
                assert any(bad(*a) != e for a, e in zip(suite.inputs(), suite.expected())), task.id


def test_pyfunc_and_its_loops_hold_out_the_same_functions():
    for name in ("pyfunc", "pyfunc_revise", "pyfunc_fix", "pyfunc_retry"):
        for split in ("train", "eval"):
            for i in range(10):
                task = D[name].sample(i, split, 2)
                statement = task.prompt[0].content.split("\n", 1)[0]
                assert split_of("pyfunc", statement) == split


def test_pyfunc_fix_is_the_loop_after_a_planted_failing_first_turn():
    """pyfunc_fix's task is a pyfunc_revise request (its visible tests, its instruction), then the wrong
    body as the assistant's turn and a failing observation of it as the tool's."""
    for level in (1, 2, 3):
        for i in range(10):
            fix = D["pyfunc_fix"].sample(i, "train", level)
            assert fix.prompt[0].content.endswith(pyfunc.REVISE_INSTRUCTION)
            assert pyfunc.show_tests(fix.reference.visible) in fix.prompt[0].content
            assert [m.role for m in fix.prompt] == ["user", "assistant", "tool"]
            assert fix.prompt[1].content == D["pyfunc_fix"].wrong(fix)
            assert fix.prompt[2].content.startswith("Visible tests: ") and "FAILED" in fix.prompt[2].content


def test_pyfunc_fix_observation_is_what_the_sandbox_observes_of_the_planted_attempt():
    """The planted observation (computed on the host) equals pyfunc_revise's environment stepping the
    planted attempt through the sandbox: the model sees the same words for the same failure."""
    domain = D["pyfunc_fix"]
    for level in (1, 2, 3):
        task = domain.sample(3, "train", level)
        env = domain.environment()()
        env.reset(task)
        result = env.step(task.prompt[1].content)
        assert result.observation == task.prompt[2].content and not result.done
        assert result.observation.endswith("\n" + pyfunc.ASK_REVISION)
        passed = env.step(domain.gold(task))  # a passing attempt ends the episode, no request to revise
        env.close()
        assert passed.done and pyfunc.ASK_REVISION not in passed.observation


def test_pyfunc_retry_asks_pyfunc_revise_s_questions_item_for_item():
    """The control repeats the loop's draws (`draws_as`): the same prompt and tests at every index,
    split and level, under its own id and domain; pyfunc_fix keeps its own draws."""
    retry, revise = D["pyfunc_retry"], D["pyfunc_revise"]
    for level in (1, 2, 3):
        for split in ("train", "eval"):
            for i in range(8):
                a, b = revise.sample(i, split, level), retry.sample(i, split, level)
                assert a.prompt == b.prompt and a.reference == b.reference
                assert b.domain == "pyfunc_retry" and b.id == a.id.replace("pyfunc_revise", "pyfunc_retry", 1)
    fix = [D["pyfunc_fix"].sample(i, "train", 2).reference.name for i in range(20)]
    assert fix != [revise.sample(i, "train", 2).reference.name for i in range(20)]


def test_pyfunc_retry_withholds_the_failure_but_not_the_verdict():
    """The same attempt in both loops: pyfunc_revise shows which visible test failed and what came back;
    the control shows the count line alone, closed by the same request to revise, with the same per-turn
    parts and the same end; no code gets the same NO_CODE in both."""
    from posttrain.domains.code import NO_CODE

    for level in (1, 2, 3):
        for i in range(4):
            task = D["pyfunc_revise"].sample(i, "eval", level)
            seen = {}
            for name in ("pyfunc_revise", "pyfunc_retry"):
                seen[name] = []
                for action in (D[name].wrong(task), D[name].gold(task), ""):  # each from a fresh reset
                    env = D[name].environment()()
                    env.reset(task)
                    seen[name].append(env.step(action))
                    env.close()
            full, bare = seen["pyfunc_revise"][0], seen["pyfunc_retry"][0]
            assert "FAILED" in full.observation and "expected:" in full.observation
            count = full.observation.split("\n", 1)[0]
            assert count.startswith("Visible tests: ") and count.endswith(" passed.")
            assert bare.observation == f"{count}\n{pyfunc.ASK_REVISION}"
            assert (bare.done, bare.parts) == (full.done, full.parts) == (False, full.parts)
            for a, b in zip(seen["pyfunc_revise"][1:], seen["pyfunc_retry"][1:]):
                assert (a.observation, a.done, a.parts) == (b.observation, b.done, b.parts)
            assert seen["pyfunc_retry"][1].done and seen["pyfunc_retry"][2].observation.startswith(NO_CODE)


def test_code_actions_compare_by_their_code_not_the_prose_around_it():
    """`action_key` (what the eval's repeated-at-turn@t compares): the same function in other words
    or other spacing is the same action in the code families; other code is not; the default domain
    compares the whole text, whitespace aside."""
    a = "Here is the function:\n```python\ndef f(x):\n    return x + 1\n```"
    b = "Sure! The corrected version:\n\n```python\ndef f(x):\n        return x + 1\n```\nIt adds one."
    c = "```python\ndef f(x):\n    return x + 2\n```"
    for name in ("pyfunc", "pyfunc_revise", "pyfunc_retry", "code", "code_revise"):
        key = D[name].action_key
        assert key(a) == key(b) != key(c), name
    assert D["add"].action_key("12 ") == D["add"].action_key(" 12") != D["add"].action_key("13")
    assert D["add"].action_key(a) != D["add"].action_key(b)


def _episode(domain, task, actions):
    """The loop's episode of `actions`, each stepped by a fresh environment of `domain` in the sandbox
    (the turns hold the visible run, as the driver records them) and the last one's hidden run."""
    from posttrain.types import Turn

    env = domain.environment()()
    env.reset(task)
    turns = []
    for action in actions:
        got = env.step(action)
        turns.append(Turn(action, got.observation, got.exec_result, dict(got.parts)))
    env.close()
    return Episode(actions[-1], tuple(turns), exec_result=domain.execute(task, actions[-1]))


def test_moved_counts_a_revision_by_what_its_code_did_not_how_it_reads():
    """The `moved` part: a revision that fails the visible tests as the attempt before did counts 0,
    whatever its names, comments and spacing; one that fails otherwise, or passes, counts 1; an episode
    of one turn reports no such part. Unweighted, the reward stays the hidden tests' outcome."""
    domain = D["pyfunc_revise"]
    task = domain.sample(0, "train", 2)
    wrong = domain.wrong(task)
    code = wrong.split("```python\n", 1)[1].split("```", 1)[0] if "```python" in wrong else wrong
    head, body = code.split("\n", 1)
    disguised = f"Let me fix it.\n```python\n# corrected\n{head}\n    unused_name = 0\n\n{body}```"
    other = f"```python\n{head}\n    return None\n```"
    cases = {
        "repeat": [wrong, wrong],
        "disguised repeat": [wrong, disguised],
        "other failure": [wrong, other],
        "fix": [wrong, domain.gold(task)],
    }
    scores = {name: domain.score(task, _episode(domain, task, acts)) for name, acts in cases.items()}
    assert _episode(domain, task, [disguised]).turns[0].parts["process"] < 1.0  # it still fails
    assert {n: s.parts["moved"] for n, s in scores.items()} == {
        "repeat": 0.0,
        "disguised repeat": 0.0,
        "other failure": 1.0,
        "fix": 1.0,
    }
    assert all(s.value == s.parts["outcome"] for s in scores.values())  # no weights: the outcome alone
    assert scores["repeat"].value == scores["disguised repeat"].value < scores["fix"].value == 1.0
    assert "moved" not in domain.score(task, _episode(domain, task, [domain.gold(task)])).parts


def test_moved_on_a_derived_task_compares_its_turn_with_the_attempt_in_its_prompt(monkeypatch):
    """A derived task (`tasks.branch`: the failed attempt and its observation in the prompt, the
    episode the revision alone) reports `moved` too: its one turn against the prompt's attempt, by
    behaviour, run once per task; the same repeat, disguise, other failure and fix as above."""
    from posttrain.domains import code

    domain = D["pyfunc_revise"]
    task = domain.sample(3, "train", 2)
    wrong = domain.wrong(task)
    first = _episode(domain, task, [wrong]).turns[0]
    assert first.parts["process"] < 1.0
    derived = domain.branched(task, [(wrong, first.observation)])
    assert derived.meta.branched == 1
    code_ = wrong.split("```python\n", 1)[1].split("```", 1)[0] if "```python" in wrong else wrong
    head, body = code_.split("\n", 1)
    cases = {
        "repeat": wrong,
        "disguised repeat": f"Fixed:\n```python\n{head}\n    spare = 1\n{body}```",
        "other failure": f"```python\n{head}\n    return None\n```",
        "fix": domain.gold(task),
    }
    runs, real = [], code.execute
    monkeypatch.setattr(code, "execute", lambda *a, **k: (runs.append(k.get("suite")), real(*a, **k))[1])
    code._visible_behaviour.cache_clear()
    got = {n: domain.score(derived, _episode(domain, derived, [a])).parts.get("moved") for n, a in cases.items()}
    assert got == {"repeat": 0.0, "disguised repeat": 0.0, "other failure": 1.0, "fix": 1.0}
    assert runs.count("visible") == 4 + 1  # each case's turn, and the prompt's attempt once for all four
    assert "moved" not in domain.score(task, _episode(domain, task, [wrong])).parts  # not derived: no revision


def test_weighted_moved_pays_a_new_attempt_less_than_a_pass_and_a_repeat_nothing():
    """Under `reward_weights: {outcome: 1, moved: w}` the order the shaping exists for, and no way to
    beat a pass: pass in one turn = fix = 1 > another failure = w / (1 + w) > a repeat, disguised or
    not = 0; a first turn that passes gets 1 with no revision to judge."""
    import dataclasses

    domain = D["pyfunc_revise"]
    base = domain.sample(1, "train", 2)
    task = dataclasses.replace(
        base, meta=dataclasses.replace(base.meta, reward_weights=(("outcome", 1.0), ("moved", 0.25)))
    )
    wrong, gold = domain.wrong(task), domain.gold(task)
    head = wrong.split("def ", 1)[1].split("\n", 1)[0]
    other = f"```python\ndef {head}\n    return None\n```"
    value = {
        name: domain.score(task, _episode(domain, task, acts)).value
        for name, acts in {
            "pass": [gold],
            "fix": [wrong, gold],
            "other": [wrong, other],
            "repeat": [wrong, wrong],
        }.items()
    }
    assert value == pytest.approx({"pass": 1.0, "fix": 1.0, "other": 0.25 / 1.25, "repeat": 0.0})
