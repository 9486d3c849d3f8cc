"""The monitor's KL to the initial model (monitor/kl.py): the k3 estimate over the step's own
samples, its reference log-probs taken the trainer's way (the LM head a chunk of positions at a
time), never from a rows x positions x vocabulary logits tensor."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from trainer_testlib import VOCAB, tiny_model  # noqa: E402

from posttrain.monitor import kl  # noqa: E402
from posttrain.types import Completion  # noqa: E402

TEMPERATURE = 0.7


def _groups(seed: int = 0):
    rng = random.Random(seed)
    groups = []
    for domain in ["add", "add", "sort"]:
        prompt = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 9)))
        group = []
        for _ in range(3):
            n = rng.randrange(1, 7)
            ids = tuple(rng.randrange(1, VOCAB) for _ in range(n))
            logprobs = tuple(-rng.uniform(0.5, 5.0) for _ in range(n))
            group.append(
                SimpleNamespace(
                    completion=Completion(prompt, ids, "", logprobs, "stop"), task=SimpleNamespace(domain=domain)
                )
            )
        groups.append(group)
    return groups


def _by_full_logits(model, groups, temperature, rows):
    """The estimate from the model's full logits, one rollout at a time (what kl.py must equal)."""
    out: dict[str, list[float]] = {}
    for r in kl.pick_rows(groups, rows):
        c = r.completion
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        n = len(c.token_ids)
        ref = (logits[-n - 1 : -1] / temperature).log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        d = ref - torch.tensor(c.logprobs)
        out.setdefault(r.task.domain, []).append(float((d.exp() - d - 1).mean()))
    return {k: sum(v) / len(v) for k, v in sorted(out.items())}


@pytest.mark.parametrize("chunk_mib", [64.0, 1e-9])  # one chunk; one position a chunk
def test_the_estimate_equals_the_full_logits_one(monkeypatch, chunk_mib):
    monkeypatch.setattr(kl, "KL_CHUNK_MIB", chunk_mib)
    model = tiny_model(3).eval()
    groups = _groups()
    got = kl.kl_to_reference(model, groups, TEMPERATURE, rows=8)
    want = _by_full_logits(model, groups, TEMPERATURE, rows=8)
    assert got.keys() == want.keys() == {"add", "sort"}
    for domain in want:
        assert got[domain] == pytest.approx(want[domain], rel=1e-4, abs=1e-6)


def test_no_full_logits_tensor_is_made(monkeypatch):
    """The reference's own forward (which returns logits for every position) is never called:
    the decoder's hidden states reach the LM head a chunk at a time."""
    model = tiny_model(4).eval()
    groups = _groups(1)
    want = kl.kl_to_reference(model, groups, TEMPERATURE, rows=6)
    split = kl.split_head(model)  # the check forward runs once, here
    monkeypatch.setattr(kl, "split_head", lambda m: split)

    def refuse(*args, **kwargs):
        raise AssertionError("the model's full-logits forward was called")

    monkeypatch.setattr(model, "forward", refuse)
    assert kl.kl_to_reference(model, groups, TEMPERATURE, rows=6) == pytest.approx(want)
