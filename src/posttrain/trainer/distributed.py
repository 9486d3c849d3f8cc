"""The loop under torchrun with FSDP: rank 0 runs the loop, the other ranks follow its trainer calls.

Invariant: every Trainer call that runs collectives (step, save, save_weights,
resume, token_logprobs) is made on every rank, in the same order, with the same arguments:
rank 0's LeaderTrainer broadcasts each call before making it, and followers
replay them until `close()` sends stop. Only rank 0 samples, verifies,
traces and evaluates; inference is remote (engine.kind openai), since an
in-process engine cannot generate from sharded weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.errors import ConfigError


def _send(message: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    dist.broadcast_object_list([message], src=0)


def _receive() -> tuple[Any, ...]:
    import torch.distributed as dist

    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LeaderTrainer:
    """Rank 0's Trainer: the same interface; collective calls are announced to the followers first."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    def step(self, batch: Any) -> Any:
        _send(("step", batch))
        return self._trainer.step(batch)

    def save(
        self, run_dir: str | Path, tokenizer: Any, loop_state: dict[str, Any] | None = None, step: int | None = None
    ) -> Path:
        _send(("save", str(run_dir), step))
        return self._trainer.save(run_dir, tokenizer, loop_state, step)

    def save_weights(self, path: str | Path) -> Path:
        _send(("save_weights", str(path)))
        return self._trainer.save_weights(path)

    def resume(self, path: str | Path) -> dict[str, Any]:
        _send(("resume", str(path)))
        return self._trainer.resume(path)

    def token_logprobs(self, rows: Any) -> Any:
        _send(("token_logprobs", rows))
        return self._trainer.token_logprobs(rows)

    def sequence_logprobs(self, prompt_ids: Any, token_ids: Any, temperature: float) -> Any:
        from posttrain.trainer.batch import TrainRow

        return self.token_logprobs([TrainRow.scoring(prompt_ids, token_ids, temperature)])[0]

    def close(self) -> None:
        _send(("stop",))


def follow(trainer: Any) -> int:
    """Replay rank 0's trainer calls until it stops; returns the number of calls replayed."""
    calls = 0
    while True:
        kind, *args = _receive()
        if kind == "stop":
            return calls
        if kind == "step":
            trainer.step(args[0])
        elif kind == "save":
            trainer.save(args[0], None, {}, *args[1:])
        elif kind == "save_weights":
            trainer.save_weights(args[0])
        elif kind == "resume":
            trainer.resume(args[0])
        elif kind == "token_logprobs":
            trainer.token_logprobs(args[0])
        else:
            raise RuntimeError(f"follower: unknown command {kind!r} from rank 0")
        calls += 1


def check(cfg: Any) -> None:
    if cfg.engine.kind != "openai":
        raise ConfigError(
            "trainer.fsdp in the loop needs engine.kind openai: an in-process engine "
            "cannot generate from sharded weights"
        )


def follow_unless_leader(cfg: Any, resume: str | Path | None) -> bool:
    """Without trainer.fsdp (in the run's config), return False at once. Else join the
    torchrun process group: on rank 0 return False (run the loop); elsewhere build the
    same model and Trainer, follow rank 0, return True."""
    import torch

    from posttrain.rundir import RunDir
    from posttrain.trainer.fsdp import init_from_env

    if resume:
        cfg = RunDir.open(resume)[1]
    if not cfg.trainer.fsdp:
        return False
    check(cfg)
    rank = init_from_env().rank
    if rank == 0:
        return False
    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base
    from posttrain.trainer.trainer import Trainer

    torch.set_num_threads(cfg.run.threads)
    device = "cuda" if cfg.model.device != "cpu" and torch.cuda.is_available() else "cpu"
    model_dir = cfg.model.path or ensure_base(cfg.base, progress=False)
    model, _ = load_model(model_dir, device=device, dtype=getattr(torch, cfg.model.dtype))
    ref_model = load_model(model_dir, device=device)[0] if cfg.trainer.kl_coef > 0 else None
    follow(Trainer(model, cfg.trainer, ref_model=ref_model))
    return True
