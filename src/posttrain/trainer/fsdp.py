"""FSDP2 data parallelism for the trainer: shard the model, split the rows, reduce the stats.

Invariant: over W ranks, each rank holds 1/W of every sharded parameter,
gradient and optimizer state; the step's rows are split into W contiguous
shares, every rank runs the same number of forward/backward passes (a rank
with fewer micro-batches runs zero-weighted ones, so FSDP's collectives
stay matched), and gradients are summed across ranks, so the update equals
the single-process update on the whole batch up to float summation order.
Launch with torchrun; `init_from_env` picks gloo on CPU and nccl on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.errors import TrainerError


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the data-parallel group (rank 0 of 1 without one)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> DataParallel:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def active(self) -> bool:
        return self.world > 1

    def share(self, n: int) -> tuple[int, int]:
        """[start, end) of this rank's rows out of n (contiguous, sizes differ by at most one)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (self.rank < extra)

    def max_int(self, value: int) -> int:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.long)
        _all_reduce(t, "max")
        return int(t.item())

    def sum_floats(self, values: list[float]) -> list[float]:
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        _all_reduce(t, "sum")
        return [float(x) for x in t.tolist()]

    def max_float(self, value: float) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        _all_reduce(t, "max")
        return float(t.item())

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()


def _all_reduce(t: torch.Tensor, op: str) -> None:
    import torch.distributed as dist

    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    moved = t.to(device)
    dist.all_reduce(moved, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    t.copy_(moved.cpu())


def init_from_env(backend: str | None = None) -> DataParallel:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR...);
    on CUDA each local rank takes its own device."""
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise TrainerError("trainer.fsdp: no RANK/WORLD_SIZE in the environment; launch with torchrun")
    if not dist.is_initialized():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if chosen == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(chosen)
    return DataParallel.current()


def decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks FSDP shards one by one (transformers' _no_split_modules classes)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names |= set(getattr(inner, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise TrainerError(f"trainer.fsdp: no decoder layers found in {type(model).__name__} (_no_split_modules empty)")
    return layers


def shard_model(model: Any) -> Any:
    """fully_shard each decoder layer, then the root; the model must be on its device
    (CPU with gloo, the local CUDA device with nccl) before the optimizer is built."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        raise TrainerError(
            "trainer.fsdp needs an initialised process group (posttrain.trainer.fsdp.init_from_env under torchrun)"
        )
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state(model: Any, optimizer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Unsharded model and optimizer state on the CPU (a collective: every rank calls it;
    rank 0 receives the tensors, the others empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=opts)


def load_full_state(
    model: Any, optimizer: Any, model_state: dict[str, torch.Tensor], optim_state: dict[str, Any] | None
) -> None:
    """Load unsharded state (read on every rank) back into the sharded model and optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, model_state, options=opts)
    if optimizer is not None and optim_state is not None:
        set_optimizer_state_dict(model, optimizer, optim_state, options=opts)
