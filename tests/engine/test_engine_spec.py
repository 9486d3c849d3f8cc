"""Speculative decoding in the hf engine: the suffix drafter, the acceptance rule (greedy
identical, sampling exact, the policy's own log-probs), KV-cache rollback and compaction,
acceptance counters and the auto-off rule."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from test_engine_hf import spread_model

from posttrain.configs.engine import EngineConfig, SpeculationConfig
from posttrain.engine import hf as hf_mod
from posttrain.engine.drafter import DraftLength, SuffixIndex, TaskStore
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.engine.kvcache import compact, new_cache, truncate
from posttrain.engine.sampling import sample_next
from posttrain.engine.speculate import (
    CollapseProbe,
    Governor,
    SpecCounters,
    acceptance_row,
    accepted_lengths,
    net_negative,
)
from posttrain.errors import GenerationError
from posttrain.types import GenerationRequest, Message, SamplingParams

REPEATS = ["abcabcabcabc", "hello hello hello", "1 2 3 1 2 3 1 2 3"]


@pytest.fixture(scope="module")
def model_tok():
    return spread_model(0)


def engine(model_tok, kind: str = "suffix", max_draft: int = 6, **kw) -> HFEngine:
    model, tok = model_tok
    spec = SpeculationConfig(kind=kind, max_draft=max_draft, auto_off=kw.pop("auto_off", False))
    return HFEngine(model, tok, config=HFEngineConfig(speculation=spec, **kw), seed=1)


def requests(eng: HFEngine, temperature: float, n: int = 3, max_tokens: int = 24, seed: int = 7, **kw):
    return [
        GenerationRequest(
            eng.encode_chat([Message("user", t)]),
            SamplingParams(max_tokens=max_tokens, temperature=temperature, n=n, seed=seed + i, **kw),
        )
        for i, t in enumerate(REPEATS)
    ]


def twice(eng: HFEngine, reqs):
    """Two calls (the second drafts from the first's completions too), flattened."""
    return [c for call in (eng.generate(reqs), eng.generate(reqs)) for g in call for c in g]


# -- the drafter ---------------------------------------------------------------------------


def test_the_drafter_proposes_what_followed_the_longest_matched_suffix():
    ix = SuffixIndex([1, 2, 3, 9, 9, 5, 2, 3, 7, 7, 7], max_n=4)
    assert ix.propose([0, 2, 3], 2) == [7, 7]  # "2 3" last followed by 7 7 (latest occurrence)
    assert ix.propose([1, 2, 3], 3) == [9, 9, 5]  # the longer suffix "1 2 3" wins over "2 3" (7 7 7)
    assert ix.propose([4, 4], 3) == []  # nothing matches
    assert ix.propose([1, 2, 3], 0) == []


def test_a_short_continuation_is_extended_by_a_shorter_suffix_that_agrees_with_it():
    #                0  1  2  3  4  5  6  7  8
    ix = SuffixIndex([5, 6, 7, 8, 9, 1, 5, 6, 7], max_n=3)
    # "1 5 6" occurred once, followed by 7 and the end; "5 6" also at 0..1, followed by "7 8 9",
    # which begins with that 7: the draft is extended
    assert ix.propose([1, 5, 6], 3) == [7, 8, 9]
    assert ix.propose([1, 5, 6], 3, min_n=3) == [7]  # no shorter suffix below min_n
    ix = SuffixIndex([1, 2, 3, 4, 9, 2, 3, 5], max_n=3)
    assert ix.propose([9, 2, 3], 3) == [5]  # "2 3" is followed by "4 9 2" too, which does not begin with 5
    assert ix.propose([2, 3], 3) == [4, 9, 2]  # the longest continuation among one suffix's occurrences
    assert ix.propose([2, 3], 3, min_n=3) == []


def test_the_drafter_reads_siblings_as_they_grow_and_past_completions():
    ix = SuffixIndex([5, 6], max_n=3)
    a, b = ix.add_sequence(), ix.add_sequence()
    ix.extend(a, [10, 11, 12, 13])
    assert ix.propose([5, 6, 10], 3) == [11, 12, 13]  # b's context (prompt, then 10) follows a
    ix.extend(b, [10, 11])
    assert ix.propose([6, 10, 11], 4) == [12, 13]  # a's continuation, straddling the prompt's end
    store = TaskStore(max_tasks=2, per_task=2, max_len=3)
    store.add([5, 6], [1, 2, 3, 4])
    past = SuffixIndex([5, 6], max_n=3)
    for seq in store.get([5, 6]):
        past.add_sequence(seq)
    assert past.propose([5, 6], 5) == [1, 2, 3]  # cut to max_len


def test_the_task_store_and_the_index_are_bounded():
    store = TaskStore(max_tasks=2, per_task=2, max_len=4)
    for task in range(5):
        for c in range(3):
            store.add([task], list(range(c, c + 10)))
    assert len(store) == 2 and store.tokens() == 2 * 2 * 4
    assert store.get([0]) == () and store.get([4]) == ((1, 2, 3, 4), (2, 3, 4, 5))
    ix = SuffixIndex([1], max_n=3, keep=5)
    for _ in range(50):
        ix.add_sequence([1, 1, 1, 1])
    assert max(len(v) for v in ix._grams.values()) == 5


def test_the_drafter_is_deterministic():
    def build():
        ix = SuffixIndex([3, 1, 4, 1, 5, 9, 2, 6], max_n=4)
        for seq in ([1, 4, 1, 5, 3], [9, 2, 6, 5, 3, 5], [1, 5, 9, 7]):
            ix.add_sequence(seq)
        return [ix.propose(ctx, 4) for ctx in ([1], [1, 5], [5], [9, 2], [6, 5, 3])]

    assert build() == build()


def test_the_draft_length_grows_on_full_acceptance_and_shrinks_on_rejection():
    d = DraftLength(8)
    assert d.value == 4
    d.update(4, 4)
    assert d.value == 8
    d.update(8, 8)
    assert d.value == 8
    d.update(8, 3)
    assert d.value == 4
    d.update(0, 0)  # nothing drafted: unchanged
    assert d.value == 4
    for _ in range(5):
        d.update(1, 0)
    assert d.value == 1


# -- the sampler at per-row steps ------------------------------------------------------------


@pytest.mark.parametrize("vocab", [50, 5000])  # Gumbel-max and inverse CDF
def test_a_tensor_of_steps_draws_what_one_int_step_draws(vocab):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, vocab, generator=g) * 3
    temp = torch.tensor([0.0, 0.7, 1.0, 1.3, 1.0, 0.5])
    top_p = torch.tensor([1.0, 1.0, 0.9, 1.0, 0.5, 1.0])
    keys = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int64) * 977
    for step in (0, 1, 17, 4000):
        t_int, lp_int = sample_next(logits, temp, top_p, keys, step)
        t_ten, lp_ten = sample_next(logits, temp, top_p, keys, torch.full((6,), step, dtype=torch.int64))
        assert torch.equal(t_int, t_ten) and torch.equal(lp_int, lp_ten)


