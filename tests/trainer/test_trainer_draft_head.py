"""trainer.draft_head: the head fits the step's rollouts without touching the policy's update,
and travels with checkpoints, resumes and exports."""

from __future__ import annotations

import torch

from posttrain.cli import main
from posttrain.configs.trainer import DraftHeadConfig, TrainerConfig
from posttrain.model.arch import random_model
from posttrain.model.draft_head import META, WEIGHTS, DraftHead, has_head, load
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import DRAFT_OPTIMIZER, Trainer


def _batch(step: int) -> TrainBatch:
    """Two groups of 4 with reward variance; completions repeat a pattern the head can learn."""
    rows = []
    for k in range(8):
        comp = tuple(40 + (step + k + j) % 6 for j in range(7))
        rows.append(TrainRow((4, 30, 31 + k % 2), comp, (-3.0,) * 7, float(k % 2), f"g{k // 4}", (1,) * 7))
    return TrainBatch(tuple(rows))


def _trainer(head: bool, depth: int = 3) -> Trainer:
    model, _ = random_model("micro", 5)
    return Trainer(model, TrainerConfig(lr=1e-2, draft_head=DraftHeadConfig(enabled=head, depth=depth, lr=3e-2)))


def test_the_policy_update_is_bit_identical_with_and_without_the_head():
    on, off = _trainer(True), _trainer(False)
    before = {k: v.clone() for k, v in on.draft_head.state_dict().items()}
    for step in range(3):
        assert on.step(_batch(step)).outcome == off.step(_batch(step)).outcome == "applied"
    for (name, a), b in zip(on.model.named_parameters(), off.model.parameters()):
        assert torch.equal(a, b), f"{name} differs with the draft head on"
    assert any(not torch.equal(before[k], v) for k, v in on.draft_head.state_dict().items())  # the head trained
    assert len(on.draft_acc) == 3


def test_the_head_learns_the_rollouts_next_tokens():
    model, _ = random_model("micro", 5)
    trainer = Trainer(model, TrainerConfig(lr=1e-3, draft_head=DraftHeadConfig(enabled=True, depth=2, lr=0.1)))
    first = trainer.step(_batch(0)).draft_acc
    assert list(first) == [round(a, 4) for a in trainer.draft_acc]  # the step's stats carry it (the metrics row)
    for step in range(1, 20):
        last = trainer.step(_batch(step))
    assert first[0] < 0.5 and trainer.draft_acc == [1.0, 1.0]  # the pattern (a cycle of 6) is learned
    assert last.draft_acc == (1.0, 1.0)
    assert _trainer(False).step(_batch(0)).draft_acc == ()  # no head: nothing to report


def test_the_head_is_saved_restored_and_exported(tmp_path):
    trainer = _trainer(True)
    tok = random_model("micro", 5)[1]
    trainer.step(_batch(0))
    ckpt = trainer.save(tmp_path / "run", tok, {})
    for name in (WEIGHTS, META, DRAFT_OPTIMIZER):
        assert (ckpt / name).is_file(), name
    saved = {k: v.clone() for k, v in trainer.draft_head.state_dict().items()}
    trainer.step(_batch(1))  # moves away from the checkpoint
    fresh = _trainer(True)
    fresh.resume(ckpt)
    for k, v in fresh.draft_head.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert fresh._draft_opt.state_dict()["state"]  # the moments came back too
    # the resumed pair takes the same next step as the original did from the checkpoint
    twin = _trainer(True)
    twin.resume(ckpt)
    fresh.step(_batch(1))
    twin.step(_batch(1))
    for a, b in zip(fresh.draft_head.parameters(), twin.draft_head.parameters()):
        assert torch.equal(a, b)
    assert main(["export", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    assert has_head(tmp_path / "out") and not (tmp_path / "out" / DRAFT_OPTIMIZER).exists()
    exported = load(tmp_path / "out", hidden=trainer.draft_head.hidden)
    for k, v in exported.state_dict().items():
        assert torch.equal(v, saved[k]), k


def test_the_head_counts_the_tokens_it_fits_for_its_draft_vocabulary():
    """trainer.draft_head.vocab: every loss token the head is fitted on is counted (the draft
    vocabulary is their most frequent); counting leaves the policy's update alone (above)."""
    trainer = Trainer(random_model("micro", 5)[0], TrainerConfig(draft_head=DraftHeadConfig(enabled=True, vocab=3)))
    assert trainer.draft_head.vocab_top == 3 and trainer.draft_head.counts.numel() == 0
    trainer.step(_batch(0))
    counts = trainer.draft_head.counts
    expected = torch.zeros_like(counts)
    for row in _batch(0).rows:
        for t in row.completion_ids:
            expected[t] += 1
    assert torch.equal(counts, expected)
    ids, rows = trainer.draft_head.draft_vocab(trainer.model.get_output_embeddings().weight.detach())
    assert len(ids) == 3 and set(ids.tolist()) <= set(torch.nonzero(expected).flatten().tolist())
    assert rows.shape == (3, trainer.draft_head.hidden)


def test_more_passes_fit_the_head_faster_and_leave_the_policy_update_alone():
    """trainer.draft_head.passes: head-only passes over the step's saved hidden states."""

    def run(passes: int | None) -> Trainer:
        head = DraftHeadConfig(enabled=passes is not None, depth=2, lr=3e-3, passes=passes or 1)
        trainer = Trainer(random_model("micro", 5)[0], TrainerConfig(lr=1e-2, draft_head=head))
        for step in range(4):
            assert trainer.step(_batch(step)).outcome == "applied"
        return trainer

    one, four, off = run(1), run(4), run(None)
    for (name, a), b, c in zip(four.model.named_parameters(), one.model.parameters(), off.model.parameters()):
        assert torch.equal(a, b) and torch.equal(a, c), f"{name} differs with head passes"
    assert not four._draft_kept  # released after the step
    assert four.step(_batch(4)).draft_acc[0] > one.step(_batch(4)).draft_acc[0]


def test_the_head_is_fitted_over_its_draft_vocabulary_and_a_target_outside_is_left_out():
    torch.manual_seed(0)
    head = DraftHead(16, depth=1, vocab_top=2)
    embed, lm = torch.randn(10, 16), torch.randn(10, 16)
    target = torch.tensor([3, 3, 3, 5, 5, 7, 3, 5])  # 3 and 5 the most frequent: 7 is outside
    hidden = torch.randn(len(target), 16)
    row, col = torch.zeros(8, dtype=torch.long), torch.arange(8)
    loss, acc = head.fit_loss(hidden, target, row, col, embed, lm)
    ids = head.draft_vocab(lm)[0]
    assert sorted(ids.tolist()) == [3, 5]
    logits = head.logits(head.step(hidden[:-1], target[:-1], embed), lm[ids])
    label = target[1:]
    inside = label != 7
    sub = (label == ids[1]).long()  # index in ids: 0 for ids[0], 1 for ids[1]
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits[inside], sub[inside]))
    assert acc == [float((ids[logits.argmax(-1)] == label).float().mean())]  # 7 can only count wrong
    assert int(head.counts.sum()) == 8
    head.fit_loss(hidden, target, row, col, embed, lm, count=False)
    assert int(head.counts.sum()) == 8  # a further pass counts nothing
