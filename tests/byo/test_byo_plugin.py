"""A plugin package installed into the venv (`pip install -e`) shows up in `posttrain domains` with its
origin, trains, and its verifier is usable by name; a clash of names is an error naming both origins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from byo_testlib import rows, write_jsonl

PKG = Path(__file__).parent / "plugin_pkg"
ENV = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1"}


def _posttrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    build = tmp_path_factory.mktemp("plugin")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", str(PKG)]
    subprocess.run(pip, check=True, env={**ENV, "TMPDIR": str(build)}, capture_output=True, timeout=600)
    try:
        yield
    finally:
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "-y", "-q", "posttrain-plugin-demo"],
            env=ENV,
            capture_output=True,
            timeout=600,
        )
        for leftover in PKG.glob("src/*.egg-info"):
            subprocess.run(["rm", "-rf", str(leftover)], check=False)


def test_plugin_is_listed_and_trains(installed, tmp_path, micro_base):
    listing = _posttrain("domains", "--json", "--no-sample")
    assert listing.returncode == 0, listing.stderr
    row = next(r for r in json.loads(listing.stdout) if r["name"] == "plug_double")
    assert row["origin"].startswith("plugin posttrain-plugin-demo 0.1.0 (posttrain_plugin_demo:Double)")
    data = write_jsonl(tmp_path / "q.jsonl", rows(60))
    cfg = tmp_path / "plug.yaml"
    cfg.write_text(
        "tasks:\n  domains:\n    plug_double: {}\n"
        f"    ends: {{source: {{path: {data}, "
        "fields: {prompt: q, answer: a}, eval_percent: 20}, verifier: {name: last_digit}}\n"
        "rollout: {prompts_per_step: 4, group_size: 4, max_tokens: 6}\neval: {tasks_per_domain: 4, max_tokens: 6}\n"
        f"run: {{steps: 2, threads: 1, progress: false, checkpoint_every: 0, out_dir: {tmp_path}, name: plug}}\n"
        f"model: {{path: {micro_base}}}\nmonitor: {{report: false}}\n"
    )
    run = _posttrain("train", str(cfg))
    assert run.returncode == 0, run.stderr[-2000:]
    table = json.loads((tmp_path / "plug" / "eval.json").read_text())
    assert set(table["after"]["domains"]) == {"plug_double", "ends"}


def test_a_plugin_name_clash_names_both_origins(installed, tmp_path):
    clash = tmp_path / "clash"
    (clash / "clashpkg").mkdir(parents=True)
    (clash / "clashpkg" / "__init__.py").write_text(
        "from posttrain_plugin_demo import Double\n\nclass Again(Double):\n    pass\n"
    )
    dist = clash / "clashpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: clashpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[posttrain.domains]\nplug_double = clashpkg:Again\n")
    env = {**os.environ, "PYTHONPATH": str(clash)}
    got = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "domains", "--no-sample"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert got.returncode == 2
    assert "plug_double" in got.stderr and "plugin clashpkg 0.1 (clashpkg:Again)" in got.stderr
    assert "plugin posttrain-plugin-demo 0.1.0" in got.stderr