# -- the acceptance rule in the engine -----------------------------------------------------


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_the_rule_accepts_with_probability_p_and_rejects_to_the_residual(temperature, top_p):
    """20,000 rows at one position, draft d = token 2: accepted with frequency p(d) (the tempered,
    nucleus-truncated policy), and the tokens emitted on rejection follow max(0, p - q) normalised,
    q the point mass on d (both within about 5 standard errors)."""
    n, d = 20_000, 2
    logits = torch.tensor([1.0, 0.2, 0.9, -0.5, 0.4, -2.0, 0.0, 0.6]).repeat(n, 1)
    temp, nucleus = torch.full((n,), temperature), torch.full((n,), top_p)
    keys = torch.arange(n, dtype=torch.int64) * 2654435761 % (1 << 32)
    sampled, _ = sample_next(logits, temp, nucleus, keys, torch.full((n,), 5, dtype=torch.int64))
    accepted = accepted_lengths(sampled[:, None], torch.full((n, 1), d), torch.ones((n, 1), dtype=torch.bool))
    p = torch.softmax(logits[0] / temperature, dim=-1)
    order = torch.argsort(p, descending=True)
    kept = (torch.cumsum(p[order], 0) - p[order]) < top_p
    p = torch.zeros_like(p).scatter(0, order[kept], p[order][kept])
    p = p / p.sum()
    rate = accepted.float().mean().item()
    assert abs(rate - p[d].item()) < 5 * math.sqrt(p[d].item() * (1 - p[d].item()) / n)
    residual = p.clone()
    residual[d] = 0.0
    residual = residual / residual.sum()
    emitted = sampled[accepted == 0]
    freq = torch.bincount(emitted, minlength=8).double() / len(emitted)
    assert 0.5 * (freq - residual.double()).abs().sum().item() < 0.02
    assert freq[d] == 0 and (freq[residual == 0] == 0).all()


