"""The hf engine's inference copy: the trained module's weights in another dtype, adapters merged.

Invariant: after `refresh()` returns, every parameter and buffer of `model` equals the
source module's function, cast to `dtype`: a plain weight as it is, a LoRA-adapted weight as
W + peft's delta (scaling x B A, peft's own `get_delta_weight`), so `model` computes what the
unmerged source computes, up to the rounding of `dtype`. `model` is a plain transformers module
(no adapters: one matmul per projection instead of three), in eval mode, with no gradients; it
never shares storage with the source, so the trainer's optimizer never writes to it and it never
changes between two refreshes.

Why: a CPU with bfloat16 matmul units (AVX512-BF16, AMX) multiplies bf16 weights 2-3x faster than
float32 ones, and decoding at a few rows reads every weight each step, so a bf16 copy halves the
bytes a step reads (bench/RESULTS.md, "Real model rollouts in bfloat16"). The trainer keeps its
float32 master weights; the engine's log-probs are then the bf16 copy's, and the loss sees the gap
as train-inference mismatch (`trainer.mismatch`: measured every step, corrected by `tis`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from posttrain.errors import ConfigError, ModelLoadError
from posttrain.model.arch import is_peft

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
"""The dtypes an inference copy is made in (`engine.generate_dtype`)."""
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs that multiply bfloat16 in hardware (oneDNN uses them)."""


def resolve(kind: str, device: torch.device, cpu_flags: frozenset[str] | None = None) -> str:
    """What `engine.generate_dtype` means on `device`: model, bfloat16 or float32 as given; auto,
    bfloat16 where bf16 matmuls run in hardware (a CUDA device that supports them, or a CPU with
    one of `BF16_FLAGS`; `cpu_flags` default: this machine's), else model (elsewhere a bf16 matmul
    is emulated and slower than float32's)."""
    if kind != "auto":
        return kind
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "model"
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    return "bfloat16" if device.type == "cpu" and any(f in flags for f in BF16_FLAGS) else "model"


def _cpu_flags() -> frozenset[str]:
    """The flags of this machine's first CPU in /proc/cpuinfo (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


_PEFT_PREFIX = "base_model.model."


class InferenceCopy:
    """`source`'s weights as a plain module in `dtype` (`model`), re-read by `refresh()`."""

    def __init__(self, source: Any, dtype: str) -> None:
        if dtype not in DTYPES:
            raise ConfigError(f"engine.generate_dtype: {dtype!r} is not one of {sorted(DTYPES)} (or model, auto)")
        self.source, self.dtype = source, DTYPES[dtype]
        plain = copy.deepcopy(source)
        if is_peft(plain):
            plain = plain.merge_and_unload()  # the same module without its adapter layers
        self.model: Any = plain.to(self.dtype).eval().requires_grad_(False)
        self._own = self.model.state_dict()
        missing = sorted(set(self._own) - {name for name, _, _ in _plan(source)})
        if missing:
            raise ModelLoadError(f"inference copy: the source module has no weights for {missing[:5]}")
        self.refresh()

    def refresh(self) -> None:
        """Copy the source's current function into `model` (in place, cast to its dtype), one
        tensor at a time: the only temporaries are one adapted weight and its delta."""
        with torch.no_grad():
            for name, merged in merged_tensors(self.source):
                self._own[name].copy_(merged)


def merged_tensors(module: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """`module`'s state as the plain model names it: a peft-wrapped module's keys without peft's
    prefix and `base_layer`, each adapted weight with its adapters' delta added (detached; each
    delta computed when its weight is reached)."""
    with torch.no_grad():
        for name, value, layer in _plan(module):
            yield name, value if layer is None else value + _delta(layer).to(value.dtype)


def _plan(module: Any) -> list[tuple[str, torch.Tensor, Any]]:
    """Each state tensor of `module` as (the plain model's name, the tensor, the LoRA layer whose
    active adapters' delta it takes, or None); a peft module's adapter tensors left out."""
    if not is_peft(module):
        return [(name, value, None) for name, value in module.state_dict().items()]
    layers = _adapted(module)
    plan = []
    for key, value in module.state_dict().items():
        if ".lora_" in key:
            continue
        name = key.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")
        plan.append((name, value, layers.get(name)))
    return plan


def _adapted(module: Any) -> dict[str, Any]:
    """Each adapted weight's plain name and its LoRA layer (one with an active adapter)."""
    out: dict[str, Any] = {}
    for name, layer in module.named_modules():
        if not hasattr(layer, "get_delta_weight") or not hasattr(layer, "base_layer"):
            continue
        if getattr(layer, "merged", False):
            raise ModelLoadError(f"inference copy: {name} has its adapter merged into the base already")
        if _active(layer):
            out[f"{name.removeprefix(_PEFT_PREFIX)}.weight"] = layer
    return out


def _active(layer: Any) -> list[str]:
    return [a for a in layer.active_adapters if a in getattr(layer, "lora_A", {})]


def _delta(layer: Any) -> torch.Tensor:
    """The sum of `layer`'s active adapters' deltas (peft's own `get_delta_weight`)."""
    return sum((layer.get_delta_weight(a) for a in _active(layer)), torch.zeros(()))
