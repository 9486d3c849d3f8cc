"""`posttrain train` on bring-your-own domains: a JSONL, Parquet and datasets source beside a built-in,
with curriculum, mix, cheat probes, trace and eval reaching them; a failing user callable is masked."""

from __future__ import annotations

import json
import os

import pytest
from byo_testlib import rows, train_cfg, write_jsonl

from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore

USERFNS = os.path.join(os.path.dirname(__file__), "userfns")


def _write(tmp_path, fmt):
    data = rows(120)
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "q.jsonl", data)
    if fmt == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(data), tmp_path / "q.parquet", row_group_size=32)
        return tmp_path / "q.parquet"
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(data).save_to_disk(str(tmp_path / "ds"))
    return tmp_path / "ds"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "datasets"])
def test_train_on_a_source_domain(tmp_path, micro_base, fmt):
    from posttrain.loop import train

    path = _write(tmp_path, fmt)
    domains = (
        f"{{mine: {{weight: 2, source: {{path: {path}, fields: {{prompt: q, answer: a, id: id, difficulty: lvl}}, "
        f"cheats: ['0', '']}}, verifier: numeric}}, add: {{difficulty: 1}}}}"
    )
    result = train(train_cfg(tmp_path, micro_base, fmt, domains, "run.steps=2"), log=lambda *_: None)
    rows_ = TraceStore(result.run_dir / "trace.db").recent(200)
    mine = [r for r in rows_ if r["domain"] == "mine"]
    assert mine and all(r["verifier"] == "numeric@1" and r["reward"] is not None for r in mine)
    assert len(mine) > len(rows_) - len(mine)  # weight 2 against 1: the mix reaches it
    table = json.loads((result.run_dir / "eval.json").read_text())
    assert table["before"]["domains"]["mine"]["n"] == 6 and table["after"]["domains"]["mine"]["n"] == 6
    probe = [r for r in read_metrics(result.run_dir / "metrics.jsonl", "probe") if r["domain"] == "mine"]
    assert probe and probe[0]["declared"] and probe[0]["ok"] and probe[0]["cheats"] >= 3
    state = json.loads((result.run_dir / "eval.json").read_text())
    assert state["before"]["domains"]["mine"]["difficulty"] in (1, 2)


def test_a_verifier_accepting_a_declared_cheat_is_refused(tmp_path, micro_base):
    from posttrain.loop import train

    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    # a regex verifier with a loose pattern accepts any number: the declared cheat "0" gets through
    domains = (
        f"{{loose: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, cheats: ['0'], eval_percent: 20}}, "
        f"verifier: {{name: regex, pattern: '\\d+', extract: whole}}}}, add: {{difficulty: 1}}}}"
    )
    result = train(
        train_cfg(tmp_path, micro_base, "cheat", domains, "run.steps=1", "monitor.probes.action=exclude"),
        log=lambda *_: None,
    )
    probe = [r for r in read_metrics(result.run_dir / "metrics.jsonl", "probe") if r["domain"] == "loose"]
    assert probe and probe[0]["ok"] is False and probe[0]["accepted"] >= 1


def test_a_raising_callable_is_masked_and_counted(tmp_path, micro_base, monkeypatch):
    from posttrain.loop import train

    monkeypatch.chdir(USERFNS)
    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    domains = (
        f"{{boom: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}, "
        f"verifier: 'byo_rewards:raises'}}, add: {{difficulty: 1}}}}"
    )
    result = train(train_cfg(tmp_path, micro_base, "raise", domains, "run.steps=2"), log=lambda *_: None)
    boom = [r for r in TraceStore(result.run_dir / "trace.db").recent(200) if r["domain"] == "boom"]
    assert boom and all(
        r["reward"] is None and r["error_kind"] == "verifier" and "user bug" in r["error"] for r in boom
    )
    train_rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert sum(r["infra_errors"] for r in train_rows) == len(boom)
    table = json.loads((result.run_dir / "eval.json").read_text())
    assert table["after"]["domains"]["boom"]["infra_errors"] == 6  # every held-out item masked, none scored 0


def test_verification_in_worker_processes_rebuilds_the_file_domain(tmp_path, micro_base):
    import multiprocessing.forkserver

    from posttrain.loop import train

    # the forkserver started before the run knew its file domain (as an earlier test's pool may
    # have started it): its workers inherit an environment without the spec
    multiprocessing.forkserver.ensure_running()
    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    domains = (
        f"{{procs: {{source: {{path: {path}, "
        "fields: {prompt: q, answer: a}, eval_percent: 20}, verifier: numeric}}"
    )
    result = train(
        train_cfg(tmp_path, micro_base, "procs", domains, "run.steps=1", "pipeline.verify_processes=1"),
        log=lambda *_: None,
    )
    got = TraceStore(result.run_dir / "trace.db").recent(100)
    assert len(got) == 16
    assert all(r["reward"] is not None for r in got), {r["error"] for r in got}