def test_greedy_speculation_emits_the_plain_tokens_and_log_probs(model_tok):
    plain, spec = engine(model_tok, "off"), engine(model_tok)
    a, b = twice(plain, requests(plain, 0.0)), twice(spec, requests(spec, 0.0))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
    assert [c.text for c in a] == [c.text for c in b]
    assert max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p.logprobs, q.logprobs)) < 1e-5
    counts = spec.counters()
    assert counts["spec_accepted"] > 20 and counts["spec_forwards"] > 0  # it did speculate
    assert spec.stats().forward_calls < plain.stats().forward_calls
    assert plain.counters() == {}  # off: no counters, the metrics row unchanged


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9)])
def test_sampled_speculation_keeps_the_policy_tokens_and_log_probs(model_tok, temperature, top_p):
    """Same seeds, same samples: the accepted tokens are the ones the row's own sampler draws, and
    each log-prob is log_softmax(logits / T) of the emitted token, the behaviour policy's."""
    plain, spec = engine(model_tok, "off"), engine(model_tok)
    a = twice(plain, requests(plain, temperature, top_p=top_p))
    b = twice(spec, requests(spec, temperature, top_p=top_p))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p.logprobs, q.logprobs)) < 1e-5
    counts = spec.counters()
    assert 0 < counts["spec_accepted"] < counts["spec_proposed"]  # accepted and rejected drafts both


def _first_tokens(eng: HFEngine, seeds: range, depth: int) -> Counter[tuple[int, int]]:
    """(position, token) counts over the first `depth` tokens of sampled completions."""
    reqs = [
        GenerationRequest(
            eng.encode_chat([Message("user", "abab abab abab")]),
            SamplingParams(max_tokens=depth, temperature=1.0, n=8, seed=s),
        )
        for s in seeds
    ]
    counts: Counter[tuple[int, int]] = Counter()
    for group in eng.generate(reqs):
        for c in group:
            counts.update((i, t) for i, t in enumerate(c.token_ids[:depth]))
    return counts


