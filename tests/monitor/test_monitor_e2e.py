"""The monitor in real training runs on the micro base: planted hackable verifier, planted entropy
collapse, report, explain.

No test here depends on where a training trajectory happens to go: the collapse is planted
(`plant_collapse`: from a fixed step the policy's logits are sharpened ~50x), so the alarm
fires by construction, with a wide margin, on any CPU."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from monitor_testlib import TINY, Coin, Letters, plant_collapse, plant_digit_hack

from posttrain.cli import main
from posttrain.configs import load_config
from posttrain.domains import registry
from posttrain.errors import VerifierError
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore


@pytest.fixture()
def planted(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "test_letters", Letters())
    monkeypatch.setitem(registry._REGISTRY, "test_coin", Coin())


def _train(tmp_path, base, name, *extra):
    from posttrain.loop import train

    cfg = load_config(None, [*TINY, f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}", *extra])
    return train(cfg, log=lambda *_: None)


def _alarms(run_dir, kind):
    return [r for r in read_metrics(run_dir / "metrics.jsonl", "alarm") if r["alarm"] == kind]


def test_probe_refuses_hackable_verifier(tmp_path, micro_base, planted):
    # alone, the run refuses to start
    with pytest.raises(VerifierError, match="test_letters: verifier digit_hack@1 accepts"):
        _train(tmp_path, micro_base, "alone", "run.steps=2", "tasks.domains={test_letters: {difficulty: 1}}")
    # beside a sound domain, the hackable one is never trained on
    result = _train(
        tmp_path,
        micro_base,
        "mixed",
        "run.steps=2",
        "tasks.domains={test_letters: {difficulty: 1}, reverse: {difficulty: 1}}",
    )
    store = TraceStore(result.run_dir / "trace.db")
    assert store.recent(1000, "test_letters") == []
    assert store.count() == 2 * 8 * 8  # every draw went to the sound domain
    (event,) = [e for e in store.events("alarm") if e["domain"] == "test_letters"]
    assert "refusing to train on it" in event["message"]
    probes = {r["domain"]: r for r in read_metrics(result.run_dir / "metrics.jsonl", "probe")}
    assert probes["test_letters"]["ok"] is False and probes["reverse"]["ok"] is True


def test_reward_hacking_alarm_fires_with_probe_off(tmp_path, micro_base, planted, monkeypatch):
    # the policy 'learns' the digit hack at step 4 (planted: train reward 0 before, 1 from then on);
    # a 3-letter answer never fits in 2 tokens, so held-out accuracy stays 0 by construction
    plant_digit_hack(monkeypatch, 4)
    result = _train(
        tmp_path,
        micro_base,
        "hack",
        "run.steps=10",
        "eval.every_steps=4",
        "rollout.max_tokens=2",
        "monitor.probes.enabled=false",
        "tasks.domains={test_letters: {difficulty: 1}}",
    )
    (hit, *_) = _alarms(result.run_dir, "reward_hacking")
    # checked at evaluations (steps 4, 8): step 8 is the first whose 3-step recent window is all hacked
    assert hit["step"] == 8 and hit["domain"] == "test_letters"
    assert hit["data"]["train_recent"] - hit["data"]["train_baseline"] > 0.9  # the rule needs a rise of 0.15
    assert hit["data"]["heldout_last"] <= hit["data"]["heldout_first"] + 0.02
    # the audit by the stricter check sees it in the first hacked step: 8 top-reward rollouts, all failing
    assert _alarms(result.run_dir, "audit_failure")[0]["step"] == 4
    events = TraceStore(result.run_dir / "trace.db").events("alarm")
    assert any(e["message"].startswith("reward hacking suspected in test_letters") for e in events)


# TINY's alarm windows: a 3-step baseline, then 3-step recent windows
PLANT = 4  # steps 1-3 (the baseline) sample from the untouched policy, steps 4 on from the collapsed one
FIRST_FULL_WINDOW = PLANT + 2  # the first step whose recent window (PLANT..PLANT+2) is all collapsed


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory, micro_base):
    """A run whose policy collapses at step PLANT (shared by the report tests)."""
    mp, plant = pytest.MonkeyPatch(), pytest.MonkeyPatch()
    mp.setitem(registry._REGISTRY, "test_coin", Coin())
    plant_collapse(plant, PLANT)
    try:
        run_dir = _train(
            tmp_path_factory.mktemp("runs"),
            micro_base,
            "collapse",
            "run.steps=10",
            "monitor.probes.enabled=false",
            "tasks.domains={test_coin: {difficulty: 1}}",
        ).run_dir
    finally:
        plant.undo()  # the plant ends with this run; the domain stays registered for the report tests
    try:
        yield run_dir
    finally:
        mp.undo()


def test_entropy_collapse_alarm_on_planted_collapse(collapsed):
    (hit,) = _alarms(collapsed, "entropy_collapse")  # fires once: the collapse never clears
    # not before the collapse fills a window, and no later than the first window it fills
    assert PLANT < hit["step"] <= FIRST_FULL_WINDOW
    assert hit["data"]["recent"] < 0.05 * hit["data"]["baseline"]  # the rule needs < 0.25: a wide margin
    assert any(
        e["data"] and '"entropy_collapse"' in e["data"] for e in TraceStore(collapsed / "trace.db").events("alarm")
    )


def test_no_entropy_alarm_at_sane_lr(tmp_path, micro_base, planted):
    result = _train(
        tmp_path,
        micro_base,
        "sane",
        "run.steps=10",
        "monitor.probes.enabled=false",
        "tasks.domains={test_coin: {difficulty: 1}}",
    )
    assert _alarms(result.run_dir, "entropy_collapse") == []
    assert len(read_metrics(result.run_dir / "metrics.jsonl", "monitor")) == 10


def test_stop_action_ends_the_run(tmp_path, micro_base, planted, monkeypatch):
    plant_collapse(monkeypatch, PLANT)
    result = _train(
        tmp_path,
        micro_base,
        "stop",
        "run.steps=12",
        "monitor.probes.enabled=false",
        "monitor.alarms.entropy_collapse.action=stop",
        "tasks.domains={test_coin: {difficulty: 1}}",
    )
    (hit,) = _alarms(result.run_dir, "entropy_collapse")
    assert result.steps == hit["step"] <= FIRST_FULL_WINDOW < 12
    assert [r["step"] for r in read_metrics(result.run_dir / "metrics.jsonl", "train")][-1] == hit["step"]
    assert (result.run_dir / "report.html").is_file()


def test_report_is_self_contained(collapsed):
    page = (collapsed / "report.html").read_text()
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) >= 8 and all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r'(src|href)="(https?:|//|/)', page)
    assert "entropy_collapse" in page and "held-out accuracy before and after" in page


def test_report_command_and_trace_explain(collapsed, tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.html"
    assert main(["report", str(collapsed), "--out", str(out)]) == 0 and out.stat().st_size > 10_000
    store = TraceStore(collapsed / "trace.db")
    used = store._db.execute("SELECT id FROM rollouts WHERE train_step IS NOT NULL LIMIT 1").fetchone()[0]
    capsys.readouterr()
    assert main(["trace", "explain", used[:10], "--run", str(collapsed)]) == 0
    text = capsys.readouterr().out
    for needle in (
        "-- prompt",
        "-- sampling parameters",
        "temperature=1.0",
        "-- completion",
        "-- execution result",
        "-- verifier coin_flip@1",
        "reward parts: outcome=",
        "used by train step",
        "advantage",
        "ratio",
        "clipped",
    ):
        assert needle in text, needle
    assert main(["trace", "explain", "nosuchid", "--run", str(collapsed)]) == 2
    # without --run, the newest run under ./runs holding the id is found
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a").symlink_to(collapsed)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["trace", "explain", used]) == 0 and f"rollout {used}" in capsys.readouterr().out
    assert main(["trace", str(collapsed)]) == 0 and "alarm(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_report_opens_in_headless_chromium(collapsed, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on this machine (apt-get install -y chromium)")
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,2400",
            f"--screenshot={shot}",
            (collapsed / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 20_000


@pytest.mark.heavy  # trains the run twice over (about 20-45 s)
def test_lowered_weight_survives_resume_exactly(tmp_path, micro_base, planted, monkeypatch):
    """Resume == uninterrupted, compared in one process on one machine (a property of exact
    resume, not of any trajectory); the collapse that lowers a weight before the checkpoint is planted."""
    import posttrain.loop as loop
    from posttrain.loop import train
    from posttrain.monitor.actions import LowerWeight

    plant_collapse(monkeypatch, PLANT)  # fires at step FIRST_FULL_WINDOW at the latest, before the step-7 checkpoint
    applied, apply = [], loop.apply_actions

    def recording(actions, pool, stop="", cm=None):  # the loop's own apply_actions, watched
        out = apply(actions, pool, stop, cm)
        applied.extend((a.domain, pool.weight(a.domain)) for a in actions if isinstance(a, LowerWeight))
        return out

    monkeypatch.setattr(loop, "apply_actions", recording)
    extra = [
        "monitor.probes.enabled=false",
        "monitor.alarms.entropy_collapse.action=lower_weight",
        "tasks.domains={test_coin: {difficulty: 1}, reverse: {difficulty: 1}}",
    ]
    full = _train(tmp_path, micro_base, "full", "run.steps=8", *extra)
    # every lower_weight alarm reached the pool through the loop: weight 1 -> 0.5 per firing
    assert [d for d, _ in applied] == [a["domain"] for a in _alarms(full.run_dir, "entropy_collapse")]
    assert all(w == 0.5 ** [x for x, _ in applied[: i + 1]].count(d) for i, (d, w) in enumerate(applied))
    part = _train(tmp_path, micro_base, "part", "run.steps=7", *extra)  # its checkpoint holds the lowered weight
    cfg_path = part.run_dir / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("steps: 7", "steps: 8"))
    resumed = train(None, resume=part.run_dir, log=lambda *_: None)
    rows = lambda run: sorted((r["task_id"], r["completion"]) for r in TraceStore(run / "trace.db").recent(10_000))  # noqa: E731
    fired = lambda run: [(a["step"], a["domain"], a["done"]) for a in _alarms(run, "entropy_collapse")]  # noqa: E731
    assert all(done.startswith(f"weight of {d} x0.5") for _, d, done in fired(full.run_dir))
    assert FIRST_FULL_WINDOW < 7
    assert {d for step, d, _ in fired(full.run_dir) if step <= 7} == {
        "test_coin",
        "reverse",
    }  # lowered before the checkpoint
    assert fired(resumed.run_dir) == fired(full.run_dir)  # the history was rebuilt from metrics.jsonl on resume
    assert rows(full.run_dir) == rows(resumed.run_dir)  # same draws after the weight change, same samples
