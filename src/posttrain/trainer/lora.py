"""LoRA through peft: adapters train, the base stays frozen; adapters merge for serving.

Invariant: a LoRA model's trainable parameters are its adapters and nothing
else; what it saves (checkpoints, weight updates) is the adapter alone
(`adapter_config.json` + `adapter_model.safetensors`); merging an adapter
into its base gives W + (alpha / r) B A for every target layer, the same
function the unmerged model computes (up to float rounding).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from posttrain.configs.trainer import LoraConfig
from posttrain.errors import ModelLoadError, TrainerError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and (p / ADAPTER_WEIGHTS).is_file()


def peft_config(cfg: LoraConfig, **extra: Any) -> Any:
    """peft's LoraConfig for trainer.lora: its rank, alpha, dropout and target modules, no bias
    adapters; `extra` goes to peft as is (e.g. a task type)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        **extra,
    )


def apply_lora(model: Any, cfg: LoraConfig) -> Any:
    """Wrap `model` with fresh LoRA adapters (B = 0, so the function is unchanged).
    peft injects the adapter layers into `model` itself, so an engine holding
    `model` generates with the adapters."""
    from peft import get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in cfg.target_modules if t not in names]
    if missing:
        raise TrainerError(f"trainer.lora.target_modules: the model has no modules named {missing}")
    return get_peft_model(model, peft_config(cfg))


def load_adapter_state(model: Any, adapter_dir: str | Path) -> None:
    """Copy a saved adapter's weights into a PeftModel's adapters (in place)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    p = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not p.is_file():
        raise TrainerError(f"{adapter_dir} holds no {ADAPTER_WEIGHTS}")
    result = set_peft_model_state_dict(model, load_file(str(p)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise TrainerError(f"adapter {adapter_dir} does not fit the model: unexpected {unexpected[:5]}")


def adapter_config(adapter_dir: str | Path) -> dict[str, Any]:
    p = Path(adapter_dir) / ADAPTER_CONFIG
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {p}: {exc}") from exc


def merged_state(base_state: Mapping[str, torch.Tensor], adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The full state dict of base + adapter: W + (alpha / r) B A on each target weight.
    Works on plain tensors (no peft model), so a server can apply adapter updates
    to its own copy of the base weights."""
    from safetensors.torch import load_file

    cfg = adapter_config(adapter_dir)
    if cfg.get("peft_type") != "LORA" or cfg.get("use_dora") or cfg.get("fan_in_fan_out"):
        raise ModelLoadError(f"{adapter_dir}: only plain LoRA adapters merge here (got {cfg.get('peft_type')})")
    scale = float(cfg["lora_alpha"]) / float(cfg["r"])
    lora = load_file(str(Path(adapter_dir) / ADAPTER_WEIGHTS))
    out = dict(base_state)
    for key_a, a in lora.items():
        if ".lora_A." not in key_a:
            continue
        key_b = key_a.replace(".lora_A.", ".lora_B.")
        target = _base_key(key_a.split(".lora_A.")[0]) + ".weight"
        if key_b not in lora or target not in out:
            raise ModelLoadError(f"{adapter_dir}: adapter {key_a} has no matching B or base weight {target!r}")
        w = out[target]
        delta = (lora[key_b].float() @ a.float()) * scale
        out[target] = (w.float() + delta.to(w.device)).to(w.dtype)
    return out


def _base_key(module: str) -> str:
    """peft's saved key prefix `base_model.model.` removed: the plain model's name."""
    prefix = "base_model.model."
    return module[len(prefix) :] if module.startswith(prefix) else module


class AdapterUpdates:
    """Turns adapter directories into full state dicts for one model, remembering
    the base weights the first time (the model must hold its base weights then)."""

    def __init__(self, model: Any) -> None:
        with torch.no_grad():
            self.base = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def state_for(self, adapter_dir: str | Path) -> dict[str, torch.Tensor]:
        return merged_state(self.base, adapter_dir)


def resolve_update(model: Any, path: str) -> Any:
    """What an engine's update_weights should load for `path`: the path itself for a
    full checkpoint, or base + adapter as a state dict for an adapter directory."""
    if not is_adapter_dir(path):
        return path
    cache = getattr(model, "_posttrain_adapter_base", None)
    if cache is None:
        cache = AdapterUpdates(model)
        model._posttrain_adapter_base = cache
    return cache.state_for(path)


def merge_to_dir(base_dir: str | Path, adapter_dir: str | Path, out: str | Path) -> Path:
    """Load the base from a local directory, merge the adapter, save a plain HF model + tokenizer."""
    from posttrain.model.arch import load_model

    model, tok = load_model(base_dir)
    state = merged_state(model.state_dict(), adapter_dir)
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    from posttrain.model.tokenizer import save_tokenizer

    save_tokenizer(tok, out)
    return out
