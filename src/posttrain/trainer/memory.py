"""Precision, memory and reproducibility options of the trainer's step.

Invariant: with every option off these helpers change nothing: `autocast`
is a no-op context, `micro_slices` cuts exactly `range(0, n, max_rows)`, and
no global torch flag is touched. With an option on, each helper does one
documented thing (bf16 autocast, recomputed activations, a padded-token cap
per micro-batch, deterministic kernels) on CPU and CUDA alike.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from typing import Any

import torch

from posttrain.errors import TrainerError

_AUTO_MEMORY_SHARE = 0.6
"""Share of the free CUDA memory an auto-sized micro-batch may plan to use."""


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """torch.autocast(bfloat16) for `bf16_autocast`, else a no-op."""
    if precision == "float32":
        return contextlib.nullcontext()
    if precision == "bf16_autocast":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise TrainerError(f"trainer.precision {precision!r} unknown; allowed: float32, bf16_autocast")


def pin_determinism() -> None:
    """Deterministic kernels (CPU and CUDA); cuBLAS needs its workspace fixed
    before the first CUDA call, so set it as early as possible."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def disable_dropout(model: Any) -> None:
    """Set every dropout to p = 0 (RL needs on-policy ratios of exactly 1, even in train mode)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    cfg = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if cfg is not None and isinstance(getattr(cfg, name, None), float):
            setattr(cfg, name, 0.0)


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute decoder layers in backward (transformers' non-reentrant checkpointing);
    it acts only in train mode, so the trainer trains in train mode with dropout off."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name (the old one warns, gone in 6)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise TrainerError("trainer.gradient_checkpointing: the model has no activation_checkpointing_enable")
    disable_dropout(model)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # frozen embeddings (LoRA) still give checkpoints a grad path


def micro_slices(lengths: Sequence[int], max_rows: int, max_tokens: int | None) -> list[tuple[int, int]]:
    """Consecutive [start, end) slices of rows: at most `max_rows` rows each and,
    when `max_tokens` is set, rows x longest row <= max_tokens (a row longer than
    the cap gets a micro-batch of its own)."""
    if max_tokens is None:
        return [(s, min(s + max_rows, len(lengths))) for s in range(0, len(lengths), max_rows)]
    slices, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if i > start and ((i - start + 1) * wider > max_tokens or i - start >= max_rows):
            slices.append((start, i))
            start, wider = i, n
        longest = wider
    if lengths:
        slices.append((start, len(lengths)))
    return slices


def token_budget(
    setting: int | str | None, model: Any, device: torch.device, checkpointing: bool, chunked: bool = False
) -> int | None:
    """The padded-token cap per micro-batch: the configured int, None, or for
    "auto" an estimate from free CUDA memory (None on the CPU)."""
    if setting != "auto":
        return setting  # type: ignore[return-value]
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, int(free * _AUTO_MEMORY_SHARE / bytes_per_token(model, checkpointing, chunked)))


def bytes_per_token(model: Any, checkpointing: bool, chunked: bool = False) -> int:
    """A conservative training-memory estimate per token: float32 logits, their
    log-softmax and gradient (3 x vocab x 4 bytes; none with `chunked`, the LM head
    applied a bounded chunk at a time: trainer.logits_chunk_mib) plus activations (about 34
    hidden-sized values per layer, 2 per layer with checkpointing, at 2-4 bytes)."""
    cfg = model.config
    vocab = int(cfg.vocab_size)
    hidden = int(cfg.hidden_size)
    layers = int(cfg.num_hidden_layers)
    per_layer = 2 if checkpointing else 34
    return (0 if chunked else 12 * vocab) + 4 * hidden * (per_layer * layers + 8)


def release_freed_memory(device: torch.device) -> bool:
    """After a CPU train step: hand the C heap's free pages back to the OS (glibc's
    `malloc_trim(0)`); True when some were returned. glibc raises its mmap threshold after the
    first large tensor is freed, so later steps' activations come from the heap, and what a
    step freed stayed resident: on SmolLM2-135M the process held 5-6 GB between steps for 1 GB
    of live data (bench/RESULTS.md, "Real model memory"). A no-op on CUDA (its caching
    allocator holds the device memory) and where the C library has no malloc_trim."""
    if device.type != "cpu":
        return False
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


@functools.cache
def _malloc_trim() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def process_memory_mib() -> dict[str, float]:
    """This process's resident memory now and its peak so far, in MiB (`rss_mib`,
    `peak_rss_mib`: Linux VmRSS and VmHWM; elsewhere the peak from getrusage alone).
    A forked child's RSS is not counted: the sandbox's workers are processes of their own,
    each bounded by its own limit."""
    found: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found["rss_mib" if key == "VmRSS" else "peak_rss_mib"] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    if "peak_rss_mib" not in found:
        import resource

        found["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return found
