"""The trace's row encoding and ids: what json.dumps gave, shared values encoded once, ids
time-ordered, 16 hex digits and distinct."""

from __future__ import annotations

import json
import math
import re
import time

from posttrain.trace import RolloutRecord, TraceStore, _encoder, new_id


def _record(**kw) -> RolloutRecord:
    base = dict(
        task_id="add:train:1:5", domain="add", split="train", difficulty=1, taskset_version="v.abc",
        group_id="1:0", model_version=2, sampling={"max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "n": 2},
        prompt="1+4=", completion="<answer>5</answer>", completion_tokens=5, finish_reason="stop",
        reward=1.0, passed=True, parts={"outcome": 1.0}, reason="ok", verifier="exact@1",
        timings={"generate_s": 0.01},
    )  # fmt: skip
    return RolloutRecord(**{**base, **kw})


def test_the_encoder_writes_what_json_dumps_writes():
    encode = _encoder()
    values = [
        {"a": 1, "b": [1.5, None, True], "c": {"d": 'é\n"q"'}},
        {"nan": math.nan, "inf": -math.inf, 3: "int key"},
        [1, 2, {"x": ()}],
        {"obj": RuntimeError("boom"), "set": {1}},  # default=str
        "a string\u2028",
        None,
        0.1,
        {},
    ]
    for value in values:
        assert encode(value) == json.dumps(value, default=str)


def test_shared_values_are_encoded_once_and_read_back_whole(tmp_path):
    store = TraceStore(tmp_path / "trace.db")
    sampling = {"max_tokens": 8, "temperature": 0.7, "top_p": 1.0, "n": 2}
    records = [_record(sampling=sampling, reward=r / 4, parts={"outcome": r / 4}) for r in range(4)]
    records.append(_record(exec_result={"status": "ok", "stdout": "5\n"}, turns=[{"action": "a", "parts": {}}]))
    store.write_rollouts(records)
    for rec in records:
        row = store.get(rec.id)
        assert row is not None
        for key in ("sampling", "parts", "timings", "exec_result", "turns", "reward", "prompt", "completion"):
            want = getattr(rec, key)
            assert row[key] == (json.loads(json.dumps(want)) if want is not None else None), key
    store.close()


def test_ids_are_16_hex_digits_time_ordered_and_distinct():
    ids = [new_id() for _ in range(20_000)]
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    now = int(time.time()) & 0xFFFF
    assert {int(i[:4], 16) for i in ids} <= {(now + d) & 0xFFFF for d in (-1, 0, 1)}
    assert _record().id != _record().id


def test_metrics_row_of_the_trainer_stats_leaves_out_step_and_links():
    from posttrain.loop import _stats_row
    from posttrain.trainer.batch import RolloutLink
    from posttrain.trainer.trainer import StepStats
    from posttrain.types import to_dict

    fields = {f: 0 for f in StepStats.__dataclass_fields__ if f != "rollouts"}
    stats = StepStats(**{**fields, "outcome": "ok", "guard_reason": ""}, rollouts={"r1": RolloutLink(0.5, 1.0, 0.0)})
    assert _stats_row(stats) == {k: v for k, v in to_dict(stats).items() if k not in ("step", "rollouts")}


def test_get_takes_the_exact_id_first_and_refuses_an_ambiguous_prefix(tmp_path):
    import pytest

    from posttrain.errors import ConfigError

    store = TraceStore(tmp_path / "trace.db")
    ids = ["00aa000000000001", "00aa000000000010", "00ab000000000000"]
    store.write_rollouts([_record(id=i, reward=n / 4) for n, i in enumerate(ids)])
    assert store.get("00aa000000000001")["reward"] == 0.0  # the whole id
    assert store.get("00ab")["id"] == "00ab000000000000"  # a unique prefix
    with pytest.raises(ConfigError, match="ambiguous"):
        store.get("00aa")
    assert store.get("00a_") is None  # LIKE's wildcards are literal characters here
    assert store.get("ff") is None
    store.close()
