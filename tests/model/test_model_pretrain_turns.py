"""Multi-turn transcripts in the embedded base's pretraining, and the default demo's base unchanged."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import yaml

from posttrain.configs.base import BaseConfig
from posttrain.domains.registry import get
from posttrain.model.bugs import TURN_BUGS
from posttrain.model.pretrain import _encode, _encode_batch, _examples, default_dir, transcript
from posttrain.model.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_default_demo_base_is_unchanged():
    """The cache key and the first pretraining batches of configs/default.yaml's base, as on main before
    multi-turn transcripts were added (recorded from that main, 5 batches of 64)."""
    cfg = BaseConfig(**yaml.safe_load((ROOT / "configs/default.yaml").read_text())["base"])
    tok = build_tokenizer()
    batches = _examples(cfg, random.Random(cfg.seed))
    digest = hashlib.sha256()
    for _ in range(5):
        for tensor in _encode_batch(tok, batches(64)):
            digest.update(tensor.numpy().tobytes())
    assert default_dir(cfg).name == "base-tiny-2cbcfbbe2d08"
    assert digest.hexdigest()[:16] == "2d5562795af5ef67"


def test_transcripts_render_through_the_chat_template_with_loss_on_actions_only():
    domain, tok = get("lookup"), build_tokenizer()
    task = domain.sample(3, "train", 1)
    key, value = task.reference["key"], task.reference["value"]
    messages = transcript(domain, task)
    assert messages == [
        ("user", task.prompt[-1].content),
        ("assistant", f"look:{key}"),
        ("tool", f"{key}={value}"),
        ("assistant", value),
    ]
    ids, mask = _encode(tok, messages)
    text = tok.decode(ids)
    assert text == tok.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=False)
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == f"look:{key}<|end|>{value}<|end|>"


def test_buggy_policy_is_wrong_in_two_ways_and_never_passes():
    domain, bug = get("lookup"), TURN_BUGS["lookup"]
    kinds = set()
    for i in range(40):
        task = domain.sample(i, "train", 1)
        messages = transcript(domain, task, bug)
        kinds.add("ignores the tool" if len(messages) == 2 else "miscopies")
        from posttrain.types import Episode, Turn

        actions = [c for r, c in messages if r == "assistant"]
        episode = Episode(actions[-1], tuple(Turn(a) for a in actions))
        palindrome = task.reference["value"] == task.reference["value"][::-1]
        assert domain.score(task, episode).passed == (palindrome and len(actions) == 2)
    assert kinds == {"ignores the tool", "miscopies"}


def test_a_pooled_domain_plays_each_transcript_once_and_reuses_it(monkeypatch):
    """`Domain.pretrain_pool`: the corpus draws its transcripts from N train tasks (each gold or
    buggy as drawn), plays each (slot, level, buggy) once through the environment, and an unpooled
    domain's corpus is untouched by the pool."""
    import posttrain.model.pretrain as pretrain

    lookup = get("lookup")
    cfg = BaseConfig(domains={"lookup": 1}, buggy_fraction=0.5)
    fresh = _examples(cfg, random.Random(7))(40)
    assert len({str(c) for c in fresh}) > 30  # unpooled: a new task per example

    played = []
    real = pretrain.transcript

    def counting(domain, task, bug=None):
        played.append((task.id, bug is not None))
        return real(domain, task, bug)

    monkeypatch.setattr(pretrain, "transcript", counting)
    monkeypatch.setattr(pretrain, "_POOL", {})
    monkeypatch.setattr(type(lookup), "pretrain_pool", 3)
    corpus = _examples(cfg, random.Random(7))(60) + _examples(cfg, random.Random(8))(60)
    assert len(played) == len(set(played)) <= 3 * 2  # slots x (gold, buggy), each played once
    assert {tid for tid, _ in played} <= {lookup.sample(k, "train", 1).id for k in range(3)}
    assert len({str(c) for c in corpus}) == len(played) and len(played) >= 4
    assert any(b for _, b in played) and not all(b for _, b in played)
