"""The monitor's boundaries: declared domain members and their defaults, error capture,
trace reads through TraceStore, and held-out tables where a domain is all infra errors."""

from __future__ import annotations

import random
import sqlite3

import pytest

from posttrain.domains.base import Domain, ProceduralDomain
from posttrain.errors import ConfigError, ErrorRecord, SandboxError, VerifierError, capture
from posttrain.evaluate import EvalTable
from posttrain.evaluate.core import DomainResult
from posttrain.monitor.probes import probe_domain
from posttrain.trace import RolloutRecord, TraceStore


class Plain(ProceduralDomain):
    """A domain that declares nothing beyond the contract's abstract members."""

    name = "test_plain"
    category = "test"

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        n = rng.randint(0, 9)
        return f"echo {n}=", str(n)


def test_declared_members_have_documented_defaults():
    d = Plain()
    task = d.sample(0, "train", 1)
    assert d.cheats(task) == () and probe_domain(d, 1, 3) is None  # no cheats: not probed
    assert not d.has_audit and d.audit(task, "anything") is True  # no stricter check
    assert d.partial_credit is False
    for name in ("cheats", "audit", "has_audit", "partial_credit"):
        assert name in vars(Domain), name  # declared on the base class, not found by getattr


def test_capture_keeps_a_posttrain_kind_and_names_the_boundary_otherwise():
    assert capture(KeyError("x"), "verifier") == ErrorRecord("verifier", "KeyError: 'x'")
    assert capture(SandboxError("died"), "verifier") == ErrorRecord("sandbox", "SandboxError: died")
    assert capture(VerifierError("cannot parse"), "sandbox").kind == "verifier"
    assert capture(TimeoutError("slow")).kind == "infra"


def _record(i: int, group: str, **kw) -> RolloutRecord:
    base = dict(
        task_id=f"t{group}",
        domain="add",
        split="train",
        difficulty=1,
        taskset_version="v",
        group_id=group,
        model_version=0,
        sampling={},
        prompt="1+1=",
        completion=str(i),
        completion_tokens=1,
        finish_reason="stop",
        reward=1.0,
        passed=True,
        parts={},
        reason="",
        verifier="exact_match@1",
        timings={},
        id=f"r{group}{i}",
    )
    return RolloutRecord(**{**base, **kw})


def test_trace_reads_go_through_the_store_read_only(tmp_path):
    db = tmp_path / "trace.db"
    store = TraceStore(db)
    store.write_rollouts([_record(i, "a") for i in range(3)] + [_record(0, "b")])
    store.write_rollouts(
        [
            _record(1, "b", exec_result={"status": "ok"}),
            _record(2, "b", reward=None, passed=None, error_kind="sandbox", error="died"),
            _record(3, "b", exec_result={"no": "status"}),
        ]
    )
    store.close()
    before = db.read_bytes()
    ro = TraceStore.read_only(db)
    assert ro.has("ra1") and ro.has("rb3") and not ro.has("zz")  # exact ids
    with pytest.raises(ConfigError, match="ambiguous"):
        ro.has("rb")  # a prefix of rb0 .. rb3 names none of them
    assert [s["id"] for s in ro.siblings(ro.get("ra1"))] == ["ra0", "ra1", "ra2"]
    assert sorted(ro.outcomes(), key=str) == sorted(
        [("add", "ok", None), ("add", None, "sandbox"), ("add", None, None)], key=str
    )
    with pytest.raises(sqlite3.OperationalError):
        ro.add_event("alarm", "nope")  # a reader cannot write
    ro.close()
    assert db.read_bytes() == before
    with pytest.raises(ConfigError, match="no trace database"):
        TraceStore.read_only(tmp_path / "missing.db")


def test_all_infra_domain_is_no_accuracy_in_the_heldout_row(tmp_path):
    from posttrain.configs import load_config
    from posttrain.metrics_log import MetricsLog, read_metrics
    from posttrain.monitor.monitor import Monitor, RunContext
    from posttrain.tasks.pool import TaskPool

    cfg = load_config(None, ["tasks.domains={add: {difficulty: 1}, reverse: {difficulty: 1}}"])
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    mon = Monitor(
        cfg.monitor,
        RunContext.of(cfg, tmp_path),
        TraceStore(tmp_path / "trace.db"),
        metrics,
        TaskPool(cfg.tasks, seed=0),
        log=lambda *_: None,
    )
    table = EvalTable(
        0,
        {
            "add": DomainResult("add", 1, 4, None, None, 4, eval_verifier="exact_match+audit+format"),
            "reverse": DomainResult(
                "reverse", 1, 4, 0.5, 0.5, 0, train_accuracy=0.5, eval_verifier="exact_match+audit+format"
            ),
        },
    )
    assert mon.after_eval(0, table) == []
    metrics.close()
    (row,) = read_metrics(tmp_path / "metrics.jsonl", "heldout")
    assert row["trusted"] == {"reverse": 0.5} and row["counts"] == {"reverse": 4}  # add: infra, never 0.0
    assert table.accuracies == {"reverse": 0.5} and table.mean_accuracy == 0.5

    from posttrain.evaluate.tables import format_table

    line = next(ln for ln in format_table(table).splitlines() if ln.lstrip().startswith("add"))
    assert "infra (4 errors)" in line and "0.000" not in line


def test_report_draws_no_bar_for_an_all_infra_domain(tmp_path, monkeypatch):
    """An accuracy of None (every item an infra error) is not drawn as a 0.0 bar."""
    import math

    from posttrain.report import html as report_html
    from posttrain.report.data import RunData

    figs = []
    monkeypatch.setattr(report_html, "_png", lambda fig: figs.append(fig) or "png")
    domains = {"add": {"accuracy": 0.5}, "code": {"accuracy": None}}
    data = RunData(
        tmp_path, "", [], [], [], [], [], [], {"before": {"domains": domains}, "after": {"domains": domains}}
    )
    assert report_html._heldout_bars(data) == "png"
    ax = figs[0].axes[0]
    heights = [p.get_height() for p in ax.patches]  # before add, before code, after add, after code
    assert heights[0] == heights[2] == 0.5 and math.isnan(heights[1]) and math.isnan(heights[3])
    assert [t.get_text() for t in ax.texts] == ["no score", "no score"]
