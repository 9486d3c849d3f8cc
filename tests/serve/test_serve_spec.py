"""Speculative decoding: drafts change speed, never the output (greedy and seeded sampling); the
model-free drafter reads past completions of the same prompt; draft lengths adapt."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from posttrain.engine.drafter import TaskStore
from posttrain.engine.hf import HFEngine
from posttrain.model.arch import random_model
from posttrain.serve.spec import ModelDrafter, SpeculativeEngine, SuffixDrafter, int8_copy
from posttrain.types import GenerationRequest, Message, SamplingParams


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return random_model("tiny", seed=4)


def _never(logits, step):
    raise AssertionError("the model-free drafter must not call the model")


def test_suffix_drafter_proposes_continuation_of_latest_match():
    d = SuffixDrafter(max_n=2, min_n=1)
    #         0  1  2  3  4  5  6  7  8
    ids = [1, 2, 3, 4, 9, 2, 3, 5, 2, 3]
    d.start(ids[:1])
    assert d.propose(ids, 3, _never, 9) == [5, 2, 3]  # latest "2 3" is at 5..6, followed by 5, 2, 3
    assert d.propose(ids, 5, _never, 9) == [4, 9, 2, 3, 5]  # only the earlier "2 3" at 1..2 is followed by 5
    d.start(ids[:4])  # a match inside the prompt proposes what followed it there, up to the prompt's end
    assert d.propose(ids, 5, _never, 6) == [5, 2, 3]
    d.start([1])
    assert d.propose([1, 1, 1, 1, 1], 3, _never, 4) == [1, 1, 1]  # a run: the earliest "1 1" has 3 after it
    d.start([1, 2])
    assert d.propose([1, 2, 3], 4, _never, 1) == []  # "3" never occurred before
    d.start([7])
    assert d.propose([7, 8, 7], 2, _never, 2) == [8, 7]  # falls back to a 1-gram
    two = SuffixDrafter(max_n=2, min_n=2)
    two.start([7])
    assert two.propose([7, 8, 7], 2, _never, 2) == []  # no 1-token matches below min_n


def test_suffix_drafter_reads_past_completions_of_the_same_prompt_only():
    store = TaskStore(max_tasks=2, per_task=2)
    d = SuffixDrafter(max_n=4, store=store)
    d.start([5, 6, 7])
    assert d.propose([5, 6, 7], 4, _never, 0) == []  # nothing seen after "6 7" yet
    d.finish([40, 41, 42, 43, 2])
    assert store.get([5, 6, 7]) == ((40, 41, 42, 43, 2),)
    d.start([5, 6, 7])
    assert d.propose([5, 6, 7], 3, _never, 0) == [40, 41, 42]  # the past completion's start
    assert d.propose([5, 6, 7, 40, 41], 4, _never, 2) == [42, 43, 2]
    d.start([9, 6, 7, 8])
    assert d.propose([9, 6, 7, 8], 3, _never, 0) == []  # another prompt: not its past


def _requests(engine, temperature, seed=5):
    prompts = [engine.encode_chat([Message("user", f"rev {w}=")]) for w in ("abcabc", "hello", "xyzzy", "aaaa")]
    return [
        GenerationRequest(p, SamplingParams(max_tokens=24, temperature=temperature, seed=seed, n=2)) for p in prompts
    ]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_drafter_mix_reproduces_the_standard_engine(model, temperature):
    m, tok = model
    reference = HFEngine(m, tok)
    reqs = _requests(reference, temperature)
    want = [[c.token_ids for c in g] for g in reference.generate(reqs)]
    q = int8_copy(m)
    for drafters in ([], [SuffixDrafter()], [ModelDrafter(q)], [SuffixDrafter(), ModelDrafter(q)]):
        engine = SpeculativeEngine(m, tok, drafters)
        got = engine.generate(reqs)
        assert [[c.token_ids for c in g] for g in got] == want, [d.name for d in drafters]
        if any(d.name == "int8" for d in drafters) or (drafters and temperature == 0):
            assert engine.stats.target_forwards < engine.stats.tokens  # speculation saved target forwards


def test_logprobs_and_stop_strings_match_the_standard_engine(model):
    m, tok = model
    reference = HFEngine(m, tok)
    prompt = reference.encode_chat([Message("user", "sort 3124=")])
    free = reference.generate([GenerationRequest(prompt, SamplingParams(max_tokens=30, temperature=0.0))])[0][0]
    stop = free.text[5:7] if len(free.text) > 8 else "zz"
    req = [GenerationRequest(prompt, SamplingParams(max_tokens=30, temperature=0.0, stop=(stop,)))]
    a = reference.generate(req)[0][0]
    b = SpeculativeEngine(m, tok, [SuffixDrafter(), ModelDrafter(int8_copy(m))]).generate(req)[0][0]
    assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_streaming_callback_sees_every_token_once(model):
    m, tok = model
    engine = SpeculativeEngine(m, tok, [SuffixDrafter()])
    seen: dict[tuple[int, int], list[int]] = {}
    reqs = _requests(engine, 0.7)[:2]
    out = engine.generate(reqs, on_tokens=lambda r, s, ids: seen.setdefault((r, s), []).extend(ids))
    assert {k: tuple(v) for k, v in seen.items()} == {
        (r, s): c.token_ids for r, g in enumerate(out) for s, c in enumerate(g)
    }


def test_int8_target_is_a_different_model(model):
    m, tok = model
    q = int8_copy(m)
    assert any(type(mod).__module__.startswith("torch.ao") for mod in q.modules())
    assert all(
        type(mod).__module__.startswith("torch.nn") or "quantized" not in type(mod).__module__ for mod in m.modules()
    )  # the float model is untouched


def test_lean_decoder_matches_transformers_logits(model):
    from posttrain.serve.lean import LeanDecoder

    m, _ = model
    ids = list(range(5, 40))
    with torch.inference_mode():
        want = m(input_ids=torch.tensor([ids])).logits[0]
    dec = LeanDecoder(m)
    got = torch.cat([dec.forward(ids[:9]), dec.forward(ids[9:10]), dec.forward(ids[10:])])  # prefill, step, chunk
    assert (got - want).abs().max().item() < 1e-4
    dec.truncate(9)  # rewinding the cache recomputes the same logits
    assert (dec.forward(ids[9:12]) - want[9:12]).abs().max().item() < 1e-4
    q = LeanDecoder(m, int8=True)
    approx = q.forward(ids)
    assert 0 < (approx - want).abs().max().item() < 0.5  # int8: close, not equal


def test_lean_decoder_layouts_compute_the_same_logits(model):
    """The default (in, out) weights (x @ w; the LM head transposed for steps of up to SMALL_ROWS
    rows) and the module's own (out, in) (F.linear) give the same logits at every step width."""
    from posttrain.errors import ConfigError
    from posttrain.serve.lean import SMALL_ROWS, LeanDecoder

    m, _ = model
    fast, plain = LeanDecoder(m), LeanDecoder(m, layout="out_in")
    inner = m.model.layers[0]
    assert fast.layers[0]["down"].shape == inner.mlp.down_proj.weight.shape[::-1]  # held as (in, out)
    assert plain.layers[0]["down"].shape == inner.mlp.down_proj.weight.shape
    assert fast.lm_head_t.shape == m.lm_head.weight.shape[::-1] and plain.lm_head_t is None
    ids = list(range(5, 60))
    at = 0
    for width in (7, 1, 1, 2, 3, SMALL_ROWS + 1, 5, 1):  # a prefill, then steps on each side of SMALL_ROWS
        chunk = ids[at : at + width]
        a, b = fast.forward(chunk), plain.forward(chunk)
        assert a.shape == b.shape == (width, m.config.vocab_size)
        assert (a - b).abs().max().item() < 1e-4, width
        at += width
    with pytest.raises(ConfigError, match="layout"):
        LeanDecoder(m, layout="columns")


