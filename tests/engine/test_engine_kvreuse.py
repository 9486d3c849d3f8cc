"""Context reuse across turns (hf engine, engine/sessions.py): an episode's KV cache is kept
between its turns and only the new tokens are computed. Greedy completions equal those of
full prefills, on real multi-turn domains (lookup, a document-fields loop, a tool world)
through the real driver and the staged pipeline, with eviction forced too; the counters
show the computed tokens fall >= 2x on 3-turn episodes; a diverging prompt, a weight update
and an ended episode all fall back to computing in full."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from test_engine_hf import spread_model

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget
from posttrain.domains.registry import get
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.envs import driver
from posttrain.errors import ConfigError
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.pipeline.play import Played
from posttrain.pipeline.play import play as play_episodes
from posttrain.types import GenerationRequest, Message, SamplingParams

LOOKUP, DOCS, TOOLS = "lookup", "doc_invoice_fields_text", "tool_transfer"
BUDGETS = {DOCS: Budget(turns=3, tokens=20), TOOLS: Budget(turns=3, tokens=20)}
"""Short actions keep the test fast; the domains' own prompts and observations are long."""
DOMAINS = [LOOKUP, DOCS, pytest.param(TOOLS, marks=pytest.mark.slow)]
"""The tool world's ~4k-token prompts take ~10 s per test on the CPU: slow lane."""
STOP = tuple("aeiostnp%")
"""The random model seldom samples eos: stop strings end its actions (finish "stop", not a
truncation that would end the episode), so episodes run 1 to 3 turns."""


@pytest.fixture(scope="module")
def model_tok():
    """A random micro model with wide weights (greedy paths vary, eos is reachable) and room
    for the tool world's ~4k-token prompts."""
    return spread_model(0, max_positions=8192)


def engine(model_tok, reuse: bool, **kw) -> HFEngine:
    model, tok = model_tok
    return HFEngine(model, tok, config=HFEngineConfig(context_reuse=reuse, **kw), seed=1)


def tasks(name: str, k: int) -> list:
    return [get(name).sample(i, "train", 1) for i in range(k)]


def play(eng: HFEngine, name: str, k: int, n: int, temperature: float = 0.0) -> list[list[Played]]:
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=7, stop=STOP)
    return play_episodes(eng, tasks(name, k), params, n=n, budgets=BUDGETS)


def same_completions(a, b, tol: float = 1e-4) -> float:
    """Asserts the episodes' tokens are identical; returns the largest log-prob gap."""
    gap = 0.0
    for x, y in zip((p for g in a for p in g), (p for g in b for p in g), strict=True):
        assert x.completion.token_ids == y.completion.token_ids
        assert x.turns == y.turns and x.episode.finish_reason == y.episode.finish_reason
        gap = max([gap, *(abs(p - q) for p, q in zip(x.completion.logprobs, y.completion.logprobs))])
    assert gap < tol
    return gap


@pytest.mark.parametrize("name", DOMAINS)
def test_greedy_episodes_are_identical_with_reuse_and_compute_fewer_tokens(model_tok, name):
    off, on = engine(model_tok, False), engine(model_tok, True)
    a, b = play(off, name, 4, 2), play(on, name, 4, 2)
    same_completions(a, b)
    turns = [p.turns for g in a for p in g]
    assert max(turns) >= 2  # multi-turn episodes, really
    st = on.stats()
    assert st.prompt_reused > 0 and st.prompt_tokens < off.stats().prompt_tokens
    assert st.sessions is not None and st.sessions.hits > 0
    assert st.sessions.held == 0 and st.sessions.ended > 0  # play ended its episodes' sessions
    assert off.stats().generated_tokens == st.generated_tokens


def episodes(eng: HFEngine, name: str, k: int, n: int, temperature: float = 0.0) -> list:
    """The trajectories of `k` tasks x `n` episodes, stepped by the driver's own functions (a
    task's episodes' turns batched in one engine call)."""
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=7, stop=STOP)
    dom, out = get(name), []
    for task in tasks(name, k):
        budget = BUDGETS.get(name, dom.budget)
        envs = driver.open_envs(dom, task, n)
        prompts = [eng.encode_chat(driver.first_messages(task, obs)) for _, obs in envs]
        trajs = driver.start(envs, task, prompts, budget.turns)
        while any(not t.done for t in trajs):
            reqs, targets = driver.requests(trajs, dataclasses.replace(params, max_tokens=budget.tokens), 7, task.id)
            driver.generate_each(eng.generate, reqs, targets)
            for t in (t for ts in targets for t in ts):
                driver.step(t)
                driver.observe(t, eng.encode_chat)
        eng.end_sessions(driver.session_keys(task.id, n))
        driver.close_envs(e for e, _ in envs)
        out += trajs
    return out


