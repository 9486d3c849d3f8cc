"""Evaluation in bounded memory (issue 35 item 9): the hf engine's token budget per batch,
an evaluation batch whose one prompt cannot run masking only that prompt, and the memory
estimate that refuses a run which cannot fit the machine.

Before: one batched prefill over up to 256 rows with no token bound (all of reasoning-gym's
long prompts in one forward) held over 20 GB, and the evaluator masked every group of a
failed call, so 117 domains were masked for their batch's sake."""

from __future__ import annotations

import dataclasses
import random

import pytest

from posttrain.configs import load_config
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.errors import ConfigError
from posttrain.model.arch import random_model
from posttrain.pipeline.play import Play
from posttrain.trainer.fit import check_fits, estimate
from posttrain.types import GenerationRequest, Message, SamplingParams


class Recording(HFEngine):
    """The real engine, recording each batch's KV size: rows x (longest prompt + largest max_tokens)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[tuple[int, int]] = []

    def _run_batch(self, batch):
        rows = [r for c in batch for r in c.rows]
        width = max(len(c.prompt) for c in batch) + max(r.max_tokens for r in rows)
        self.batches.append((len(rows), len(rows) * width))
        return super()._run_batch(batch)


@pytest.fixture(scope="module")
def model_tok():
    return random_model("micro", 0, max_positions=512)


def _requests(engine: HFEngine, seed: int) -> list[GenerationRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(10):
        text = "x" * rng.randint(1, 120)
        params = SamplingParams(max_tokens=rng.choice((2, 6, 10)), n=rng.choice((1, 1, 3, 6)), seed=i)
        out.append(GenerationRequest(engine.encode_chat([Message("user", text)]), params, f"r{i}"))
    return out


@pytest.mark.parametrize("seed", [0])
def test_every_batch_holds_at_most_the_token_budget_and_the_samples_do_not_change(model_tok, seed):
    model, tok = model_tok
    budget = 300
    bounded = Recording(model, tok, config=HFEngineConfig(max_batch_tokens=budget))
    free = Recording(model, tok, config=HFEngineConfig(max_batch_tokens=1 << 30))
    reqs = _requests(bounded, seed)
    a, b = bounded.generate(reqs), free.generate(reqs)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert all(tokens <= budget or rows == 1 for rows, tokens in bounded.batches), bounded.batches
    assert sum(rows for rows, _ in bounded.batches) == sum(r.params.n for r in reqs)
    assert max(t for _, t in free.batches) > budget  # the unbounded engine's batch passes it: the test can fail


def test_a_row_larger_than_the_budget_runs_alone(model_tok):
    model, tok = model_tok
    engine = Recording(model, tok, config=HFEngineConfig(max_batch_tokens=10))
    prompt = engine.encode_chat([Message("user", "y" * 50)])
    [group] = engine.generate([GenerationRequest(prompt, SamplingParams(max_tokens=3, n=4, seed=0))])
    assert len(group) == 4 and engine.batches == [(1, len(prompt) + 3)] * 4


def test_an_evaluation_batch_masks_only_the_prompt_that_cannot_run(model_tok):
    """One task whose prompt is past the model's positions, among 7 that fit, in one engine
    call: it alone is masked (kind prompt), the others are scored (before: all 8 masked)."""
    from posttrain.domains.registry import get

    model, tok = model_tok
    engine = HFEngine(model, tok)
    add = get("add")
    tasks = [add.sample(i, "eval", 1) for i in range(8)]
    long = dataclasses.replace(tasks[3], id="add:too-long", prompt=(Message("user", "9" * 600),))
    tasks[3] = long
    runs = Play(engine, SamplingParams(max_tokens=4, temperature=0.0, n=1, seed=0)).run(tasks)
    kinds = [r.result.rollouts[0].error_kind for r in runs]
    assert kinds == [None, None, None, "prompt", None, None, None, None], kinds
    assert all(r.result.rollouts[0].reward is not None for k, r in enumerate(runs) if k != 3)


def test_a_run_that_cannot_fit_is_refused_before_it_starts_in_one_line(model_tok):
    model, _ = model_tok
    fits = load_config(None, [])
    est = check_fits(fits, model, memory=24 << 30)
    assert est.total < 4 << 30  # the defaults on the embedded base fit well under a 24 GiB machine
    big = load_config(None, ["engine.max_batch_tokens=1000000000"])
    with pytest.raises(ConfigError) as info:
        check_fits(big, model, memory=24 << 30)
    msg = str(info.value)
    assert "\n" not in msg and "24.0 GiB on this machine" in msg and "generation batch" in msg
    assert f"{estimate(big, model).total / (1 << 30):.1f} GiB" in msg