@pytest.mark.parametrize(
    "kw",
    [
        {"target": "lean"},
        {"draft_model": "lean"},
        {"draft_model": "lean-int8"},
        {"target": "lean", "ngram": False, "draft_model": "none"},
    ],
)
def test_served_fast_configs_reproduce_the_standard_engine(model, kw):
    from posttrain.configs.serve import FastTierConfig
    from posttrain.serve.tiers import build_fast

    m, tok = model
    reference = HFEngine(m, tok)
    reqs = _requests(reference, 0.0)[:2] + _requests(reference, 0.8)[2:]
    want = [[c.token_ids for c in g] for g in reference.generate(reqs)]
    engine = build_fast(m, tok, FastTierConfig(**kw), "lossless", 0)
    assert [[c.token_ids for c in g] for g in engine.generate(reqs)] == want


def _fitted_head(m, tok, reqs):
    """A draft head fitted (as trainer.draft_head fits it) to the model's own greedy outputs."""
    from posttrain.model.draft_head import DraftHead, policy_tables

    comps = [c for g in HFEngine(m, tok).generate(reqs) for c in g]
    hidden, target, row, col = [], [], [], []
    with torch.no_grad():
        for r, c in enumerate(comps):
            seq = list(c.prompt_ids) + list(c.token_ids)
            h = m.get_decoder()(input_ids=torch.tensor([seq])).last_hidden_state[0]
            hidden.append(h[len(c.prompt_ids) - 1 : len(seq) - 1])
            target.append(torch.tensor(c.token_ids))
            row += [r] * len(c.token_ids)
            col += list(range(len(c.token_ids)))
    head = DraftHead(m.config.hidden_size, depth=4)
    opt = torch.optim.AdamW(head.parameters(), lr=6e-2)
    args = (torch.cat(hidden), torch.cat(target), torch.tensor(row), torch.tensor(col), *policy_tables(m))
    for _ in range(50):
        loss, _ = head.fit_loss(*args)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head


