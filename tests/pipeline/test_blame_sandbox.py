"""Blame by cause in the model's own sandbox, as a property (issue 35 item 1).

Whatever a model's action does inside its own sandbox session is the model's outcome. Each
hostile action of the corpus below (the working folder made unsearchable, removed, moved,
given away, the quota filled, the shell killed, the pids exhausted, a checked file turned
into a FIFO or a link to an endless device, a tree too deep to walk) is played as the first
turn of a terminal-family episode, followed by an ordinary command, through the one
lifecycle (`pipeline.play.Play`: the training budgets, retries and masking) against the real
fork-server sandbox and the real verifier. Each must come back scored, with a reason, never
masked. A real infrastructure failure (no sandbox slot for the episode; a checker that gives
no verdict on the task's untouched files too) still masks.

Before: `chmod 000 .` made the next step's set-up fail (the task process could not enter its
work directory), which was reported as the sandbox's infra error, retried and masked.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from hostile import PlanEngine

from posttrain import sandbox
from posttrain.configs.sandbox import SandboxConfig
from posttrain.domains import terminal as T
from posttrain.domains.registry import get
from posttrain.pipeline.group import RetryPolicy
from posttrain.pipeline.play import Play
from posttrain.types import SamplingParams

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")

HOSTILE = {
    "chmod 000 the folder": "chmod 000 .",
    "chmod 000 by path": "chmod 000 /task",
    "chmod -R": "chmod -R 000 /task",
    "no search bit": "chmod 600 /task",
    "chmod a subfolder": "mkdir -p d/e && chmod 000 d",
    "rm -rf of it": "rm -rf /task/* /task/.[!.]* ; cd / ; rm -rf /task",
    "mv it away": "cd / && mv /task /tmp/away; mv /task/* /tmp/",
    "chown": "chown -R 65534:65534 /task; chown 0 /task",
    "fill the quota": "head -c 200000000 /dev/zero > fill; head -c 50000000 /dev/zero > more",
    "kill the own shell": "kill -9 $$",
    "kill everything": "kill -9 -1",
    "exhaust pids": ":(){ :|:& };:",
    "a FIFO where a file is checked": "rm -f out app.cfg; mkfifo out app.cfg",
    "links to endless devices": "ln -sf /dev/zero out; ln -sf /dev/urandom app.cfg",
    "a tree too deep to walk": "python3 -c \"import os\nfor _ in range(1500): os.mkdir('d'); os.chdir('d')\"",
}
FOLLOW_UP = "ls -la; echo looked > seen"
DOMAINS = ("terminal", "term_fix")


def play(domain: str, plans: list[list[str]]):
    """One group of `plans` (sample i plays plans[i]) through the one lifecycle, verified."""
    dom = get(domain)
    task = dom.sample(0, "train", 1)
    budgets = {domain: dataclasses.replace(dom.budget, turns=max(map(len, plans)) + 1, seconds=600.0)}
    params = SamplingParams(n=len(plans), max_tokens=dom.budget.tokens, seed=0)
    [run] = Play(PlanEngine(plans), params, budgets, RetryPolicy(1, 0.0), sleep=lambda s: None).run([task])
    return run.result.rollouts, run.final


def _fenced(cmd: str) -> str:
    return f"```bash\n{cmd}\n```"


DEFAULT = ("chmod 000 the folder", "chmod -R")
"""The cases the default lane plays (the planted old rule fails both); `-m slow` plays the corpus."""


def _check(domain: str, names: list[str]) -> None:
    plans = [[_fenced(HOSTILE[n]), _fenced(FOLLOW_UP)] for n in names]
    rollouts, verdicts = play(domain, plans)
    masked = [f"{n}: {r.error_kind}: {r.error}" for n, r in zip(names, rollouts) if r.reward is None]
    assert not masked, masked
    for n, v in zip(names, verdicts):
        reason = v.fault or (v.score.reason if v.score is not None else "")
        assert v.score is not None and v.score.value < 1.0 and reason, (n, v)


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_working_folder_made_unusable_is_the_models_outcome(domain):
    _check(domain, list(DEFAULT))


@pytest.mark.slow
@pytest.mark.parametrize("domain", DOMAINS)
def test_no_hostile_action_of_the_corpus_in_its_own_sandbox_is_masked(domain):
    _check(domain, list(HOSTILE))


@pytest.fixture
def one_slot_pool():
    sandbox.set_pool_config(SandboxConfig(workers=1, acquire_timeout_s=0.5))
    yield sandbox.get_pool()
    sandbox.set_pool_config(SandboxConfig())


def test_an_episode_whose_sandbox_cannot_start_is_still_masked(one_slot_pool):
    """Every slot held elsewhere: the episode's session cannot open before any of its commands
    ran. That is the sandbox's failure: retried, then masked, never scored."""
    with one_slot_pool.session({}):
        rollouts, verdicts = play("terminal", [[_fenced("chmod 000 .")]])
    assert rollouts[0].reward is None and rollouts[0].error_kind == "sandbox", rollouts[0]
    assert "no worker free" in (rollouts[0].error or "")


def test_a_checker_that_fails_on_the_untouched_task_too_is_still_masked(monkeypatch):
    """After the model's commands ran, a checker that gives no verdict is judged by the cause
    test: here it gives none on the task's untouched files either, so it is the sandbox side's
    failure (masked), not the model's."""
    monkeypatch.setattr(T, "checker_source", lambda: "import sys\nsys.exit(3)\n")
    rollouts, _ = play("terminal", [[_fenced("echo hi > x")]])
    assert rollouts[0].reward is None and rollouts[0].error_kind == "verifier", rollouts[0]


def test_a_failure_only_the_models_state_causes_is_the_models(monkeypatch):
    """The cause test's other side: a checker that breaks only on a state the model made (a file
    named `boom`) fails on the replay too and not on the untouched files: the model's, scored 0."""
    real = T.checker_source()
    monkeypatch.setattr(T, "checker_source", lambda: "import os, sys\nos.path.exists('boom') and sys.exit(3)\n" + real)
    rollouts, verdicts = play("terminal", [[_fenced("touch boom")]])
    assert rollouts[0].reward == 0.0 and verdicts[0].fault and "untouched files" in verdicts[0].fault
