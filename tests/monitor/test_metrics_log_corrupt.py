"""The one reader of metrics.jsonl skips a corrupt line with one warning naming file:line, and
keeps every sound row around it: a plan, a report or a resume reads the rest of the run."""

from __future__ import annotations

import json
import logging
import random

import pytest

from posttrain.metrics_log import MetricsLog, read_metrics

CORRUPT = [
    b"{not json",
    b"\xff\xfe\x00garbage",  # not UTF-8
    b"[1, 2]",
    b"42",
    b'{"step": 1, "time": 1.0}',  # no kind
    b'{"kind": "train", "step": "x", "time": 1.0}',
    b'{"kind": "train", "step": 2, "time": null}',
    b'{"kind": "train", "step": true, "time": 1.0}',
    b'{"kind": "train", "step": 3, "time": 1.0, "loss": ' + b"[" * 100_000 + b"}",  # nested too deeply
]


@pytest.mark.parametrize("seed", range(4))
def test_corrupt_lines_are_skipped_each_with_one_warning_naming_file_and_line(tmp_path, caplog, seed):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in range(1, 6):
        log.write("train", step, loss=0.5)
    log.close()
    lines = path.read_bytes().split(b"\n")[:-1]
    r = random.Random(seed)
    bad = r.sample(CORRUPT, 3)
    at = sorted(r.sample(range(len(lines) + 3), 3))
    for k, line in zip(at, bad):
        lines.insert(k, line)
    path.write_bytes(b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING, logger="posttrain.metrics_log"):
        rows = read_metrics(path, "train")
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    warned = [rec.getMessage() for rec in caplog.records]
    assert len(warned) == 3
    for k, msg in zip(at, warned):
        assert msg.startswith(f"{path}:{k + 1}: corrupt metrics line skipped ("), msg


def test_a_sound_log_reads_without_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "eval", "step": s, "time": s * 1.5}) + "\n" for s in range(3)))
    with caplog.at_level(logging.WARNING, logger="posttrain.metrics_log"):
        assert len(read_metrics(path)) == 3
    assert not caplog.records
