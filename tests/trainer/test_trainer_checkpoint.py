"""Checkpoints: HF-format round trip, exact resume, pruning, atomicity, manifests, leftovers of
interrupted writes, clear errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from trainer_testlib import optimizer_tensors, params_of, same_params, synthetic_batch, tiny_model

from posttrain.configs.trainer import GuardConfig, TrainerConfig
from posttrain.errors import TrainerError
from posttrain.model.tokenizer import build_tokenizer
from posttrain.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from posttrain.trainer.trainer import Trainer


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip(tmp_path, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny_model(0, tied=tied), build_tokenizer()
    trainer = Trainer(model, TrainerConfig())
    trainer.step(synthetic_batch(seed=1))
    path = save_checkpoint(tmp_path, model, tok, trainer.optimizer, {"step": 1, "note": "x"}, step=1)
    names = {p.name for p in path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "optimizer.pt",
        "rng.pt",
        "loop_state.json",
        "meta.json",
    } <= names
    other = tiny_model(7, tied=tied)
    other_trainer = Trainer(other, TrainerConfig())
    ckpt = load_checkpoint(tmp_path, other, other_trainer.optimizer)
    assert (ckpt.path, ckpt.step, ckpt.loop_state) == (path, 1, {"step": 1, "note": "x"})
    assert same_params(params_of(model), params_of(other))
    assert same_params(optimizer_tensors(trainer.optimizer), optimizer_tensors(other_trainer.optimizer))
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)  # a plain HF model directory
    assert same_params(params_of(model), params_of(hf))
    assert AutoTokenizer.from_pretrained(path, local_files_only=True).encode("ab=") == tok.encode("ab=")


def test_resume_continues_exactly(tmp_path):
    config = TrainerConfig(micro_batch_size=5, guard=GuardConfig(min_history=1))
    straight = Trainer(tiny_model(0), config)
    for step in range(4):
        straight.step(synthetic_batch(seed=step))
    after_straight = (torch.rand(3), random.random(), np.random.rand())

    first = Trainer(tiny_model(0), config)
    for step in range(2):
        first.step(synthetic_batch(seed=step))
    first.save(tmp_path, build_tokenizer(), {"cursor": 2})
    torch.rand(5), random.random(), np.random.rand()  # disturb every RNG after the save

    resumed = Trainer(tiny_model(123), config)
    assert resumed.resume(tmp_path) == {"cursor": 2}
    for step in range(2, 4):
        resumed.step(synthetic_batch(seed=step))
    assert same_params(params_of(straight.model), params_of(resumed.model))
    assert same_params(optimizer_tensors(straight.optimizer), optimizer_tensors(resumed.optimizer))
    assert straight.state_dict() == resumed.state_dict()
    after_resumed = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(after_straight[0], after_resumed[0]) and after_straight[1:] == after_resumed[1:]


def test_a_resume_takes_the_optimizer_state_and_the_configured_learning_rate(tmp_path):
    """`train --resume RUN trainer.lr=...`: the moments and step counts come from the checkpoint,
    the learning rate from the resumed trainer's config (the checkpoint's would win otherwise)."""
    first = Trainer(tiny_model(0), TrainerConfig(lr=3e-4))
    first.step(synthetic_batch(seed=0))
    first.save(tmp_path, build_tokenizer(), {})
    lower = Trainer(tiny_model(5), TrainerConfig(lr=1e-4))
    lower.resume(tmp_path)
    assert [g["lr"] for g in lower.optimizer.param_groups] == [1e-4]
    assert same_params(optimizer_tensors(first.optimizer), optimizer_tensors(lower.optimizer))


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig(keep_checkpoints=2))
    for _ in range(4):
        trainer.step(synthetic_batch(seed=trainer.steps))
        trainer.save(tmp_path, None)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert latest_checkpoint(tmp_path).name == "step_00000004"
    assert json.loads((latest_checkpoint(tmp_path) / "loop_state.json").read_text())["trainer"]["steps"] == 4


def test_a_prune_cut_while_deleting_leaves_no_half_checkpoint_under_its_name(tmp_path, monkeypatch):
    """A crash while an old checkpoint is deleted (here: the delete fails after removing one file)
    leaves it under a `.tmp-*` name, which the next resume removes, never a half-deleted
    `step_*` folder that only a manifest check would tell from a whole one."""
    import shutil

    from posttrain.trainer.checkpoint import clean_leftovers, prune_checkpoints

    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig())
    for step in (1, 2):
        save_checkpoint(tmp_path, model, None, trainer.optimizer, {}, step=step)

    def cut(path):
        (path / "optimizer.pt").unlink()
        raise OSError("killed")

    monkeypatch.setattr(shutil, "rmtree", cut)
    with pytest.raises(OSError, match="killed"):
        prune_checkpoints(tmp_path, keep=1)
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[-1] == "step_00000002" and names[0].startswith(".tmp-step_00000001-") and len(names) == 2
    said = []
    clean_leftovers(tmp_path, said.append)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000002"] and len(said) == 1


class _FailingTokenizer:
    def save_pretrained(self, path):
        raise OSError("disk full")


def test_a_failed_save_leaves_no_trace(tmp_path):
    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig())
    first = save_checkpoint(tmp_path, model, None, trainer.optimizer, {}, step=1)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, model, _FailingTokenizer(), trainer.optimizer, {}, step=2)
    with pytest.raises(TrainerError, match="JSON"):
        save_checkpoint(tmp_path, model, None, trainer.optimizer, {"bad": object()}, step=3)
    assert latest_checkpoint(tmp_path) == first
    assert sorted(p.name for p in first.parent.iterdir()) == ["step_00000001"]


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(TrainerError, match="no checkpoint"):
        load_checkpoint(tmp_path, tiny_model(0))
    model = tiny_model(0)
    save_checkpoint(tmp_path, model, None, Trainer(model, TrainerConfig()).optimizer, {}, step=0)
    with pytest.raises(TrainerError, match="does not fit"):
        load_checkpoint(tmp_path, tiny_model(0).model)  # keys differ (no lm_head, no "model." prefix)
    from transformers import AutoModelForCausalLM

    wider = AutoModelForCausalLM.from_config(model.config.__class__(**{**model.config.to_dict(), "hidden_size": 64}))
    with pytest.raises(TrainerError, match="does not fit"):
        load_checkpoint(tmp_path, wider)  # same keys, other shapes
    with pytest.raises(TrainerError, match="trainer state"):
        Trainer(tiny_model(0), TrainerConfig()).resume(tmp_path)


def test_every_checkpoint_file_is_in_its_manifest(tmp_path):
    model = tiny_model(0)
    path = save_checkpoint(tmp_path, model, build_tokenizer(), Trainer(model, TrainerConfig()).optimizer, {}, step=1)
    files = json.loads((path / "manifest.json").read_text())["files"]
    assert set(files) == {p.name for p in path.iterdir()} - {"manifest.json"}
    assert all(files[name]["bytes"] == (path / name).stat().st_size for name in files)


def test_leftovers_of_interrupted_writes_are_cleaned_or_put_back(tmp_path):
    """A crash between `_install`'s two renames leaves the old checkpoint as .old-* and no final:
    it is put back. A .tmp-* folder (a write cut short) is removed. Each is one line."""
    from posttrain.trainer.checkpoint import intact_checkpoint

    model = tiny_model(0)
    optimizer = Trainer(model, TrainerConfig()).optimizer
    save_checkpoint(tmp_path, model, None, optimizer, {}, step=1)
    second = save_checkpoint(tmp_path, model, None, optimizer, {}, step=2)
    second.rename(second.parent / ".old-step_00000002-0123abcd")
    partial = second.parent / ".tmp-step_00000002-89abcdef"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"cut")
    said: list[str] = []
    assert intact_checkpoint(tmp_path, said.append) == second
    assert said == [
        "resume: restored checkpoints/step_00000002 from .old-step_00000002-0123abcd (a replacement interrupted)",
        "resume: removed checkpoints/.tmp-step_00000002-89abcdef (left by an interrupted checkpoint write)",
    ]
    assert sorted(p.name for p in second.parent.iterdir()) == ["step_00000001", "step_00000002"]
