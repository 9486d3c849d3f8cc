"""Whether a run fits the machine: a memory estimate checked before the run starts.

Invariant: `check_fits` refuses (one ConfigError line naming the estimate, its largest
terms and the machine's memory) a run whose estimate passes the memory this process may
use (the smaller of the machine's physical memory and its cgroup's limit), before any
evaluation or training runs; a run under it is left alone. The estimate counts what
posttrain itself sizes from the config and the model; it is a bound on those terms, not
a measurement of the whole process:

- the process itself (the interpreter, torch, transformers, the domains' libraries):
  `PROCESS_BYTES`;
- the policy's weights, gradients and AdamW's two moments (4 copies of the parameters in
  their dtype), a KL reference copy when `trainer.kl_coef` > 0;
- with the in-process `hf` engine: one generation batch (`engine.max_batch_tokens` tokens of
  KV cache, plus the prefill's attention, about 8 bytes per (query, key) pair over prompts
  of at most the model's positions) and the kept episode contexts
  (`engine.context_budget_tokens` tokens of KV cache), and the engine's inference copy of the
  weights under `engine.generate_dtype` (2 bytes a parameter, 4 for float32).

Not counted: the trainer's activations (its micro-batches are bounded by
`trainer.micro_batch_size` and `trainer.max_tokens_per_micro_batch`), the sandbox's task
processes (each bounded by its own cgroup limit) and the vLLM or remote servers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from posttrain.configs import Config
from posttrain.errors import ConfigError
from posttrain.model.arch import position_limit

GiB = 1 << 30
PROCESS_BYTES = 1 * GiB
"""The process before any model: Python, torch, transformers, the registered domains'
libraries (about 0.9 GiB measured on the embedded base's runs)."""
ATTENTION_BYTES_PER_PAIR = 8
"""Prefill attention memory per (query, key) pair, as measured on the hf engine's sdpa path
(a batch of 16 prompts of 3,000 tokens held 1.1 GiB)."""


@dataclass(frozen=True)
class Estimate:
    """The estimated peak bytes of a run, by term."""

    terms: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    def describe(self) -> str:
        """The terms, largest first, in GiB."""
        parts = sorted(self.terms.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name} {_gib(b)}" for name, b in parts if b)


def kv_bytes_per_token(model_config: Any, element_bytes: int) -> int:
    """Bytes of KV cache one token holds: 2 (keys, values) x layers x kv heads x head dim."""
    layers = int(model_config.num_hidden_layers)
    heads = int(getattr(model_config, "num_attention_heads", 1))
    kv = int(getattr(model_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(model_config, "head_dim", None) or model_config.hidden_size // heads)
    return 2 * layers * kv * head_dim * element_bytes


def estimate(cfg: Config, model: Any) -> Estimate:
    """The estimate of `cfg`'s run with `model` as its policy (see the module docstring)."""
    params = sum(p.numel() for p in model.parameters())
    element = next(model.parameters()).element_size()
    terms = {"process": PROCESS_BYTES, "policy, gradients and AdamW": 4 * params * element}
    if cfg.trainer.kl_coef > 0:
        terms["KL reference"] = params * 4
    if cfg.engine.kind == "hf":
        config = model.config  # a vision model's language model holds the cache
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        per_token = kv_bytes_per_token(text, element)
        positions = position_limit(text) or 8192
        batch = cfg.engine.max_batch_tokens
        terms["generation batch"] = batch * per_token + ATTENTION_BYTES_PER_PAIR * batch * positions
        if cfg.engine.context_reuse:
            terms["kept contexts"] = cfg.engine.context_budget_tokens * per_token
        if cfg.engine.generate_dtype != "model":  # auto counted as bfloat16, what it may resolve to
            terms["inference copy"] = params * (4 if cfg.engine.generate_dtype == "float32" else 2)
    return Estimate(terms)


def machine_memory() -> int | None:
    """Bytes this process may use: the smaller of physical memory (/proc/meminfo MemTotal) and its
    cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes); None where neither is known."""
    found = [b for b in (_meminfo_total(), _cgroup_limit()) if b]
    return min(found) if found else None


def check_fits(cfg: Config, model: Any, memory: int | None = None) -> Estimate:
    """`estimate(cfg, model)`, or ConfigError when it passes `memory` (default: `machine_memory()`)."""
    est = estimate(cfg, model)
    memory = machine_memory() if memory is None else memory
    if memory is not None and est.total > memory:
        raise ConfigError(
            f"the run would not fit in memory: estimated {_gib(est.total)} ({est.describe()}) against "
            f"{_gib(memory)} on this machine; lower engine.max_batch_tokens or engine.context_budget_tokens, "
            "or use a smaller model"
        )
    return est


def _gib(b: int) -> str:
    return f"{b / GiB:.1f} GiB"


def _meminfo_total() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 or v1); None when unlimited or unreadable."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            name, root = "memory.max", "/sys/fs/cgroup"
        elif "memory" in controllers.split(","):
            name, root = "memory.limit_in_bytes", "/sys/fs/cgroup/memory"
        else:
            continue
        try:
            with open(os.path.join(root + path, name)) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None