@pytest.mark.parametrize("name", DOMAINS)
def test_three_turn_episodes_compute_only_their_new_tokens(model_tok, name):
    """Counts, not time. With reuse, each later turn computes its new tokens (the observation),
    nothing else (the previous action's last token was fed before its session was kept); the first turn's
    prompt once per group (on its first sample). Per 3-turn episode of the document-fields loop
    and the tool world (prompts of ~700 and ~4,000 tokens), >= 2x fewer prompt tokens computed
    than without. Lookup's prompt (15 tokens) is shorter than the error observation the random
    model's bad actions get (36), so there the gain is smaller (asserted > 1.5x)."""
    off, on = engine(model_tok, False), engine(model_tok, True)
    a, b = episodes(off, name, 4, 3), episodes(on, name, 4, 3)
    for j, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.ids == y.ids  # identical completions
        assert x.prompt_new == y.prompt_new  # what is new does not depend on the engine
        shared = len(y.prompt_ids) if j % 3 else 0  # group-mates share the first turn's prompt
        assert y.prompt_computed == y.prompt_new - shared  # only the new tokens: each observation
    three = [(x, y) for x, y in zip(a, b) if len(x.turns) == 3]
    assert len(three) >= 4
    computed_off = sum(x.prompt_computed for x, _ in three)
    computed_on = sum(y.prompt_computed for _, y in three)
    assert computed_off >= (1.5 if name == LOOKUP else 2.0) * computed_on, (computed_off, computed_on)
    assert sum(x.prompt_computed for x in a) == off.stats().prompt_tokens  # the engine's own count
    assert sum(y.prompt_computed for y in b) == on.stats().prompt_tokens


@pytest.mark.parametrize(
    ("name", "spec"), [(LOOKUP, "off"), (LOOKUP, "suffix"), ("doc_fix", "off"), ("geo_fix", "off")]
)
def test_a_multi_turn_episode_computes_exactly_its_new_tokens(model_tok, name, spec):
    """Issue 39 item 3: each prompt token of an episode is computed once, so prompt tokens
    computed equal the new ones (ratio 1.00), the first prompt once per group. Decoding samples
    an action's last token without feeding it; the engine feeds it before keeping the session
    (the next step's forward while other rows still decode, else one closing forward), so the
    next turn computes only its observation. Sampled (T = 1): a group's episodes finish their
    turns at different steps and run 1 to 3 turns; lookup (with speculation too) and two feedback
    tiers (document and geometry fixes; docs/feedback.md). The old engine computed
    each later turn's observation plus that last token."""
    from posttrain.configs.engine import SpeculationConfig

    on = engine(model_tok, True, speculation=SpeculationConfig(kind=spec))
    trajs = episodes(on, name, 4, 3, temperature=1.0)
    assert max(len(t.turns) for t in trajs) == 3
    full = episodes(engine(model_tok, False, speculation=SpeculationConfig(kind=spec)), name, 4, 3, 1.0)
    assert [t.ids for t in trajs] == [t.ids for t in full]  # the fed last tokens' keys are right
    for j, t in enumerate(trajs):
        shared = len(t.prompt_ids) if j % 3 else 0  # group-mates share the first turn's prompt
        assert t.prompt_computed == t.prompt_new - shared, (j, t.prompt_computed, t.prompt_new, shared)
    st = on.stats()
    assert st.last_fed > 0 and sum(t.prompt_computed for t in trajs) == st.prompt_tokens
    assert st.sessions is not None and st.sessions.hits == sum(len(t.turns) - 1 for t in trajs)


def test_a_tiny_budget_evicts_and_changes_no_output(model_tok):
    off, tiny = engine(model_tok, False), engine(model_tok, True, context_budget_tokens=60)
    a, b = play(off, LOOKUP, 4, 3), play(tiny, LOOKUP, 4, 3)
    same_completions(a, b)
    st = tiny.stats().sessions
    assert st is not None and st.evicted > 0 and st.hits > 0  # some kept, some evicted
    assert st.tokens_held <= 60


def test_sampling_at_t1_gives_the_same_tokens_and_logprobs_within_rounding(model_tok):
    """Same seed per request: the same Gumbel noise, logits equal up to float rounding (the kept
    keys were computed one decode step at a time, the full prefill in one pass), so the tokens
    agree and the log-probs differ by ~1e-6, not bitwise."""
    off, on = engine(model_tok, False), engine(model_tok, True)
    a, b = play(off, LOOKUP, 4, 3, 1.0), play(on, LOOKUP, 4, 3, 1.0)
    gap = same_completions(a, b, tol=1e-4)
    assert len({p.completion.token_ids for g in a for p in g}) > 1  # samples differ
    assert on.stats().prompt_reused > 0
    assert gap >= 0.0


