"""The loop with every push verified in process (engine.verify_sync on, hf): the same rollouts and
weights as without the check (the behaviour pin's fingerprint), each push a `sync_probe` trace
event and a train-row figure, and the train-inference mismatch of the on-policy loop float rounding."""

from __future__ import annotations

import json

import pytest
from test_behaviour_pin import GOLDEN, fingerprint, machine_key

from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore

DOMAINS = "tasks.domains={parity: {difficulty: 1}, lookup: {difficulty: 1}}"
PINNED = ("rollouts", "params", "rows", "consumed")


@pytest.mark.heavy
def test_verified_pushes_leave_the_pinned_run_unchanged(tmp_path, micro_base, parity_domain):
    on = fingerprint(tmp_path, micro_base, "probe-on", DOMAINS, "engine.verify_sync=on")
    golden = json.loads(GOLDEN.read_text())["machines"].get(machine_key())
    if golden is None:  # a machine the pin does not know: compare with the same run unchecked
        off = fingerprint(tmp_path, micro_base, "probe-off", DOMAINS, "engine.verify_sync=off")
        golden = {k: off[k] for k in PINNED}
    assert {k: on[k] for k in PINNED} == golden

    run = tmp_path / "probe-on"
    rows = read_metrics(run / "metrics.jsonl", "train")
    checked = [r for r in rows if "sync_verified" in r]
    assert checked and all(r["sync_verified"] and r["sync_probe_max_diff"] <= 1e-4 for r in checked)
    assert all(r["sync_probe_tokens"] >= 1 for r in checked)
    events = TraceStore(run / "trace.db").events("sync_probe")
    assert len(events) == len(checked) and all(json.loads(e["data"])["ok"] for e in events)
    trained = [r for r in rows if r.get("n_tokens")]
    assert trained and all(r["mismatch_abs_max"] < 1e-4 and r["mismatch_outside"] == 0 for r in trained)
