"""The train-inference mismatch is acted on (engine/guard.py): an engine that answers the sync probe
from the pushed weights and every rollout from the initial ones passes every probe, and is
stopped by the mismatch the trainer measures on the batch, with both figures in the message,
before the step's weights are pushed or saved. An honest engine never trips it: every other loop
test runs with the default bounds (measured figures in docs/reliability.md)."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence

import pytest
from test_loop_e2e import _cfg

from posttrain.engine.base import Engine
from posttrain.engine.hf import HFEngine
from posttrain.errors import EngineFault
from posttrain.types import Completion, GenerationRequest, Message


class ProbeHonestRolloutsStale(Engine):
    """The attack (issue 35): the probe request (id "sync-probe") is answered by `honest`, which
    holds the trainer's module; every other request by `stale`, which holds the initial weights,
    its completions tagged with the version `honest` acknowledged."""

    def __init__(self, honest: HFEngine, stale: HFEngine) -> None:
        self.honest, self.stale = honest, stale
        self.eos_token_id = honest.eos_token_id

    @property
    def version(self) -> int:  # type: ignore[override]
        return self.honest.version

    @version.setter
    def version(self, value: int) -> None:
        self.honest.version = value

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return self.honest.encode_chat(messages)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.honest.decode(token_ids)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if all(r.request_id == "sync-probe" for r in requests):
            return self.honest.generate(requests)
        self.stale.version = self.honest.version  # it claims the pushed weights
        return self.stale.generate(requests)

    def update_weights(self, source: object) -> int:
        return self.honest.update_weights(source)


def test_an_engine_that_passes_the_probe_but_samples_other_weights_is_stopped(
    tmp_path, micro_base, parity_domain, monkeypatch
):
    from posttrain.engine import sync
    from posttrain.loop import train

    real = sync.make_engine

    def split(cfg, model, tokenizer, seed, *rest):
        stale = HFEngine(copy.deepcopy(model), tokenizer, seed=seed)  # the initial weights, kept
        return ProbeHonestRolloutsStale(real(cfg, model, tokenizer, seed, *rest), stale)

    monkeypatch.setattr(sync, "make_engine", split)
    lines: list[str] = []
    cfg = _cfg(tmp_path, micro_base, "liar", parity_domain, "run.steps=12", "trainer.lr=5e-2", "engine.verify_sync=on")
    with pytest.raises(EngineFault, match="train-inference mismatch") as err:
        train(cfg, log=lines.append)
    message = str(err.value)
    gap = float(re.search(r"mean \|trainer - engine\| log-prob ([\d.e+-]+)", message).group(1))
    probe = float(
        re.search(r"sync probe passed at the last push with max \|engine - trainer\| ([\d.e+-]+)", message).group(1)
    )
    assert gap > cfg.trainer.mismatch.stop_abs_mean and probe <= 1e-4  # both figures: the batch's and the probe's
    assert "before this step's weights are pushed or saved" in message