@pytest.mark.heavy  # about 3-5 s: fits a head to the model's outputs first
def test_the_fast_tier_drafts_with_the_folders_head_and_reproduces_the_standard_engine(model, tmp_path):
    from posttrain.configs.serve import FastTierConfig
    from posttrain.model.draft_head import load_if_any
    from posttrain.serve.tiers import build_fast

    m, tok = model
    reference = HFEngine(m, tok)
    reqs = _requests(reference, 0.0)
    want = [[c.token_ids for c in g] for g in reference.generate(reqs)]
    _fitted_head(m, tok, reqs).save(tmp_path)
    head = load_if_any(tmp_path, m)
    assert head is not None and load_if_any(tmp_path / "nothing", m) is None
    plain = build_fast(m, tok, FastTierConfig(ngram=False, draft_model="none"), "lossless", 0)
    fast = build_fast(m, tok, FastTierConfig(ngram=False, draft_model="none", head=True), "lossless", 0, head)
    assert [d.name for d in fast.drafters] == ["head"]
    assert [[c.token_ids for c in g] for g in fast.generate(reqs)] == want
    assert [[c.token_ids for c in g] for g in plain.generate(reqs)] == want
    st = fast.stats.drafters["head"]
    assert st.accepted > 0.7 * st.proposed  # drafts from the right position are accepted
    assert st.proposed_at[0] == st.rounds and sum(st.accepted_at) == st.accepted  # per depth
    assert fast.stats.as_dict()["drafters"]["head"]["accepted_len"] == st.emitted / st.rounds
    assert st.accepted + st.rounds >= st.emitted >= st.accepted  # at most one target token per forward
    assert fast.stats.target_forwards < 0.5 * plain.stats.target_forwards
    sampled = _requests(reference, 0.9)
    assert [[c.token_ids for c in g] for g in fast.generate(sampled)] == [
        [c.token_ids for c in g] for g in reference.generate(sampled)
    ]
    off = build_fast(m, tok, FastTierConfig(ngram=False, draft_model="none", head=False), "lossless", 0, head)
    assert off.drafters == []


def test_the_head_drafter_reads_the_hidden_state_that_chose_the_last_token(model):
    from posttrain.model.draft_head import DraftHead, policy_tables
    from posttrain.serve.lean import HeadDrafter, LeanDecoder, LeanTarget

    m, _ = model
    head = DraftHead(m.config.hidden_size, depth=3, seed=2)
    with torch.no_grad():  # a head whose drafts depend on the hidden state, not on the token alone
        head.fc.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
        head.fc.weight[:, m.config.hidden_size :] = 0
    decoder = LeanDecoder(m)
    drafter = HeadDrafter(head, decoder)
    ids = [5, 9, 12, 7, 30, 31, 8]
    target = LeanTarget(decoder)
    target.forward(ids[:-1])  # what the fast tier has cached when ids[-1] was just chosen
    with torch.no_grad():
        states = m.get_decoder()(input_ids=torch.tensor([ids[:-1]])).last_hidden_state[0]
    h = states[-1]
    want = head.draft(h[None], torch.tensor([ids[-1]]), 3, *policy_tables(m))[0].tolist()
    assert drafter.propose(ids, 3, _never, step=1) == want
    assert drafter.propose(ids, 3, _never, step=0) == []  # the prompt's last token was not chosen
    before = head.draft(states[-2][None], torch.tensor([ids[-1]]), 3, *policy_tables(m))[0].tolist()
    assert before != want  # the position matters to this head (an off-by-one would show)


def _greedy(m, tok, text: str, max_tokens: int) -> tuple[GenerationRequest, tuple[int, ...]]:
    """A greedy request for `text` and the standard engine's answer, which runs to max_tokens."""
    reference = HFEngine(m, tok)
    req = GenerationRequest(
        reference.encode_chat([Message("user", text)]), SamplingParams(max_tokens=max_tokens, temperature=0.0)
    )
    want = reference.generate([req])[0][0].token_ids
    assert len(want) == max_tokens  # a random model: no eos before max_tokens
    return req, want


