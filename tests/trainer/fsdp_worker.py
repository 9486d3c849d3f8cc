"""Run a few trainer steps on fixed batches, with FSDP2 under torchrun or in one process.

Usage: torchrun --nproc_per_node=2 fsdp_worker.py OUT_DIR fsdp
       python fsdp_worker.py OUT_DIR single
Rank 0 writes OUT_DIR/<mode>.pt: per-step loss, grad norm, stats, and the full parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from scaleout_testlib import batch, tiny_model  # noqa: E402

STEPS = 3


def main(out: Path, mode: str) -> None:
    from posttrain.configs.trainer import TrainerConfig
    from posttrain.trainer.trainer import Trainer

    torch.set_num_threads(1)
    fsdp = mode == "fsdp"
    if fsdp:
        from posttrain.trainer.fsdp import init_from_env

        init_from_env("gloo")
    model = tiny_model(0)
    cfg = TrainerConfig(lr=1e-2, micro_batch_size=3, fsdp=fsdp, sort_by_length=True)
    trainer = Trainer(model, cfg)
    steps = []
    from posttrain.trainer.batch import TrainBatch

    # the last step samples no signal: every rank takes Adam's zero-gradient step (trainer.coast)
    batches = [batch(100 + s) for s in range(STEPS)] + [TrainBatch((), filtered_rows=4, filtered_tokens=8)]
    for b in batches:
        st = trainer.step(b)
        steps.append(
            {
                "loss": st.loss,
                "grad_norm": st.grad_norm,
                "clip_frac": st.clip_frac,
                "ratio_mean": st.ratio_mean,
                "n_tokens": st.n_tokens,
                "outcome": st.outcome,
            }
        )
    ckpt = trainer.save(out / f"run-{mode}", None, {"mode": mode})
    from posttrain.trainer.fsdp import DataParallel, full_state

    rank = DataParallel.current().rank
    params = (
        full_state(trainer.model, trainer.optimizer)[0]
        if fsdp
        else {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    )
    resumed = _resume_matches(ckpt, cfg, params, fsdp)
    if rank == 0:
        torch.save({"steps": steps, "params": params, "ckpt": str(ckpt), "resumed": resumed}, out / f"{mode}.pt")
    if fsdp:
        import torch.distributed as dist

        dist.destroy_process_group()


def _resume_matches(ckpt: Path, cfg, params, fsdp: bool) -> bool:
    """A fresh (sharded) trainer resumed from the checkpoint holds the same full parameters."""
    from posttrain.trainer.fsdp import full_state
    from posttrain.trainer.trainer import Trainer

    fresh = Trainer(tiny_model(7), cfg)
    fresh.resume(ckpt)
    again = full_state(fresh.model, fresh.optimizer)[0] if fsdp else fresh.model.state_dict()
    return all(torch.equal(params[k], again[k]) for k in params) if params else True


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