def _context(eng: HFEngine, text: str) -> tuple[int, ...]:
    return eng.encode_chat([Message("user", text)])


def test_a_diverging_prompt_falls_back_to_a_full_prefill(model_tok):
    on, off = engine(model_tok, True), engine(model_tok, False)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    first = _context(on, "a first question")
    c = on.generate([GenerationRequest(first, greedy, "r", ("s",))])[0][0]
    changed = (first[0] + 1,) + first[1:] + c.token_ids  # a different first token: not the kept prefix
    got = on.generate([GenerationRequest(changed, greedy, "r", ("s",))])[0][0]
    want = off.generate([GenerationRequest(changed, greedy)])[0][0]
    assert got.token_ids == want.token_ids and got.cached_tokens == 0
    st = on.stats()
    assert st.sessions is not None and st.sessions.diverged == 1 and st.prompt_reused == 0
    # the diverged turn kept its own context: the next turn resumes it
    nxt = changed + got.token_ids + first[-2:]  # its whole context kept (the last token too), then new tokens
    again = on.generate([GenerationRequest(nxt, greedy, "r", ("s",))])[0][0]
    assert again.cached_tokens == len(changed) + len(got.token_ids)
    assert again.token_ids == off.generate([GenerationRequest(nxt, greedy)])[0][0].token_ids


def test_a_weight_update_and_an_ended_episode_drop_kept_contexts(model_tok):
    on = engine(model_tok, True)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    p = _context(on, "hello there")
    c = on.generate([GenerationRequest(p, greedy, "", ("s",))])[0][0]
    assert on.stats().sessions.held == 1
    on.update_weights(None)  # new weights: the kept keys and values no longer hold
    assert on.stats().sessions.held == 0
    c2 = on.generate([GenerationRequest(p + c.token_ids, greedy, "", ("s",))])[0][0]
    assert c2.cached_tokens == 0
    on.end_sessions(["s", "never-kept"])
    st = on.stats().sessions
    assert st.held == 0 and st.ended == 1


def test_sessions_must_name_one_key_per_sample(model_tok):
    on = engine(model_tok, True)
    p = _context(on, "hi")
    with pytest.raises(ConfigError, match="sessions"):
        on.generate([GenerationRequest(p, SamplingParams(n=2), "", ("only-one",))])


def test_the_pipeline_batches_episodes_with_reuse_and_reports_the_counts(model_tok):
    """Lookup and document-fields groups through the staged pipeline, their turns batched in one
    engine call: the same completions with reuse off and on, per-rollout and pipeline counts
    of prompt tokens computed and new, and every session ended when its group finished."""
    work = tasks(LOOKUP, 3) + tasks(DOCS, 2)
    params = SamplingParams(max_tokens=12, temperature=0.0, stop=STOP)
    cfg = PipelineConfig(execute_workers=2, backoff_s=0.0, generate_batch=16)
    names = [LOOKUP, DOCS]

    def run(eng):
        sched = Scheduler(cfg, dict.fromkeys(names, 1.0), dict.fromkeys(names, "short"))
        workers = EmbeddedWorkers(eng)

        async def go():
            async with Pipeline(cfg, workers, dataclasses.replace(params, n=2), sched, seed=0, budgets=BUDGETS) as p:
                return await p.run_groups(work), p.stats().flat()

        try:
            return asyncio.run(go())
        finally:
            workers.close()

    off, on = engine(model_tok, False), engine(model_tok, True)
    calls: list[list[str]] = []
    inner = on.generate

    def recorded(requests):
        calls.append([r.request_id for r in requests])
        return inner(requests)

    on.generate = recorded  # type: ignore[method-assign]
    (ga, sa), (gb, sb) = run(off), run(on)
    later = [{rid.split(":")[0] for rid in c if ":" in rid} for c in calls]  # later turns' groups per call
    assert max(len(groups) for groups in later) >= 2  # different episodes' turns resumed in one call
    ra = [r for g in ga for r in g.rollouts]
    rb = [r for g in gb for r in g.rollouts]
    assert [r.completion.token_ids for r in ra] == [r.completion.token_ids for r in rb]
    assert [r.timings["prompt_new"] for r in ra] == [r.timings["prompt_new"] for r in rb]
    assert sum(r.timings["prompt_computed"] for r in rb) < sum(r.timings["prompt_computed"] for r in ra)
    assert sb["pipe_prompt_computed"] == sum(r.timings["prompt_computed"] for r in rb) == on.stats().prompt_tokens
    assert sa["pipe_prompt_new"] == sb["pipe_prompt_new"] > 0
    assert sb["pipe_prompt_computed"] < sa["pipe_prompt_computed"]
    st = on.stats().sessions
    assert st is not None and st.hits > 0 and st.held == 0