def _chi_square_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of homogeneity over the union of cells (cells with fewer than 10
    expected pooled together); the p-value from the Wilson-Hilferty normal approximation."""
    na, nb = sum(a.values()), sum(b.values())
    cells = sorted(set(a) | set(b))
    big = [c for c in cells if a[c] + b[c] >= 10]
    small_a = sum(a[c] for c in cells if c not in big)
    small_b = sum(b[c] for c in cells if c not in big)
    table = [(a[c], b[c]) for c in big] + ([(small_a, small_b)] if small_a + small_b else [])
    stat = 0.0
    for x, y in table:
        tot = x + y
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    k = len(table) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.heavy  # about 3 s: 2 x 800 sampled completions
def test_sampled_speculation_keeps_the_policy_distribution(model_tok, monkeypatch):
    """Token frequencies of speculative samples (seeds 0-99) against plain samples of other seeds
    (1000-1099): the same distribution by a chi-square test; a planted rule that accepts every
    draft shifts it and fails the same test."""
    seeds_spec, seeds_plain = range(100), range(1000, 1100)
    plain = _first_tokens(engine(model_tok, "off"), seeds_plain, 6)
    spec_engine = engine(model_tok, max_draft=4)
    spec = _first_tokens(spec_engine, seeds_spec, 6)
    assert spec_engine.counters()["spec_rows"] > 200  # drafts were verified
    assert _chi_square_p(spec, plain) > 0.01

    real_sample = hf_mod.sample_next

    def accept_every_draft(logits, temp, top_p, keys, step):  # the planted rule: drafts always win
        tokens, lps = real_sample(logits, temp, top_p, keys, step)
        if isinstance(step, torch.Tensor) and len(_DRAFT):
            tokens = torch.where(_DRAFT[0] >= 0, _DRAFT[0], tokens)
        return tokens, lps

    _DRAFT: list[torch.Tensor] = []
    real_forward = HFEngine._forward

    def spy(self, input_ids, mask, positions, cache, keep=1, pixels=None):
        _DRAFT.clear()
        if keep > 1:  # the drafted token at each position, -1 at the last and at padding
            nxt = torch.cat([input_ids[:, 1:], input_ids.new_full((input_ids.shape[0], 1), -1)], dim=1)
            fed = mask[:, -keep:]
            _DRAFT.append(torch.where(torch.cat([fed[:, 1:], fed[:, :1] * 0], dim=1) > 0, nxt, -1).reshape(-1))
        return real_forward(self, input_ids, mask, positions, cache, keep, pixels)

    monkeypatch.setattr(hf_mod, "sample_next", accept_every_draft)
    monkeypatch.setattr(HFEngine, "_forward", spy)
    wrong = _first_tokens(engine(model_tok, max_draft=4), seeds_spec, 6)
    assert _chi_square_p(wrong, plain) < 1e-4


def test_eos_stop_strings_and_max_tokens_inside_an_accepted_run(model_tok):
    plain, spec = engine(model_tok, "off"), engine(model_tok)
    for most, stop in ((5, ()), (40, ("c",))):
        reqs = requests(plain, 1.0, n=3, max_tokens=most, stop=stop)
        a, b = twice(plain, reqs), twice(spec, reqs)
        assert [(c.token_ids, c.text, c.finish_reason) for c in a] == [
            (c.token_ids, c.text, c.finish_reason) for c in b
        ]
        assert all(len(c.token_ids) <= most for c in b)
    assert {c.finish_reason for c in b} == {"stop", "length"}  # eos inside runs, and the length cut


def test_streamed_tokens_are_the_completions_in_order(model_tok):
    spec = engine(model_tok)
    reqs = requests(spec, 1.0, n=3)
    spec.generate(reqs)
    seen: dict[tuple[int, int], list[int]] = {}
    out = spec.generate(reqs, on_tokens=lambda i, j, toks: seen.setdefault((i, j), []).extend(toks))
    assert all(seen[(i, j)] == list(c.token_ids) for i, g in enumerate(out) for j, c in enumerate(g))


def test_small_batches_dropped_rows_and_forced_compaction_change_nothing(model_tok, monkeypatch):
    calls = []
    real = hf_mod.compact

    def counted(cache, mask):
        calls.append(mask.shape)
        return real(cache, mask)

    monkeypatch.setattr(hf_mod, "compact", counted)
    monkeypatch.setattr(hf_mod, "_spec_slack", lambda room, max_draft: max_draft + 1)  # the least room
    plain = engine(model_tok, "off")
    spec = engine(model_tok, max_batch_rows=3, compact_fraction=0.0)  # each finished row dropped at once
    reqs = requests(plain, 1.0, n=4, max_tokens=40)
    assert [c.token_ids for c in twice(plain, reqs)] == [c.token_ids for c in twice(spec, reqs)]
    assert calls  # the holes of rejected drafts were compacted


def test_compact_moves_each_rows_live_columns_right_aligned(model_tok):
    model, _ = model_tok
    cache = new_cache(model.config, 8, 2)
    layer = cache.layers[0]
    k = torch.arange(2 * 2 * 6 * 8, dtype=torch.float32).reshape(2, 2, 6, 8)
    for lyr in cache.layers:
        lyr.update(k.clone(), k.clone() + 1)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0]])
    new = compact(cache, mask)
    assert new.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert torch.equal(layer.keys[0, :, 1:], k[0, :, [1, 2, 4]])
    assert torch.equal(layer.keys[1], k[1, :, :4]) and torch.equal(layer.values[1], k[1, :, :4] + 1)
    truncate(cache, 2)
    assert layer.keys.shape[2] == 2 and cache.get_seq_length() == 2


def test_sessions_kept_under_speculation_resume_the_same(model_tok):
    """A kept session's context (the prompt and the fed output tokens: accepted drafts past a row's
    end excluded) resumes to the same next turn as without speculation."""

    def episode(eng):
        p1 = eng.encode_chat([Message("user", "abcabcabc")])
        first = eng.generate([GenerationRequest(p1, SamplingParams(max_tokens=12, seed=3), sessions=("s",))])
        c = first[0][0]
        p2 = tuple(c.prompt_ids) + tuple(c.token_ids) + eng.encode_chat([Message("user", "abc")])
        second = eng.generate([GenerationRequest(p2, SamplingParams(max_tokens=12, seed=4), sessions=("s",))])
        return c.token_ids, second[0][0].token_ids, second[0][0].cached_tokens

    a, b = episode(engine(model_tok, "off")), episode(engine(model_tok))
    assert a == b and b[2] > 0


# -- counters, metrics and the auto-off rule ------------------------------------------------


def test_counters_per_depth_and_the_metrics_figures():
    c = SpecCounters(3)
    c.add(3, 1)
    c.add(2, 2)
    c.add(1, 0)
    got = c.counters()
    assert (got["spec_rows"], got["spec_proposed"], got["spec_accepted"]) == (3, 6, 3)
    assert [got[f"spec_proposed_d{d}"] for d in (1, 2, 3)] == [3, 2, 1]
    assert [got[f"spec_accepted_d{d}"] for d in (1, 2, 3)] == [2, 1, 0]
    c.drafting = 6  # 3 row-steps drafted, 3 found nothing
    got = c.counters()
    row = acceptance_row({f"engine_{k}": v for k, v in got.items()}, {})
    depths = {"engine_spec_acceptance_d1": round(2 / 3, 4), "engine_spec_acceptance_d2": 0.5}
    depths["engine_spec_acceptance_d3"] = 0.0  # one draft reached depth 3, its third token refused
    assert row == {
        "engine_spec_acceptance": 0.5,
        "engine_spec_accepted_len": 2.0,
        "engine_spec_step_len": 1.5,
        **depths,
    }
    assert acceptance_row(got, got) == {}  # nothing verified in between
    assert acceptance_row({"engine_restarts": 1}, {}) == {}


def test_each_sample_carries_its_own_drafts_and_they_sum_to_the_engines(model_tok):
    """`Completion.spec` (drafts verified, proposed, accepted) per sample: summed over the
    samples it equals the engine's counters; without speculation it is empty."""
    spec = engine(model_tok)
    before = spec.counters()
    comps = twice(spec, requests(spec, 1.0))
    got = spec.counters()
    assert any(c.spec for c in comps)
    totals = [sum(c.spec[k] for c in comps if c.spec) for k in range(3)]
    names = ("spec_rows", "spec_proposed", "spec_accepted")
    assert totals == [got[n] - before.get(n, 0) for n in names]
    assert all(c.spec[2] <= c.spec[1] and c.spec[0] <= c.spec[1] for c in comps if c.spec)
    off = engine(model_tok, "off")
    assert not any(c.spec for c in twice(off, requests(off, 1.0)))