def _drafter_counts(engine) -> tuple[int, int, int]:
    """(rounds, proposed, accepted) of the engine's one drafter."""
    (st,) = engine.stats.drafters.values()
    return st.rounds, st.proposed, st.accepted


def test_a_repeated_prompt_is_drafted_from_its_past_completion(model):
    from posttrain.configs.serve import FastTierConfig
    from posttrain.serve.tiers import build_fast

    m, tok = model
    req, want = _greedy(m, tok, "rev xyzzy=", 32)
    engine = build_fast(m, tok, FastTierConfig(draft_model="none"), "lossless", 0)
    assert engine.generate([req])[0][0].token_ids == want
    first = _drafter_counts(engine)
    (st,) = engine.stats.drafters.values()
    emitted_before = st.emitted
    assert engine.generate([req])[0][0].token_ids == want
    rounds, proposed, accepted = (b - a for a, b in zip(first, _drafter_counts(engine)))
    assert accepted == proposed == 32 - rounds  # every draft accepted in full, only the target's own token added
    assert st.emitted - emitted_before == 32  # every token of the answer came out of a drafted forward
    assert rounds <= 4  # drafts of 4, 8, 10, 10 tokens: 31 drafted tokens, 4 target forwards after the prefill
    assert accepted > first[2]  # the first request had no past completion to draft from


def test_the_accepted_length_counts_the_tokens_a_forward_emitted():
    from posttrain.serve.spec import DraftStats

    st = DraftStats()
    st.add(4, 2)  # two accepted, then the target's own token: 3 out of the forward
    st.add(3, 3, 3)  # a draft ending in an accepted end of sequence: no token after it
    assert (st.rounds, st.accepted, st.emitted) == (2, 5, 6)
    assert st.accepted_len == 3.0  # not 1 + 5 / 2 = 3.5
    assert st.proposed_at == [2, 2, 2, 1] and st.accepted_at == [2, 2, 1, 0]  # per depth


class _Oracle:
    """A drafter that knows the answer: the right next tokens up to step `right_until`, then
    wrong ones. It records each draft length it was asked for."""

    name = "oracle"
    stop_ids: set[int] = set()

    def __init__(self, answer: Sequence[int], right_until: int, vocab: int) -> None:
        self.answer, self.right_until, self.vocab = list(answer), right_until, vocab
        self.asked: list[tuple[int, int]] = []

    def start(self, prompt: Sequence[int]) -> None:
        self.asked = []

    def finish(self, out: Sequence[int]) -> None:
        return None

    def propose(self, ids: Sequence[int], k: int, choose, step: int) -> list[int]:
        self.asked.append((step, k))
        if step < self.right_until:
            return self.answer[step : step + k]
        return [(t + 1) % self.vocab for t in self.answer[step : step + k]]


def test_the_draft_length_grows_after_full_acceptance_and_shrinks_after_rejection(model):
    m, tok = model
    req, want = _greedy(m, tok, "sort 3124=", 40)
    oracle = _Oracle(want, right_until=12, vocab=m.config.vocab_size)
    engine = SpeculativeEngine(m, tok, [oracle], draft_tokens=[8])
    assert engine.generate([req])[0][0].token_ids == want
    # (step, length): starts at 4; 4 right (+1 from the target) -> doubled to 8 at step 5; 8 right ->
    # 8 (the most) at step 14; asked from step 12 on it is wrong: only the target's token, halved
    # each time -> 4 at 15, 2 at 16, 1 at 17, 1 at 18 (12 of 24 drafted tokens accepted: still drafting)
    assert oracle.asked[:7] == [(0, 4), (5, 8), (14, 8), (15, 4), (16, 2), (17, 1), (18, 1)]
    assert engine.stats.drafters["oracle"].accepted == 12
    engine.generate([req])
    assert oracle.asked[0] == (0, 4)  # a new sequence starts over


class _OneRight:
    """A drafter whose every draft has the right next token, then wrong ones: a quarter of its
    4-token drafts accepted, so 2 tokens out of each verifying forward."""

    name = "one_right"
    stop_ids: set[int] = set()

    def __init__(self, answer: Sequence[int], vocab: int) -> None:
        self.answer, self.vocab, self.rounds = list(answer), vocab, 0

    def start(self, prompt: Sequence[int]) -> None:
        self.rounds = 0

    def finish(self, out: Sequence[int]) -> None:
        return None

    def propose(self, ids: Sequence[int], k: int, choose, step: int) -> list[int]:
        self.rounds += 1
        right = self.answer[step : step + 1]
        return right + [(t + 1) % self.vocab for t in self.answer[step + 1 : step + 4]]


