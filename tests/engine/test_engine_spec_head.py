"""speculation.kind head: the hf engine drafts with the co-trained draft head; outputs are the
policy's own (greedy identical, sampled tokens and log-probs identical for the same seeds); a
head wiped or left stale after a push is caught by the push probe; a pushed folder's head replaces it."""

from __future__ import annotations

import pytest
import torch
from test_engine_hf import spread_model

from posttrain.configs.engine import EngineConfig, SpeculationConfig
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.errors import ConfigError, GenerationError, ModelLoadError
from posttrain.model.draft_head import DraftHead, load, policy_tables
from posttrain.types import GenerationRequest, Message, SamplingParams

PROMPTS = ["abcabc", "hello", "1 2 3", "xyz", "sort 3 1 2"]


@pytest.fixture(scope="module")
def model_tok():
    return spread_model(0)


def requests(eng: HFEngine, temperature: float = 0.0, n: int = 2, max_tokens: int = 24):
    return [
        GenerationRequest(
            eng.encode_chat([Message("user", t)]),
            SamplingParams(max_tokens=max_tokens, temperature=temperature, n=n, seed=3 + i),
        )
        for i, t in enumerate(PROMPTS)
    ]


def engine(model_tok, head, kind: str = "head", **kw) -> HFEngine:
    model, tok = model_tok
    spec = SpeculationConfig(kind=kind, max_draft=4, auto_off=False, **kw)
    return HFEngine(model, tok, config=HFEngineConfig(speculation=spec), seed=1, draft_head=head)


@pytest.fixture(scope="module")
def fitted(model_tok):
    """A head fitted (as trainer.draft_head fits it) to the model's own greedy completions."""
    model, _ = model_tok
    plain = engine(model_tok, None, "off")
    comps = [c for g in plain.generate(requests(plain)) for c in g]
    head = DraftHead(model.config.hidden_size, depth=4, seed=0)
    opt = torch.optim.AdamW(head.parameters(), lr=6e-2)
    embed_vh, lm_vh = policy_tables(model)
    ids = [list(c.prompt_ids) + list(c.token_ids) for c in comps]
    hidden, target, row, col = [], [], [], []
    with torch.no_grad():
        for r, (c, seq) in enumerate(zip(comps, ids)):
            h = model.get_decoder()(input_ids=torch.tensor([seq])).last_hidden_state[0]
            p = len(c.prompt_ids)
            hidden.append(h[p - 1 : len(seq) - 1])
            target.append(torch.tensor(seq[p:]))
            row += [r] * (len(seq) - p)
            col += list(range(len(seq) - p))
    args = (torch.cat(hidden), torch.cat(target), torch.tensor(row), torch.tensor(col), embed_vh, lm_vh)
    for _ in range(50):
        loss, acc = head.fit_loss(*args)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert acc[0] > 0.9
    return head.eval()


def test_greedy_outputs_are_identical_with_the_head_drafting(model_tok, fitted):
    plain, spec = engine(model_tok, None, "off"), engine(model_tok, fitted)
    a = [c for g in plain.generate(requests(plain)) for c in g]
    b = [c for g in spec.generate(requests(spec)) for c in g]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p.logprobs, q.logprobs)) < 1e-5
    counts = spec.counters()
    assert counts["spec_accepted_d1"] > 0.8 * counts["spec_proposed_d1"]  # the fitted head drafts well
    assert spec.stats().forward_calls < 0.6 * plain.stats().forward_calls


def test_sampled_tokens_and_log_probs_are_the_policys_with_a_random_head(model_tok):
    head = DraftHead(model_tok[0].config.hidden_size, depth=4, seed=5)
    plain, spec = engine(model_tok, None, "off"), engine(model_tok, head)
    a = [c for g in plain.generate(requests(plain, 1.0)) for c in g]
    b = [c for g in spec.generate(requests(spec, 1.0)) for c in g]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p.logprobs, q.logprobs)) < 1e-5
    assert spec.counters()["spec_proposed"] > 0


def pushes(model_tok, head, tmp_path, n: int = 4, **spec):
    """An engine drafting with `head`, its WeightSync (collapse_check at its default unless given),
    one generate (the probe's prompts) and `n` pushes; returns both and each push's probe row."""
    from posttrain.engine.sync import WeightSync

    eng = engine(model_tok, head)
    cfg = EngineConfig.model_validate({"speculation": {"kind": "head", **spec}})
    sync = WeightSync(cfg, eng, trainer=None, run_dir=tmp_path)
    eng.generate(requests(eng))
    rows = []
    for _ in range(n):
        sync.push()
        rows.append(sync.stats())
    return eng, sync, rows


