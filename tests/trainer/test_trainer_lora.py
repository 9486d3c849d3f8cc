"""LoRA through peft: adapters alone train, save, resume and travel; merging equals the adapted model."""

from __future__ import annotations

import json

import pytest
import torch
from scaleout_testlib import VOCAB, batch, tiny_model

from posttrain.configs.trainer import LoraConfig, TrainerConfig
from posttrain.errors import TrainerError
from posttrain.trainer.lora import is_adapter_dir, merged_state, resolve_update
from posttrain.trainer.trainer import Trainer

LORA = LoraConfig(rank=4, alpha=8.0)


def _trained(steps: int = 2, seed: int = 0) -> Trainer:
    trainer = Trainer(tiny_model(seed), TrainerConfig(lr=1e-2, lora=LORA))
    for s in range(steps):
        assert trainer.step(batch(10 + s)).outcome == "applied"
    return trainer


def test_only_adapters_train_and_base_stays():
    model = tiny_model(0)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, TrainerConfig(lr=1e-2, lora=LORA))
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    trainer.step(batch(10))
    inner = trainer.model.get_base_model()
    assert inner is model  # peft injects the adapters into the same module an engine holds
    after = {k.replace(".base_layer", ""): v for k, v in inner.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(after[k], base[k]) for k in base)
    assert any(float(p.detach().abs().max()) > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)


def test_checkpoint_holds_only_the_adapter_and_resumes(tmp_path):
    trainer = _trained()
    ckpt = trainer.save(tmp_path, None, {"x": 1})
    assert is_adapter_dir(ckpt) and not (ckpt / "model.safetensors").exists()
    assert json.loads((ckpt / "meta.json").read_text())["weights"] == "lora"
    full = tmp_path / "full"
    tiny_model(0).save_pretrained(full)
    assert (ckpt / "adapter_model.safetensors").stat().st_size * 4 < (full / "model.safetensors").stat().st_size
    fresh = Trainer(tiny_model(0), TrainerConfig(lr=1e-2, lora=LORA))
    assert fresh.resume(ckpt) == {"x": 1}
    want = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    got = fresh.model.state_dict()
    assert all(torch.equal(v, got[k]) for k, v in want.items())
    plain = Trainer(tiny_model(0), TrainerConfig())
    with pytest.raises(TrainerError, match="LoRA adapter"):
        plain.resume(ckpt)


def test_merged_weights_compute_the_adapted_function(tmp_path):
    trainer = _trained()
    ckpt = trainer.save(tmp_path, None)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        plain = tiny_model(0)
        plain.load_state_dict(merged_state(plain.state_dict(), ckpt), strict=True)
        got = plain(input_ids=ids).logits
        untouched = tiny_model(0)(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(untouched, want, atol=1e-3)  # the adapter did change the function


def test_server_side_updates_start_from_the_base_each_time(tmp_path):
    first = _trained(1).save(tmp_path / "a", None)
    second = _trained(2).save(tmp_path / "b", None)
    served = tiny_model(0)
    base = {k: v.clone() for k, v in served.state_dict().items()}
    s1 = resolve_update(served, str(first))
    served.load_state_dict(s1)
    s2 = resolve_update(served, str(second))  # from the remembered base, not base + first
    assert all(torch.equal(a, b) for a, b in zip(s2.values(), merged_state(base, second).values()))
    assert resolve_update(served, str(tmp_path / "plain")) == str(tmp_path / "plain")


def test_unknown_target_module_names_the_field():
    with pytest.raises(TrainerError, match="target_modules"):
        Trainer(tiny_model(0), TrainerConfig(lora=LoraConfig(target_modules=("nope_proj",))))
