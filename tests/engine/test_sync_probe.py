"""Verified weight sync (engine/probe.py): after each push the engine's log-probs of a fixed probe must
equal the trainer's own, or the run stops with both figures.

In process (hf) the engine and the trainer can be made to hold different modules; against a real
`posttrain serve` process (the openai engine) a correct push verifies, a push that did not land
(the trainer really changed, the server kept the old weights) fails after its re-push, and a
server whose base is another model (so the pushed LoRA adapter lands on the wrong weights) fails.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from posttrain.configs.engine import EngineConfig
from posttrain.configs.trainer import LoraConfig, TrainerConfig
from posttrain.engine.hf import HFEngine
from posttrain.engine.probe import TOLERANCE, SyncProbe, default_tolerance
from posttrain.engine.sync import WeightSync
from posttrain.errors import SyncVerificationError
from posttrain.model.arch import load_model
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer
from posttrain.types import GenerationRequest, SamplingParams
from serve_process import posttrain_serve

ADMIN = "probe-test-admin-token"
FIGURES = re.compile(r"engine (-?\d+\.\d+), trainer (-?\d+\.\d+)")


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", ADMIN)


def _trainer(model_dir, lora=False):
    model, tokenizer = load_model(model_dir, device="cpu")
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8) if lora else None)
    return Trainer(model, cfg), tokenizer


def _train_one_step(trainer) -> None:
    """One real optimizer step (a group with mixed rewards), asserting that the weights changed."""
    before = [p.detach().clone() for p in trainer.params]
    prompt, comps = (5, 6, 7, 8), ((10, 11, 12), (20, 21, 22))
    own = trainer.token_logprobs([TrainRow.scoring(prompt, c, 1.0) for c in comps])
    rows = tuple(TrainRow(prompt, c, lp, r, "g", (1, 1, 1)) for c, lp, r in zip(comps, own, (1.0, 0.0)))
    assert trainer.step(TrainBatch(rows)).outcome == "applied"
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params))


def _both_figures(message: str) -> tuple[float, float]:
    m = FIGURES.search(message)
    assert m, message
    return float(m.group(1)), float(m.group(2))


# ---------------------------------------------------------------- in process


def test_tolerance_by_dtype():
    assert default_tolerance("torch.float32") == TOLERANCE["float32"] == 1e-4
    assert default_tolerance("torch.float32", "bf16_autocast") == default_tolerance("bfloat16") == 5e-2
    assert EngineConfig(verify_tolerance=1e-3).verify_tolerance == 1e-3
    with pytest.raises(ValueError, match="verify_sync"):
        EngineConfig(verify_sync="sometimes")
    from posttrain.configs import load_config

    assert load_config(None, ["engine.verify_sync=off"]).engine.verify_sync == "off"  # YAML's bare off is false
    assert load_config(None, ["engine.verify_sync=on"]).engine.verify_sync == "on"


def test_auto_verifies_remote_engines_only():
    from posttrain.engine.probe import enabled

    assert not enabled(EngineConfig(), remote=False) and enabled(EngineConfig(verify_sync="on"), remote=False)
    assert enabled(EngineConfig(), remote=True) and not enabled(EngineConfig(verify_sync="off"), remote=True)
    remote = WeightSync(EngineConfig(type="openai", url="http://h:1/v1"), None, None, "/nonexistent")
    assert remote.probe.enabled and not WeightSync(EngineConfig(), None, None, "/nonexistent").probe.enabled


def test_in_process_push_verifies_and_leaves_sampling_alone(tmp_path, micro_base):
    trainer, tok = _trainer(micro_base)
    _train_one_step(trainer)
    engine, twin = HFEngine(trainer.model, tok, seed=7), HFEngine(trainer.model, tok, seed=7)
    sync = WeightSync(EngineConfig(verify_sync="on"), engine, trainer, tmp_path)
    assert sync.push() == 1
    (result,) = sync.probe.results
    assert result.ok and result.tokens >= 1 and result.max_diff <= 1e-4 and result.attempt == 1
    assert len(sync.probe.prompt()) >= EngineConfig().verify_prompt_tokens
    assert sync.probe.row()["sync_verified"] is True and sync.probe.row() == {}  # reported once
    twin.update_weights(None)
    unseeded = [GenerationRequest((5, 6, 7), SamplingParams(max_tokens=12, n=3))]
    assert engine.generate(unseeded) == twin.generate(unseeded)  # the probe drew nothing from the engine's RNG


def test_in_process_engine_on_another_module_fails_with_both_figures(tmp_path, micro_base):
    trainer, tok = _trainer(micro_base)
    other, _ = load_model(micro_base, device="cpu")
    _train_one_step(trainer)  # the trainer's module moved on; the engine holds the base
    events = []
    sync = WeightSync(EngineConfig(verify_sync="on"), HFEngine(other, tok, seed=0), trainer, tmp_path)
    sync.probe.attach(events.append)
    with pytest.raises(SyncVerificationError) as err:
        sync.push()
    engine_lp, trainer_lp = _both_figures(str(err.value))
    assert abs(engine_lp - trainer_lp) > 1e-4
    assert [r.attempt for r in events] == [1, 2] and not any(r.ok for r in events)  # one re-push, checked again
    assert sync.engine.version == 2 and sync.pushed == 2


def test_weights_changed_behind_posttrains_back_are_caught_before_the_next_push(tmp_path, micro_base):
    """A remote engine's served weights changed by someone else (another process reloading the
    server) between two pushes: `before_push` compares the probe's answer with the last verified
    one and stops with both figures; an engine left alone passes it."""
    trainer, tok = _trainer(micro_base)
    served, _ = load_model(micro_base, device="cpu")  # the engine's own copy: a server's weights
    probe = SyncProbe(EngineConfig(verify_sync="on"), HFEngine(served, tok, seed=0), trainer, remote=True)
    probe.before_push()  # nothing verified yet: nothing to compare
    assert probe.check(0).ok
    probe.before_push()  # unchanged: passes
    assert probe.results[-1].attempt == 0 and probe.results[-1].ok
    with torch.no_grad():
        served.get_input_embeddings().weight.mul_(1.5)  # the "other process" reloads other weights
    with pytest.raises(SyncVerificationError, match="changed without a push") as err:
        probe.before_push()
    figures = re.search(r"now (-?\d+\.\d+), at the check (-?\d+\.\d+)", str(err.value))
    tokens = re.search(r"another first token: now \[[\d, ]+\], at the check \[[\d, ]+\]", str(err.value))
    assert tokens or abs(float(figures.group(1)) - float(figures.group(2))) > 1e-4, str(err.value)


def test_probe_prompt_must_fit_the_model(tmp_path, micro_base):
    from posttrain.errors import ConfigError

    trainer, tok = _trainer(micro_base)
    limit = trainer.model.config.max_position_embeddings
    cfg = EngineConfig(verify_sync="on", verify_prompt_tokens=limit)
    probe = SyncProbe(cfg, HFEngine(trainer.model, tok), trainer, remote=False)
    with pytest.raises(ConfigError, match="engine.verify_prompt_tokens"):
        probe.check(0)


# ---------------------------------------------------------------- a real posttrain serve process


def _remote(url: str, tok, trainer, tmp_path) -> WeightSync:
    from posttrain.engine.openai import OpenAIEngine

    cfg = EngineConfig(type="openai", url=f"{url}/v1")
    return WeightSync(cfg, OpenAIEngine(cfg.url or "", cfg.served_model, tok, timeout_s=60), trainer, tmp_path)


@pytest.mark.slow
def test_serve_push_verifies_and_a_lost_push_fails(tmp_path, micro_base, monkeypatch):
    trainer, tok = _trainer(micro_base)
    with posttrain_serve(micro_base) as (url, _):
        sync = _remote(url, tok, trainer, tmp_path / "sync")
        events = []
        sync.probe.attach(events.append)
        assert sync.probe.enabled  # auto: on for a remote engine
        _train_one_step(trainer)
        version = sync.push()  # a correct push of really changed weights verifies
        assert version >= 1 and [r.ok for r in events] == [True]
        assert events[0].max_diff <= TOLERANCE["float32"] and events[0].tokens >= 1

        _train_one_step(trainer)  # the trainer moves on; the server does not hear of it
        monkeypatch.setattr(sync.engine, "update_weights", lambda source: sync.engine.version)
        with pytest.raises(SyncVerificationError) as err:
            sync.push()
        engine_lp, trainer_lp = _both_figures(str(err.value))
        assert abs(engine_lp - trainer_lp) > TOLERANCE["float32"]
        assert [(r.ok, r.attempt) for r in events[1:]] == [(False, 1), (False, 2)]
        sync.close()


@pytest.mark.slow
def test_serve_on_another_base_fails(tmp_path, micro_base):
    """The server's base is not the trainer's (another model under the same name): the LoRA adapter
    the trainer pushes merges into the wrong weights, and the probe says so."""
    other = tmp_path / "other-base"
    shutil.copytree(micro_base, other)
    model, _ = load_model(other, device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(other)
    trainer, tok = _trainer(micro_base, lora=True)
    with posttrain_serve(str(other)) as (url, _):
        sync = _remote(url, tok, trainer, tmp_path / "sync")
        _train_one_step(trainer)
        with pytest.raises(SyncVerificationError) as err:
            sync.push()
        engine_lp, trainer_lp = _both_figures(str(err.value))
        assert abs(engine_lp - trainer_lp) > TOLERANCE["float32"]
        assert len(sync.probe.results) == 2 and sync.pushed == 2
        sync.close()