def test_a_head_wiped_after_a_push_fails_the_run_with_both_figures(model_tok, fitted, tmp_path):
    """The push probe (on by default with kind head): greedy on the first prompts the engine saw,
    after every push; a head whose weights are zeroed before a push stops the run at that push."""
    head = DraftHead(fitted.hidden, fitted.depth)
    head.load_state_dict(fitted.state_dict())
    eng, sync, rows = pushes(model_tok, head, tmp_path)
    healthy = [row["engine_probe_spec_step_len"] for row in rows]
    assert min(healthy) > 2.0 and len(set(healthy)) == 1  # the same weights: the same greedy figure
    assert rows[0]["engine_probe_spec_accepted_len"] > 2.0 and "engine_probe_spec_acceptance_d1" in rows[0]
    told: list = []  # what the loop writes as `spec_probe` trace events
    sync.attach_spec(lambda message, figures: told.append((message, figures)))
    sync.push()
    with torch.no_grad():  # the planted wipe: the pushed head's weights are zeros
        for p in head.parameters():
            p.zero_()
    with pytest.raises(GenerationError, match=r"collapsed at the probe after push 6: 1\.0\d\d tokens .* level 2\."):
        sync.push()
    (ok, fine), (stop, fell) = told
    assert ok == "push probe after push 5" and (fine["push"], fine["stopped"]) == (5.0, 0.0)
    assert fine["engine_probe_spec_step_len"] == healthy[0] and fine["level"] == pytest.approx(healthy[0])
    assert "collapsed at the probe after push 6" in stop and (fell["push"], fell["stopped"]) == (6.0, 1.0)
    assert fell["engine_probe_spec_step_len"] < 0.7 * fell["level"]


def test_a_stale_head_after_the_policy_moved_fails_the_run(model_tok, fitted, tmp_path):
    """A head left behind by its policy (fitted to weights the policy no longer has: the planted
    change moves every weight of the policy, the head is not refitted) drafts what the old policy
    would have said; the probe after that push sees its accepted length fall and stops the run."""
    import copy

    model, tok = model_tok
    moved = copy.deepcopy(model)
    head = DraftHead(fitted.hidden, fitted.depth)
    head.load_state_dict(fitted.state_dict())
    eng, sync, rows = pushes((moved, tok), head, tmp_path)
    assert min(row["engine_probe_spec_step_len"] for row in rows) > 2.0
    with torch.no_grad():  # the policy moves in place (an optimizer step would), the head stays
        gen = torch.Generator().manual_seed(0)
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std())
    with pytest.raises(GenerationError, match=r"collapsed at the probe after push 5"):
        sync.push()


def test_the_push_probe_leaves_the_runs_figures_and_samples_alone(model_tok, fitted, tmp_path):
    """spec_probe restores the engine's counters, statistics and governor, adds nothing to the
    draft store and draws nothing from the engine's generator: the samples after it are the ones
    an engine that never probed draws."""
    a, b = engine(model_tok, fitted), engine(model_tok, fitted)
    reqs = [GenerationRequest(r.prompt_ids, replace_seed(r.params)) for r in requests(a, 1.0)]
    a.generate(reqs), b.generate(reqs)
    before = (a.counters(), a.stats(), len(a._store), a._governor.buckets)
    got = a.spec_probe()
    assert got["spec_step_len"] > 1.0 and a._probe_prompts == [
        r.prompt_ids for r in reqs
    ]  # 5 prompts, fewer than PROBE_PROMPTS
    assert (a.counters(), a.stats(), len(a._store), a._governor.buckets) == before
    assert [c.token_ids for g in a.generate(reqs) for c in g] == [c.token_ids for g in b.generate(reqs) for c in g]
    assert engine(model_tok, fitted).spec_probe() == {}  # no prompt seen yet: nothing to probe