def test_weight_sync_stats_carry_the_acceptance_of_the_last_step(model_tok, tmp_path):
    from posttrain.engine.sync import WeightSync

    spec = engine(model_tok)
    sync = WeightSync(EngineConfig(), spec, trainer=None, run_dir=tmp_path)
    spec.generate(requests(spec, 1.0))
    first = sync.stats()
    assert first["engine_spec_proposed"] > 0 and 1.0 <= first["engine_spec_accepted_len"] <= 7.0
    assert "engine_spec_acceptance" not in sync.stats()  # no generation since: no figures


def test_net_negative_is_tokens_per_step_below_one_plus_overhead():
    assert net_negative(1.2, spec_s=0.015, plain_s=0.010)  # 1.2 tokens for 1.5x the time
    assert not net_negative(2.0, spec_s=0.015, plain_s=0.010)
    assert not net_negative(1.5, spec_s=0.010, plain_s=0.0)  # nothing measured


def test_the_governor_switches_a_losing_bucket_off_and_retries_it():
    gov = Governor(min_steps=4, probe_every=4, retry_every=8)
    for _ in range(40):  # batch of 16 rows: 1.1 tokens for 2x the time
        spec = gov.speculate(16)
        gov.record(16, spec, 0.02 if spec else 0.01, 1.1)
        spec1 = gov.speculate(1)  # batch of 1: 3 tokens for 1.2x the time
        gov.record(1, spec1, 0.012 if spec1 else 0.01, 3.0)
    assert gov.off_buckets() == [16]
    decisions = [gov.speculate(16) for _ in range(16)]
    assert sum(decisions) == 2  # off, but one step in 8 retries speculation
    for _ in range(100):  # it turned positive: back on (measured at the retries only)
        spec = gov.speculate(16)
        gov.record(16, spec, 0.012 if spec else 0.01, 3.0)
    assert gov.off_buckets() == []
    assert Governor(enabled=False).speculate(64)
    warm = Governor(min_steps=3)
    turns = []
    for _ in range(6):  # warming up: speculative and plain steps take turns until each has 3
        turns.append(warm.speculate(8))
        warm.record(8, turns[-1], 0.01, 2.0)
    assert turns == [True, False, True, False, True, False]


