"""The exposure check flags a base that memorised the held-out answers, and not a clean one."""

from __future__ import annotations

import random

from posttrain.domains.registry import get
from posttrain.evaluate import build_heldout
from posttrain.evaluate.exposure import check_exposure


def _tune(base: str, tasks, steps: int = 300):
    """Continue pretraining `base` on the gold answers of `tasks` (what a leak into pretraining does)."""
    import torch

    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import _encode_batch

    torch.manual_seed(0)
    model, tok = load_model(base)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(steps):
        batch = [rng.choice(tasks) for _ in range(16)]
        ids, attn, mask = _encode_batch(tok, [(t.prompt[-1].content, get(t.domain).gold(t)) for t in batch])
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


def test_planted_memorising_base_is_flagged_and_clean_is_not(micro_base):
    heldout = build_heldout({"add": 1, "reverse": 1}, 32)
    held = [t for s in heldout.of_kind("core").values() for t in s.tasks()]
    # equal compute on gold answers of train-split items nobody evaluates on
    other = [get(d).sample(10_000 + i, "train", 1) for d in ("add", "reverse") for i in range(32)]
    planted = check_exposure(*_tune(micro_base, held), heldout, tasks=32)
    clean = check_exposure(*_tune(micro_base, other), heldout, tasks=32)
    for name in ("add", "reverse"):
        assert planted[name].flagged, planted[name].message()
        assert not clean[name].flagged, clean[name].message()
        assert planted[name].gap > clean[name].gap + 1.0  # a margin, not an exact value


def test_run_checks_skip_exposure_without_a_local_model_and_say_so(tmp_path):
    """Under trainer.fsdp the loop passes no model (it is sharded across ranks, and a forward on
    rank 0 alone would wait for the others forever): the check is skipped, logged and recorded."""
    import json

    from posttrain.configs import load_config
    from posttrain.evaluate.run import RunEvaluator

    cfg = load_config(None, ["tasks.domains={add: {difficulty: 1}}", "eval.contamination=false", "eval.exposure=true"])
    logged: list[str] = []
    evaluator = RunEvaluator(cfg, tmp_path, engine=None, metrics=None, levels={"add": 1}, log=logged.append)
    out = evaluator.checks(None, object(), lambda: None)
    assert "exposure" not in out and "trainer.fsdp" in out["exposure_skipped"]
    assert json.loads((tmp_path / "checks.json").read_text()) == out
    assert any(line.startswith("exposure check skipped") for line in logged)