def test_the_probe_keeps_the_fewest_prompts_that_give_its_row_steps_and_fixes_them(model_tok, fitted, monkeypatch):
    """The first probe measures all its prompts and keeps the fewest, in order, that give about
    PROBE_ROW_STEPS drafting row-steps; prompts generated for after it never join."""
    import posttrain.engine.hf as hf

    eng = engine(model_tok, fitted)
    eng.generate(requests(eng))
    prompts = list(eng._probe_prompts)
    everything = eng.spec_probe()["spec_drafting"]  # all 5 (PROBE_ROW_STEPS 128 is more than they give)
    assert eng._probe_prompts == prompts and everything < 128
    fresh = engine(model_tok, fitted)
    fresh.generate(requests(fresh))
    monkeypatch.setattr(hf, "PROBE_ROW_STEPS", everything // 2)
    got = fresh.spec_probe()
    keep = -(-len(prompts) * (everything // 2) // everything)
    assert 1 <= keep < len(prompts) and fresh._probe_prompts == prompts[:keep]
    assert got["spec_drafting"] < everything
    fresh.generate([GenerationRequest(fresh.encode_chat([Message("user", "new")]), SamplingParams(max_tokens=4))])
    assert fresh._probe_prompts == prompts[:keep]  # fixed since the first probe


def replace_seed(params: SamplingParams) -> SamplingParams:
    """The same sampling with no seed: the engine draws one from its own generator."""
    from dataclasses import replace

    return replace(params, seed=None)


def test_the_collapse_check_defaults_on_for_a_head_and_off_for_the_model_free_drafter(model_tok, fitted, tmp_path):
    from posttrain.engine.sync import WeightSync

    def check(kind: str, **spec):
        cfg = EngineConfig.model_validate({"speculation": {"kind": kind, **spec}})
        return WeightSync(cfg, engine(model_tok, fitted, kind), trainer=None, run_dir=tmp_path)._collapse

    assert check("head") is not None and check("suffix") is None
    assert check("head", collapse_check=False) is None and check("suffix", collapse_check=True) is not None
    _, _, rows = pushes(model_tok, fitted, tmp_path, n=1, collapse_check=False)
    assert not any(k.startswith("engine_probe_") for k in rows[0])  # off: no probe runs


def test_a_pushed_folder_with_a_head_replaces_the_engines_head(model_tok, fitted, tmp_path):
    model, tok = model_tok
    model.save_pretrained(tmp_path / "m")
    fitted.save(tmp_path / "m")
    spec = engine(model_tok, DraftHead(fitted.hidden, fitted.depth, seed=9))
    spec.update_weights(str(tmp_path / "m"))
    for a, b in zip(spec.draft_head.parameters(), fitted.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(next(load(tmp_path / "m").parameters()), next(fitted.parameters()))


def test_head_speculation_without_a_head_is_a_config_error(model_tok):
    with pytest.raises(ConfigError, match="no draft head"):
        engine(model_tok, None)


def test_a_draft_vocabulary_drafts_only_its_tokens_and_changes_no_output(model_tok, fitted):
    """vocab_top: the head drafts over the most frequent fitted tokens only (a token outside is
    left to the target), so greedy outputs and log-probs stay plain decoding's; over a vocabulary
    that holds every token (ranked by frequency, not by id) it drafts what the whole vocabulary drafts."""
    model, _ = model_tok
    embed_vh, lm_vh = policy_tables(model)
    assert int((fitted.counts > 0).sum()) > 4  # the fixture's fit counted its targets
    small = DraftHead(fitted.hidden, fitted.depth, vocab_top=2)
    small.load_state_dict(fitted.state_dict())
    ids, rows = small.draft_vocab(lm_vh)
    assert torch.equal(ids, torch.topk(fitted.counts, 2).indices) and torch.equal(rows, lm_vh[ids])
    hidden, last = torch.randn(6, fitted.hidden), torch.arange(6)
    assert set(small.draft(hidden, last, 4, embed_vh, lm_vh).flatten().tolist()) <= set(ids.tolist())
    whole = DraftHead(fitted.hidden, fitted.depth, vocab_top=lm_vh.shape[0])
    whole.load_state_dict(fitted.state_dict())
    assert len(whole.draft_vocab(lm_vh)[0]) == int((fitted.counts > 0).sum())
    whole.count(torch.arange(lm_vh.shape[0]), lm_vh.shape[0])  # every token counted: the whole vocabulary, reordered
    seq = torch.tensor([c for c in fitted.counts.nonzero().flatten().tolist()][:6])
    h = model.get_decoder()(input_ids=seq[None]).last_hidden_state[0]
    assert torch.equal(whole.draft(h, seq, 4, embed_vh, lm_vh), fitted.draft(h, seq, 4, embed_vh, lm_vh))
    plain, spec = engine(model_tok, None, "off"), engine(model_tok, small)
    a = [c for g in plain.generate(requests(plain)) for c in g]
    b = [c for g in spec.generate(requests(spec)) for c in g]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p.logprobs, q.logprobs)) < 1e-5


def test_the_draft_vocabulary_follows_new_counts_and_an_lm_head_changed_in_place(fitted):
    head = DraftHead(fitted.hidden, fitted.depth, vocab_top=1)
    head.load_state_dict(fitted.state_dict())
    lm = torch.randn(len(fitted.counts), fitted.hidden)
    first, rows = head.draft_vocab(lm)
    rare = int(torch.argmin(fitted.counts + (fitted.counts == 0) * 10**9))  # a counted token, the least
    head.count(torch.full((10**6,), rare), len(lm))  # now the most frequent
    assert head.draft_vocab(lm)[0].tolist() == [rare] != first.tolist()
    with torch.no_grad():
        lm.mul_(2.0)  # a weight update in place (a full fine-tune's push)
    assert torch.equal(head.draft_vocab(lm)[1], lm[[rare]])


def test_a_head_saved_before_the_draft_vocabulary_loads_and_drafts_over_all(fitted, tmp_path):
    import json

    fitted.save(tmp_path)
    state = torch.load(tmp_path / "draft_head.pt", weights_only=True)
    del state["counts"]
    torch.save(state, tmp_path / "draft_head.pt")
    meta = json.loads((tmp_path / "draft_head.json").read_text())
    del meta["vocab_top"]
    (tmp_path / "draft_head.json").write_text(json.dumps(meta))
    old = load(tmp_path, fitted.hidden)
    lm = torch.randn(len(fitted.counts), fitted.hidden)
    assert old.vocab_top == 0 and old.counts.numel() == 0 and old.draft_vocab(lm)[0] is None
    torch.save({**state, "counts": "not counts"}, tmp_path / "draft_head.pt")
    with pytest.raises(ModelLoadError, match="no readable draft head"):
        load(tmp_path, fitted.hidden)
