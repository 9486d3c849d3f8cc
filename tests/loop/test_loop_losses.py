"""`posttrain train` with each of the losses added for issue 28 (rloo, reinforce_pp, gspo, cispo),
chosen by one config field: the run trains (the weights move), and the advantage the trace
records for each consumed rollout is that loss's own, recomputed by hand from the traced rewards."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from test_loop_e2e import _cfg, _params

from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore


def _by_hand(loss: str, groups: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each group's advantages from its rewards, in the group's order."""
    mean = {g: sum(r) / len(r) for g, r in groups.items()}
    if loss == "rloo":  # r_i minus the mean of the other members
        return {g: [x - (sum(r) - x) / (len(r) - 1) for x in r] for g, r in groups.items()}
    if loss == "reinforce_pp":  # r - group mean, over the batch's std of those
        centred = [x - mean[g] for g, r in groups.items() for x in r]
        std = math.sqrt(sum(c * c for c in centred) / len(centred))
        return {g: [(x - mean[g]) / (std + 1e-6) for x in r] for g, r in groups.items()}
    out = {}  # gspo, cispo: group-normalised
    for g, r in groups.items():
        std = math.sqrt(sum((x - mean[g]) ** 2 for x in r) / len(r))
        out[g] = [0.0 if std == 0 else (x - mean[g]) / (std + 1e-6) for x in r]
    return out


SLOW = pytest.mark.slow  # about 12 s each; cispo (the form furthest from PPO-clip) runs by default


@pytest.mark.parametrize(
    "loss",
    [
        "cispo",
        pytest.param("rloo", marks=SLOW),
        pytest.param("reinforce_pp", marks=SLOW),
        pytest.param("gspo", marks=SLOW),
    ],
)
def test_train_with_each_new_loss(tmp_path, micro_base, parity_domain, loss):
    from safetensors.torch import load_file

    from posttrain.loop import train

    cfg = _cfg(tmp_path, micro_base, loss, "run.steps=2", parity_domain, f"trainer.loss.type={loss}")
    assert cfg.trainer.loss.type == loss
    result = train(cfg, log=lambda *_: None)
    start, end = load_file(f"{micro_base}/model.safetensors"), _params(result.run_dir)
    assert any((end[k] != start[k]).any() for k in end), f"{loss}: the weights never moved"
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    consumed = [r for r in TraceStore(result.run_dir / "trace.db").recent(1000) if r["train_step"] is not None]
    assert any(r["advantage"] for r in consumed), "no consumed rollout carried signal: the check would be vacuous"
    for step in {r["train_step"] for r in consumed}:
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in sorted((r for r in consumed if r["train_step"] == step), key=lambda r: r["id"]):
            groups[r["group_id"]].append(r)
        want = _by_hand(loss, {g: [r["reward"] for r in rs] for g, rs in groups.items()})
        for g, rs in groups.items():
            got = [r["advantage"] for r in rs]
            assert got == pytest.approx(want[g], abs=1e-5), (loss, step, g)
