"""CUDA paths of the one Trainer/HFEngine code path, against the CPU (opt-in: -m gpu)."""

from __future__ import annotations

import pytest
import torch
from scaleout_testlib import batch, step_grads, tiny_model

from posttrain.configs.trainer import TrainerConfig
from posttrain.trainer.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _grads(device: str, cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    return step_grads(Trainer(tiny_model(0).to(device), cfg), batch(5))


def test_cuda_step_matches_cpu():
    cpu, cuda = _grads("cpu", TrainerConfig()), _grads("cuda", TrainerConfig())
    assert cpu.keys() == cuda.keys()
    assert all(torch.allclose(cpu[k], cuda[k], atol=1e-5, rtol=1e-4) for k in cpu)


def test_cuda_bf16_checkpointing_auto_micro_batches_close_to_fp32():
    ref = _grads("cuda", TrainerConfig())
    got = _grads(
        "cuda", TrainerConfig(precision="bf16_autocast", gradient_checkpointing=True, micro_batch_tokens="auto")
    )
    num = sum(float((ref[k] - got[k]).norm() ** 2) for k in ref) ** 0.5
    den = sum(float(ref[k].norm() ** 2) for k in ref) ** 0.5
    assert num / den < 0.05


def test_auto_budget_is_sized_on_cuda():
    trainer = Trainer(tiny_model(0).cuda(), TrainerConfig(micro_batch_tokens="auto"))
    assert isinstance(trainer._max_tokens, int) and trainer._max_tokens > 1000


def test_hf_engine_greedy_on_cuda_matches_cpu():
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import random_model
    from posttrain.types import GenerationRequest, SamplingParams

    req = [GenerationRequest((4, 30, 31, 5), SamplingParams(max_tokens=10, temperature=0.0))]
    model, tok = random_model("micro", 1)
    cpu = HFEngine(model, tok).generate(req)[0][0]
    model, tok = random_model("micro", 1)
    cuda = HFEngine(model, tok, device="cuda").generate(req)[0][0]
    assert cpu.token_ids == cuda.token_ids
    assert all(abs(a - b) < 1e-3 for a, b in zip(cpu.logprobs, cuda.logprobs))