def test_auto_off_decodes_plain_where_speculation_loses(model_tok, monkeypatch):
    monkeypatch.setattr("posttrain.engine.speculate.net_negative", lambda gain, spec_s, plain_s: True)
    spec = engine(model_tok, auto_off=True)
    spec._governor = Governor(min_steps=2, probe_every=2)  # decide early
    plain = engine(model_tok, "off")
    reqs = requests(spec, 1.0, n=4, max_tokens=32)
    assert [c.token_ids for c in twice(plain, reqs)] == [c.token_ids for c in twice(spec, reqs)]
    counts = spec.counters()
    assert spec._governor.off_buckets() and counts["spec_off_steps"] > counts["spec_forwards"]


def test_speculation_config_reaches_the_engine_and_rejects_bad_values(model_tok):
    from posttrain.engine.sync import make_engine

    model, tok = model_tok
    cfg = EngineConfig.model_validate({"speculation": {"kind": "suffix", "max_draft": 5}})
    eng = make_engine(cfg, model, tok, seed=0)
    assert eng._spec is not None and eng._spec.max_draft == 5
    assert make_engine(EngineConfig(), model, tok, seed=0)._spec is None  # off by default
    with pytest.raises(ValueError, match="max_draft"):
        EngineConfig.model_validate({"speculation": {"kind": "suffix", "max_draft": 0}})
    with pytest.raises(ValueError, match="kind"):
        EngineConfig.model_validate({"speculation": {"kind": "eagle"}})


