"""The `terminal` domain: every template's gold script scores 1.0 and its wrong
script less, sampling is deterministic with disjoint splits, and the
multi-turn environment keeps state between steps."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from posttrain.configs.sandbox import SandboxConfig
from posttrain.domains import terminal as T
from posttrain.domains.base import stable_rng
from posttrain.domains.registry import get
from posttrain.errors import SandboxError
from posttrain.types import Episode, Turn

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")
DOMAIN = get("terminal")


def test_at_least_20_templates_in_three_levels():
    names = T.templates().TEMPLATES
    assert len(names) >= 20
    assert {T._level_of(n) for n in names} == {1, 2, 3}
    assert DOMAIN.cost_class == "long"


def test_sampling_is_deterministic_and_splits_are_disjoint():
    for level in (1, 2, 3):
        assert DOMAIN.sample(3, "eval", level) == DOMAIN.sample(3, "eval", level)
        train = {DOMAIN.sample(i, "train", level).prompt[0].content for i in range(30)}
        evals = {DOMAIN.sample(i, "eval", level).prompt[0].content for i in range(30)}
        assert len(train) > 5 and len(evals) > 3 and not train & evals


def _gold_and_wrong(names):
    def both(name):
        inst = T.templates().TEMPLATES[name](stable_rng("test", name))
        task = DOMAIN._make(0, "train", inst["level"], name, inst["prompt"], inst)
        return name, DOMAIN.score(task, Episode(DOMAIN.gold(task))), DOMAIN.score(task, Episode(DOMAIN.wrong(task)))

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        for name, gold, wrong in ex.map(both, names):
            assert gold.value == 1.0 and gold.passed, (name, gold)
            assert wrong.value < 1.0 and not wrong.passed, (name, wrong)


@root_only
def test_a_third_of_the_templates_gold_passes_and_wrong_fails():
    _gold_and_wrong(sorted(T.templates().TEMPLATES)[::3])


@root_only
@pytest.mark.slow
def test_every_template_gold_passes_and_wrong_fails():
    _gold_and_wrong(sorted(T.templates().TEMPLATES))


@root_only
def test_turns_are_replayed_in_order():
    task = next(
        DOMAIN.sample(i, "train", 1) for i in range(50) if DOMAIN.sample(i, "train", 1).reference.template == "env_file"
    )
    gold = T.extract_script(DOMAIN.gold(task))
    first, second = gold.replace("\\nDB_PORT", "\\nX").strip(), gold.strip()
    assert DOMAIN.score(task, Episode("", turns=(Turn(first), Turn(second)))).value == 1.0
    assert DOMAIN.score(task, Episode("", turns=(Turn(second), Turn("rm .env")))).value < 1.0


@root_only
def test_environment_keeps_state_between_steps():
    env = DOMAIN.environment()()
    task = DOMAIN.sample(0, "train", 1)
    try:
        assert env.reset(task) == ""
        env.step("echo one > f.txt")
        got = env.step("```bash\ncat f.txt\n```")
        assert got.observation.startswith("stdout:\none\n") and not got.done
    finally:
        env.close()


def test_infra_error_raises_instead_of_scoring(monkeypatch):
    from posttrain import sandbox

    class Broken:
        def session(self, *a, **k):
            raise SandboxError("no worker")

    monkeypatch.setattr(sandbox, "get_pool", lambda: Broken())
    task = DOMAIN.sample(0, "train", 2)
    with pytest.raises(SandboxError):
        DOMAIN.score(task, Episode(DOMAIN.gold(task)))


@root_only
def test_many_environments_share_a_small_pool_without_waiting(monkeypatch):
    """G episodes run concurrently on a 1-worker pool: no environment holds a
    slot between turns, so none waits for another to finish."""
    from posttrain import sandbox

    pool = sandbox.Pool(SandboxConfig(workers=1, acquire_timeout_s=20))
    monkeypatch.setattr(sandbox, "get_pool", lambda: pool)
    task = DOMAIN.sample(0, "train", 1)
    envs = [DOMAIN.environment()() for _ in range(4)]
    try:
        for i, env in enumerate(envs):
            env.reset(task)
            env.step(f"echo {i} > mine.txt")  # every env's first turn before any second turn
        outs = [env.step("cat mine.txt").observation for env in envs]
        assert [o.splitlines()[1] for o in outs] == ["0", "1", "2", "3"]
    finally:
        for env in envs:
            env.close()
        pool.close()


def _template_task(name):
    inst = T.templates().TEMPLATES[name](stable_rng("test", name))
    return DOMAIN._make(0, "train", inst["level"], name, inst["prompt"], inst)


@root_only
@pytest.mark.parametrize("cheat", sorted(T.CHEATS))
def test_declared_cheats_score_below_the_gold(cheat):
    for name in ("rename_ext", "fix_port", "greet_script"):
        task = _template_task(name)
        s = DOMAIN.score(task, Episode(f"```bash\n{T.CHEATS[cheat]}```"))
        assert s.value < 1.0 and not s.passed, (cheat, name, s)


@root_only
def test_the_stealing_cheat_wins_when_the_checks_are_readable():
    """Control: the same script scores 1.0 once the checks sit in a file of the
    session, so the rejection above is the verifier's doing, not a broken cheat."""
    import dataclasses
    import json

    task = _template_task("fix_port")
    ref = task.reference
    leaky = dataclasses.replace(
        ref, files=ref.files + (("leak.json", json.dumps({"checks": json.loads(ref.checks_json)})),)
    )
    steal = f"```bash\n{T.CHEATS['steal_checks_now']}```"
    assert DOMAIN.score(dataclasses.replace(task, reference=leaky), Episode(steal)).value == 1.0
    assert DOMAIN.score(task, Episode(steal)).value < 1.0


def test_the_checker_verdict_has_no_nonce_and_the_checks_travel_on_stdin():
    import inspect

    assert "nonce" not in T.checker_source().split('"""', 2)[2]
    assert "nonce" not in inspect.getsource(T.TerminalVerifier)


@root_only
def test_a_json_end_state_with_bools_as_numbers_scores_below_the_gold():
    """`"private": 1` for `true` is a changed field; the checker compares JSON type-strictly."""
    task = _template_task("json_version")
    cheats = [c for c in DOMAIN.cheats(task) if "<<'JSON'" in c]
    assert cheats and '"private": 1' in cheats[0]
    assert DOMAIN.score(task, Episode(DOMAIN.gold(task))).value == 1.0
    for cheat in cheats:
        s = DOMAIN.score(task, Episode(cheat + "\ndone"))
        assert s.value < 1.0 and not s.passed, s
