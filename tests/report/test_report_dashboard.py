"""The report's dashboard: training-dynamics curves (one run, several overlaid, honest gaps), the
sample table per evaluation, unreadable records named while the rest renders, atomic writes."""

from __future__ import annotations

import json
import os

import pytest

from posttrain.metrics_log import MetricsLog
from posttrain.report import dashboard, write_report
from posttrain.report import html as report_html
from posttrain.report.data import load_run

FULL = dict(
    loss=0.5,
    grad_norm=1.5,
    lr=3e-4,
    kl=0.01,
    entropy=0.9,
    clip_frac=0.1,
    tokens_sampled=400,
    rollout_s=1.5,
    seconds=0.5,
    peak_rss_mib=900.0,
)


def _run(tmp_path, name, rows=FULL, steps=3):
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    log = MetricsLog(run / "metrics.jsonl")
    for step in range(1, steps + 1):
        log.write("train", step, reward_mean=0.1 * step, **rows)
    log.close()
    return run


@pytest.fixture
def no_plots(monkeypatch):
    """Every figure of the page stubbed (the HTML is what these tests read; drawing costs seconds)."""
    monkeypatch.setattr(report_html, "_figure", lambda *a, **k: "data:image/png;base64,x")
    monkeypatch.setattr(report_html, "_png", lambda fig: _closed(fig) or "data:image/png;base64,x")
    monkeypatch.setattr(dashboard, "_panel", lambda curve, lines: "data:image/png;base64,x")