def test_the_collapse_probe_fails_loudly_below_its_running_level():
    probe = CollapseProbe(drop=0.3, warmup=3)
    for figure in (1.0, 3.0, 3.2, 2.9, None, 3.1, 2.4, 2.2):  # a slow drift and a no-draft step pass
        probe.observe(figure)
    level = probe.level
    with pytest.raises(GenerationError, match=r"1\.500 tokens .* more than 30% below its running level 2\.") as err:
        probe.observe(1.5, " after push 9")
    assert "after push 9" in str(err.value) and probe.level == level
    early = CollapseProbe(warmup=3)
    early.observe(4.0)
    early.observe(1.0)  # during the warm-up: no verdict


def test_the_collapse_probe_with_counts_stops_only_beyond_counting_noise():
    """Given the drafting row-steps a figure was measured over, a fall must also exceed three
    Poisson standard deviations of the accepted tokens: a fall from 1.5 to 1.0 (a third) measured
    on 8 row-steps (the embedded demo's short answers) passes; the same over 400 stops the run."""
    few, many = CollapseProbe(warmup=3), CollapseProbe(warmup=3)
    for figure in (1.5, 1.5, 1.5, 1.5):
        few.observe(figure, rows=8)
        many.observe(figure, rows=400)
    few.observe(1.0, rows=8)  # 8 x 0.5 = 4 tokens short, 3 sd = 6: noise
    with pytest.raises(GenerationError, match=r"1\.000 tokens per row per drafting step over 400 drafting row-steps"):
        many.observe(1.0, " at the probe after push 5", rows=400)


def test_a_wiped_drafter_after_a_push_fails_the_run_with_both_figures(model_tok, tmp_path, monkeypatch):
    from posttrain.engine.sync import WeightSync

    spec = engine(model_tok)
    cfg = EngineConfig.model_validate({"speculation": {"kind": "suffix", "collapse_check": True}})
    sync = WeightSync(cfg, spec, trainer=None, run_dir=tmp_path)
    reqs = requests(spec, 0.0)
    for _ in range(4):
        spec.generate(reqs)
        healthy = sync.stats()["engine_spec_step_len"]
    assert healthy > 1.5
    monkeypatch.setattr(spec, "_draft", lambda *a: [])  # the planted wipe: nothing is drafted any more
    spec.generate(reqs)
    with pytest.raises(GenerationError, match=r"collapsed after push 0: 1\.000 tokens"):
        sync.stats()
    assert WeightSync(EngineConfig(), spec, trainer=None, run_dir=tmp_path)._collapse is None  # off by default


def test_speculation_the_vllm_and_openai_engines_cannot_run_is_refused(tmp_path):
    """vLLM cannot load posttrain's draft head, an attached server's speculative config is not
    posttrain's to set, and an openai server drafts by its own settings: each a config error, never
    a silently ignored setting (before, engine.speculation was read by the hf engine only)."""
    from posttrain.configs.engine import EngineConfig, SpeculationConfig
    from posttrain.engine.vllm import VLLMServer, speculative_config
    from posttrain.errors import ConfigError

    for bad, words in (
        ({"kind": "vllm", "speculation": {"kind": "head"}}, "cannot load"),
        ({"kind": "vllm", "url": "http://h:1", "speculation": {"kind": "suffix"}}, "attaches to"),
        ({"kind": "openai", "url": "http://h:1", "speculation": {"kind": "suffix"}}, "hf and vllm"),
    ):
        with pytest.raises(ValueError, match=words):
            EngineConfig.model_validate(bad)
    ok = EngineConfig.model_validate({"kind": "vllm", "speculation": {"kind": "suffix", "max_draft": 5}})
    assert speculative_config(ok.speculation) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 8,
        "prompt_lookup_min": 2,
    }
    with pytest.raises(ConfigError, match="vLLM can draft"):
        VLLMServer(tmp_path, tmp_path, speculation=SpeculationConfig(kind="head"))
