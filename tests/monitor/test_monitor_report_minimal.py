"""The report of a run without monitor rows still renders, says what is missing, and escapes run text."""

from __future__ import annotations

import pytest

from posttrain.errors import ConfigError
from posttrain.metrics_log import MetricsLog
from posttrain.report import write_report


def test_report_of_a_bare_run(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "config.yaml").write_text("run:\n  name: '<script>alert(1)</script>'\n")
    log = MetricsLog(run / "metrics.jsonl")
    for step in range(1, 4):
        log.write("train", step, reward_mean=0.1 * step, reward_by_domain={"add": 0.1 * step}, generate_idle_share=0.25)
    log.write(
        "alarm",
        2,
        alarm="entropy_collapse",
        domain="<b>add</b>",
        message="m & <i>",
        action="log",
        done="logged",
        data={},
    )
    log.close()
    page = write_report(run).read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;add&lt;/b&gt;" in page
    assert "sandbox outcome counts: no data in this run" in page
    assert "pipeline stage utilisation" in page and page.count("data:image/png;base64,") >= 3


def test_sandbox_outcomes_are_counted(tmp_path):
    from posttrain.report.data import load_run
    from posttrain.trace import RolloutRecord, TraceStore

    run = tmp_path / "sb"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    base = dict(
        task_id="t",
        domain="code",
        split="train",
        difficulty=1,
        taskset_version="v",
        group_id="1:0",
        model_version=0,
        sampling={},
        prompt="p",
        completion="c",
        completion_tokens=1,
        finish_reason="stop",
        reward=0.0,
        passed=False,
        parts={},
        reason="",
        verifier="tests@1",
        timings={},
    )
    store = TraceStore(run / "trace.db")
    store.write_rollouts(
        [
            RolloutRecord(**base, exec_result={"status": "ok"}),
            RolloutRecord(**base, exec_result={"status": "ok"}),
            RolloutRecord(**base, exec_result={"status": "timeout"}),
            RolloutRecord(**{**base, "reward": None}, error_kind="sandbox", error="died"),
            RolloutRecord(**{**base, "domain": "add"}),
        ]
    )
    store.add_event(
        "alarm", "domain code paused: its verifier failed 20 groups in a row", domain="code", data={"fail_streak": 20}
    )
    store.add_event("alarm", "from the monitor", step=1, domain="code", data={"alarm": "audit_failure"})
    store.close()
    (other,) = load_run(run).alarms  # the monitor's own alarms are read from metrics.jsonl, not twice
    assert other["alarm"] == "pipeline" and other["message"].startswith("domain code paused")
    assert load_run(run).sandbox == {"code": {"sandbox:ok": 2, "sandbox:timeout": 1, "error:sandbox": 1}}
    assert "sandbox outcome counts</figcaption>" in write_report(run).read_text()


def test_report_refuses_a_non_run(tmp_path):
    with pytest.raises(ConfigError, match="not a run directory"):
        write_report(tmp_path)


@pytest.mark.parametrize("logged", [False, True])
def test_mismatch_and_sync_probe_are_plotted(tmp_path, logged):
    run = tmp_path / "mm"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    log = MetricsLog(run / "metrics.jsonl")
    for step in range(1, 4):
        extra = (
            dict(
                mismatch_abs_mean=0.01 * step,
                mismatch_abs_max=0.1 * step,
                mismatch_k3=1e-4 * step,
                mismatch_outside=0.0,
                mismatch_corrected=0.0,
                sync_probe_max_diff=1e-6,
            )
            if logged
            else {}
        )
        log.write("train", step, reward_mean=0.1, reward_by_domain={"add": 0.1}, **extra)
    log.close()
    page = write_report(run).read_text()
    caption = "the engine&#x27;s behaviour log-probs against the trainer&#x27;s own"
    assert caption in page
    assert (f'alt="{caption}' in page) == logged  # a plot of the logged figures
    assert ("(engine.verify_sync): no data in this run" in page) != logged  # or says there are none


def test_staleness_section_counts_requeued_and_dropped_groups_by_domain_and_length(tmp_path):
    run = tmp_path / "stale"
    run.mkdir()
    (run / "config.yaml").write_text("pipeline:\n  mode: async\n")
    log = MetricsLog(run / "metrics.jsonl")
    log.write("train", 1, reward_mean=0.1, pipe_async=1.0, pipe_staleness_max=1.0)
    counts = {"stale_requeued_domain_code": 3.0, "stale_dropped_domain_code": 1.0, "stale_requeued_len_256-1023": 3.0}
    log.write("train", 2, reward_mean=0.2, pipe_async=1.0, pipe_staleness_max=2.0, **counts)
    log.close()
    page = write_report(run).read_text()
    assert "largest staleness trained on: 2 weight versions" in page
    assert '<td class="l">domain</td><td class="l">code</td><td>3</td><td>1</td>' in page
    assert '<td class="l">completion tokens</td><td class="l">256-1023</td><td>3</td><td>0</td>' in page