def _closed(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.fixture
def panels(monkeypatch):
    """The panels drawn, as {title: {line label: points}} (the figure itself is not rendered)."""
    drawn: dict = {}

    def fake(curve, lines):
        drawn[curve.title] = lines
        return f"data:image/png;base64,{curve.title}"

    monkeypatch.setattr(dashboard, "_panel", fake)
    return drawn


def test_every_curve_is_drawn_from_the_keys_the_loop_writes(tmp_path, panels):
    page = dashboard.dynamics_section([load_run(_run(tmp_path, "a"))])
    assert "not logged" not in page
    assert set(panels) == {c.title for c in dashboard.CURVES}
    assert panels["loss"] == {"a": [(1, 0.5), (2, 0.5), (3, 0.5)]}
    assert panels["tokens/s"]["a"][0] == (1, 200.0)  # 400 tokens / (1.5 + 0.5) s
    assert panels["step time (s)"]["a"][0] == (1, 2.0)
    assert panels["clip fraction"]["a"][0] == (1, 0.1) and panels["learning rate"]["a"][0] == (1, 3e-4)
    assert panels["peak RSS (MiB)"]["a"][0] == (1, 900.0)


def test_a_metric_not_logged_says_so_instead_of_a_chart(tmp_path, panels):
    rows = {k: v for k, v in FULL.items() if k not in ("clip_frac", "tokens_sampled")}
    page = dashboard.dynamics_section([load_run(_run(tmp_path, "old", rows))])
    assert "clip fraction: not logged in this run (metrics key clip_frac)" in page
    assert "tokens/s: not logged in this run (metrics key tokens_sampled, rollout_s, seconds)" in page
    assert "clip fraction" not in panels and "tokens/s" not in panels and "loss" in panels


def test_an_overlay_draws_a_line_per_run_and_names_both(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(report_html, "_png", lambda fig: figs.append(fig) or _closed(fig) or "data:image/png;base64,x")
    a = load_run(_run(tmp_path, "lr-low"))
    b = load_run(_run(tmp_path, "lr-high", {k: v for k, v in FULL.items() if k != "entropy"}, steps=40))
    loss = next(c for c in dashboard.CURVES if c.title == "loss")
    entropy = next(c for c in dashboard.CURVES if c.title == "entropy")
    dashboard.curve_figure(loss, [a, b])
    assert figs[-1].axes[0].get_legend_handles_labels()[1] == ["lr-low", "lr-high"]
    assert "not logged in lr-high" in dashboard.curve_figure(entropy, [a, b])
    monkeypatch.setattr(dashboard, "_panel", lambda curve, lines: "data:image/png;base64,x")
    page = report_html.render_runs([a, b])
    assert "posttrain runs: lr-low vs lr-high" in page and page.count("<figure") == len(dashboard.CURVES) + 1


def test_kl_is_the_trainers_when_its_loss_has_one_else_the_monitors(tmp_path):
    kl = next(c for c in dashboard.CURVES if c.title == "KL to the reference")
    run = _run(tmp_path, "beta0", {**FULL, "kl": 0.0})
    log = MetricsLog(run / "metrics.jsonl")
    log.write("monitor", 2, kl={})  # a step without a KL measurement
    log.write("monitor", 3, kl={"add": 0.1, "sort": 0.3})
    log.close()
    assert dashboard.series(load_run(run), kl) == [(3, pytest.approx(0.2))]
    assert dashboard.series(load_run(_run(tmp_path, "beta", FULL)), kl) == [(1, 0.01), (2, 0.01), (3, 0.01)]


def test_runs_of_the_same_name_are_told_apart(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    runs = [load_run(_run(tmp_path / "x", "demo")), load_run(_run(tmp_path / "y", "demo"))]
    assert dashboard.labels(runs) == ["x/demo", "y/demo"]


def _item(task, value, ok, completion, error=""):
    return {"task": task, "prompt": f"{task}=", "completion": completion, "value": value, "ok": ok, "error": error}


def test_samples_pick_best_worst_and_the_most_common_failure():
    items = [
        _item("t1", 0.0, False, "12\n"),
        _item("t2", 1.0, True, "7"),
        _item("t3", 0.0, False, "12"),  # the same wrong answer as t1: the most common failure (2 of 4)
        _item("t4", 0.5, False, "1"),
        _item("t5", None, None, "", error="sandbox: died"),  # an infra error: no score, counted as a failure
    ]
    p = dashboard.pick(items)
    assert p["best"]["task"] == "t2" and p["worst"]["task"] == "t1"
    assert p["failure"]["what"] == "answered '12'" and (p["failure"]["count"], p["failure"]["failed"]) == (2, 4)
    assert p["failure"]["item"]["task"] == "t1"
    # ties on the score: the passed item is the best, the failed one the worst
    tie = dashboard.pick([_item("a", 1.0, False, "x"), _item("b", 1.0, True, "y")])
    assert tie["best"]["task"] == "b" and tie["worst"]["task"] == "a"
    # all passed: no failure; one item: best only (not also shown as the worst)
    alone = dashboard.pick([_item("a", 1.0, True, "y")])
    assert alone["failure"] is None and alone["worst"] is None and alone["best"]["task"] == "a"
    # all failed with score 0: no best (a failed item is not shown as one)
    none = dashboard.pick([_item("a", 0.0, False, "x"), _item("b", 0.0, False, "x")])
    assert none["best"] is None and none["worst"]["task"] == "a" and none["failure"]["count"] == 2


def test_samples_table_per_evaluation_newest_open_and_escaped(tmp_path):
    run = _run(tmp_path, "s")
    lines = [
        {"step": 0, "eval": "full", "domains": {"add": [_item("a0", 0.0, False, "<b>9</b>")]}},
        {"step": 5, "eval": "subset", "domains": {"add": [_item("a0", 1.0, True, "4")], "sort": []}},
    ]
    (run / "eval_samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = dashboard.samples_section(load_run(run))
    assert page.index("step 5: fixed subset") < page.index("step 0: full held-out set")
    assert page.startswith("<details open><summary>step 5") and page.count("<details open>") == 1
    assert "&lt;b&gt;9&lt;/b&gt;" in page and "<b>9</b>" not in page
    assert "answered &#x27;&lt;b&gt;9&lt;/b&gt;&#x27; (1 of 1 failed)" in page
    assert dashboard.samples_section(load_run(_run(tmp_path, "none"))).startswith('<p class="empty">no evaluation')


def test_a_resumed_evaluation_keeps_its_last_line(tmp_path):
    run = _run(tmp_path, "r")
    first = {"step": 9, "eval": "full", "domains": {"add": [_item("a", 0.0, False, "old")]}}
    again = {"step": 9, "eval": "full", "domains": {"add": [_item("a", 1.0, True, "new")]}}
    (run / "eval_samples.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(again) + "\n")
    (only,) = load_run(run).samples
    assert only["domains"]["add"][0]["completion"] == "new"


def test_unreadable_records_are_named_and_the_rest_renders(tmp_path, no_plots):
    run = _run(tmp_path, "broken")
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"kind": "train", "step": 4, "loss": 0.4\n')  # cut short: not JSON
        fh.write(json.dumps({"kind": "train", "step": 5, "time": 1.0, **FULL}) + "\n")
    good = {"step": 5, "eval": "subset", "domains": {"add": [_item("a", 1.0, True, "4")]}}
    (run / "eval_samples.jsonl").write_text("[1, 2]\n" + json.dumps(good) + "\n")
    (run / "eval.json").write_text("{not json")
    data = load_run(run)
    assert [r["step"] for r in data.train] == [1, 2, 3, 5] and len(data.samples) == 1
    assert len(data.problems) == 3
    page = write_report(run).read_text()
    assert "Some records could not be read; the rest is shown." in page
    assert "metrics.jsonl:4: corrupt metrics line skipped (not JSON" in page
    assert "eval_samples.jsonl:1: corrupt eval samples line skipped" in page
    assert "eval.json: not JSON" in page and "the held-out tables are left out" in page
    assert "step 5: fixed subset" in page and "Training dynamics" in page and "<h2>Config</h2>" in page


def test_the_page_is_replaced_whole_never_written_in_place(tmp_path, monkeypatch, no_plots):
    run = _run(tmp_path, "atomic")
    page = write_report(run)
    old = page.read_text()
    seen = []
    real_replace = os.replace

    def watch(src, dst):  # at the rename: the old page still whole, the new one whole beside it
        seen.append((page.read_text(), open(src).read()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watch)
    write_report(run)
    ((before, new),) = seen
    assert before == old and new.endswith("</html>\n")

    def fail(self, text):  # a write that dies half-way (disk full)
        open(self, "w").write(text[: len(text) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(type(page), "write_text", fail)
    with pytest.raises(OSError):
        write_report(run)
    assert page.read_text() == old and [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_the_page_lists_the_runs_config_history(tmp_path, no_plots):
    """A resume that changed fields and a branch (lineage.py's config_history.jsonl) are named on the page."""
    run = _run(tmp_path, "extended")
    assert "neither extended nor branched" in write_report(run).read_text()
    entries = [
        {"kind": "branch", "step": 0, "from": "runs/a/checkpoints/step_00000004", "source_step": 4, "source_run": "a"},
        {"kind": "resume", "step": 3, "changes": [{"field": "run.steps", "from": 3, "to": 6}]},
    ]
    (run / "config_history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries) + "not json\n")
    page = write_report(run).read_text()
    assert "branched from runs/a/checkpoints/step_00000004 (step 4 of a)" in page
    assert "resumed at step 3 with run.steps 3 -&gt; 6" in page


def test_speculation_is_plotted_per_depth_domain_and_head_only_when_the_run_has_it(tmp_path, monkeypatch):
    """engine.speculation's acceptance at each depth and per domain, trainer.draft_head's accuracy
    at each depth, and tokens per drafting step of the rollouts and the push probe: one figure of
    four panels, from the keys the loop writes."""
    drawn: dict = {}

    def fake(title, panels, *a, **k):
        drawn[title] = dict(panels)
        return "data:image/png;base64,x"

    monkeypatch.setattr(report_html, "_figure", fake)
    monkeypatch.setattr(report_html, "_png", lambda fig: _closed(fig) or "data:image/png;base64,x")
    monkeypatch.setattr(dashboard, "_panel", lambda curve, lines: "data:image/png;base64,x")
    spec = dict(
        FULL,
        engine_spec_acceptance_d1=0.8,
        engine_spec_acceptance_d2=0.5,
        engine_spec_accepted_len=2.3,
        spec_acceptance_by_domain={"add": 0.7, "sort": 0.9},
        draft_acc=[0.6, 0.4, 0.2],
        engine_spec_step_len=1.8,
        engine_probe_spec_step_len=2.1,
    )
    write_report(_run(tmp_path, "spec", rows=spec))
    got = drawn["speculative decoding"]
    depths, domains, head, step_len = got.values()
    assert step_len == {"rollouts": [(s, 1.8) for s in (1, 2, 3)], "push probe": [(s, 2.1) for s in (1, 2, 3)]}
    assert set(depths) == {"depth 1", "depth 2", "mean accepted length / 10"}
    assert depths["depth 2"] == [(1, 0.5), (2, 0.5), (3, 0.5)] and depths["mean accepted length / 10"][0] == (
        1,
        pytest.approx(0.23),
    )
    assert domains == {"add": [(s, 0.7) for s in (1, 2, 3)], "sort": [(s, 0.9) for s in (1, 2, 3)]}
    assert head["depth 3"] == [(1, 0.2), (2, 0.2), (3, 0.2)]
    drawn.clear()
    write_report(_run(tmp_path, "plain"))
    assert drawn and "speculative decoding" not in drawn
    write_report(_run(tmp_path, "head-only", rows=dict(FULL, draft_acc=[0.5, 0.25])))  # rollouts not drafting
    assert list(drawn["speculative decoding"]) == ["draft head accuracy at each depth (its fit, teacher-forced)"]