@pytest.mark.parametrize("verify_cost, drafting", [(3.0, False), (1.2, True)])
def test_a_drafter_stops_where_its_rounds_cost_more_than_the_tokens_they_emit(model, verify_cost, drafting):
    """Time is a fake clock: a plain step costs 1, a verifying forward of a draft `verify_cost`.
    The drafter emits 2 tokens a round (a fourth of its tokens accepted: the old rule, a fifth,
    kept it drafting either way): at 3.0 a round costs more than the 2 plain steps it saves and
    the drafter stops after its 4 rounds; at 1.2 it pays and drafts to the end. Greedy output is
    the standard tier's either way."""
    m, tok = model
    req, want = _greedy(m, tok, "sort 3124=", 30)
    now = [0.0]
    drafter = _OneRight(want, m.config.vocab_size)
    engine = SpeculativeEngine(m, tok, [drafter], draft_tokens=[4], clock=lambda: now[0])
    forward = engine._forward

    def timed(ids, cache):
        now[0] += 1.0 if len(ids) == 1 else verify_cost
        return forward(ids, cache)

    engine._forward = timed
    engine.plain_s = 1.0  # as if a plain step had been timed before
    assert engine.generate([req])[0][0].token_ids == want
    if drafting:
        assert drafter.rounds == 15  # every round drafted: 2 tokens each over 30
    else:
        assert drafter.rounds == 4  # stopped after its first 4 rounds
        assert engine.plain_s == pytest.approx(1.0)  # the plain steps after it cost 1 each
    frozen = SpeculativeEngine(m, tok, [_OneRight(want, m.config.vocab_size)], draft_tokens=[4], clock=lambda: 0.0)
    frozen.generate([req])  # no time measured: the fifth rule, under which a fourth accepted keeps drafting
    assert frozen.drafters[0].rounds == 15


@pytest.mark.parametrize("which", ["micro_base", "random tiny"])
def test_the_fast_tier_reproduces_the_standard_tier_on_the_embedded_model(model, which, request):
    """The embedded architecture: the session's micro base (pretrained a few steps: it answers
    with an end of sequence at once) and random tiny weights (long answers)."""
    from posttrain.configs.serve import FastTierConfig
    from posttrain.evaluate import eval_tasks
    from posttrain.model.arch import load_model
    from posttrain.serve.tiers import build_fast

    torch.set_num_threads(1)
    m, tok = load_model(request.getfixturevalue("micro_base")) if which == "micro_base" else model
    reference = HFEngine(m, tok)
    reqs = [
        GenerationRequest(reference.encode_chat(t.prompt), SamplingParams(max_tokens=24, temperature=temp, seed=3))
        for d in ("add", "reverse", "sort")
        for t in eval_tasks(d, 1, 2)
        for temp in (0.0, 0.8)
    ]
    want = [g[0].token_ids for g in reference.generate(reqs)]
    engine = build_fast(m, tok, FastTierConfig(), "lossless", 0)
    assert [d.name for d in engine.drafters][0] == "suffix"
    for _ in range(2):  # the second pass drafts from the first's completions
        assert [engine.generate([r])[0][0].token_ids for r in reqs] == want
    suffix = engine.stats.drafters["suffix"]
    assert suffix.accepted >= sum(len(w) - 1 for w in want) // 2  # the repeats were drafted (and accepted)


@pytest.mark.parametrize(
    ("ratio", "drafters"), [(0.30, ["suffix"]), (0.47, ["suffix"]), (0.2, ["suffix", "lean-int8"])]
)
def test_auto_drafts_with_lean_int8_only_where_its_step_costs_under_a_quarter(model, monkeypatch, ratio, drafters):
    """`draft_model=auto` (the default) by the measured int8/float step ratio: at 0.30 (the 19M
    preset) and 0.47 (SmolLM2-135M) lean-int8 drafts cost more than they saved
    (bench/RESULTS.md, "The fast tier on the real model"), so auto leaves them off there."""
    from posttrain.configs.serve import FastTierConfig
    from posttrain.serve import tiers

    monkeypatch.setattr(tiers, "draft_cost_ratio", lambda m: ratio)
    engine = tiers.build_fast(model[0], model[1], FastTierConfig(), "lossless", 0)
    assert [d.name for d in engine.drafters] == drafters
