"""Remote inference: a trainer process and a separate `posttrain serve` process run the
loop with weight updates over HTTP; every rollout's version is within the staleness bound."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from posttrain.configs import load_config
from posttrain.configs.engine import EngineConfig
from posttrain.domains import registry
from posttrain.domains.base import ProceduralDomain
from posttrain.engine.sync import WeightSync
from posttrain.errors import ConfigError
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore
from serve_process import posttrain_serve

ADMIN = "sync-test-admin-token"
"""The admin token the server subprocess and the trainer (the openai engine) share."""


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch):
    """Both sides read POSTTRAIN_ADMIN_TOKEN: the server when it starts, the engine on each push."""
    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", ADMIN)


TINY = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_tokens=6",
    "rollout.dynamic_sampling=false",
    "eval.tasks_per_domain=4",
    "eval.max_tokens=6",
    "run.threads=1",
    "run.progress=false",
    "run.checkpoint_every=0",
    "monitor.report=false",
    "trainer.lr=1e-2",
    "tasks.domains={test_scale_short: {difficulty: 1}}",
]


class _Short:
    """Rewards a completion that stops early: a random base gets mixed rewards, so steps carry signal."""

    name, version = "short", "1"

    def score(self, task, episode):
        from posttrain.types import Score

        ok = episode.finish_reason == "stop" and len(episode.completion) <= 3
        return Score(float(ok), {"outcome": float(ok)}, ok, "" if ok else "too long")


class _ShortDomain(ProceduralDomain):
    name = "test_scale_short"
    category = "test"
    verifier = _Short()

    def generate(self, rng, difficulty):
        text = "".join(rng.choices("abcdef", k=3))
        return f"rev {text}=", text[::-1]


@pytest.fixture
def short_domain(monkeypatch):
    dom = _ShortDomain()
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    return dom


def test_openai_engine_needs_a_url():
    with pytest.raises(ConfigError, match="engine.url"):
        load_config(None, ["engine.type=openai"])
    assert load_config(None, ["engine.type=openai", "engine.url=http://h:1/v1"]).engine.kind == "openai"


def test_engine_kind_and_its_old_name_type(tmp_path):
    """`engine.kind` is the field; `type` is accepted as its old spelling, in a dotted override and in
    YAML; unknown keys (in engine and in engine.vllm) still fail, naming the field."""
    assert load_config(None, ["engine.kind=vllm"]).engine.kind == "vllm"
    assert load_config(None, ["engine.type=vllm"]).engine.kind == "vllm"
    yaml = tmp_path / "c.yaml"
    yaml.write_text("engine:\n  kind: vllm\n  vllm: {memory_fraction: 0.2}\n")
    cfg = load_config(yaml, [])
    assert (cfg.engine.kind, cfg.engine.vllm.memory_fraction) == ("vllm", 0.2)
    yaml.write_text("engine:\n  type: openai\n  url: http://h:1/v1\n")
    assert load_config(yaml, []).engine.kind == "openai"
    with pytest.raises(ConfigError, match="engine.kynd: unknown field"):
        load_config(None, ["engine.kynd=vllm"])
    with pytest.raises(ConfigError, match="engine.vllm.bogus: unknown field"):
        load_config(None, ["engine.vllm.bogus=1"])
    with pytest.raises(ConfigError, match="engine.kind"):
        load_config(None, ["engine.kind=sglang"])
    with pytest.raises(ConfigError, match="engine.url"):
        load_config(None, ["engine.kind=vllm", "engine.url=127.0.0.1:8000"])


@dataclass(frozen=True)
class _C:
    model_version: int


@dataclass(frozen=True)
class _R:
    completion: _C


class _Engine:
    version = 5


def test_stale_groups_are_dropped_and_counted(tmp_path):
    sync = WeightSync(EngineConfig(), _Engine(), None, tmp_path)
    groups = [[_R(_C(5)), _R(_C(5))], [_R(_C(4)), _R(_C(5))], [_R(_C(3))]]
    assert sync.fresh(groups, 0) == [groups[0]]
    assert sync.fresh(groups, 1) == groups[:2]
    assert sync.dropped_stale == 2 + 1


@contextlib.contextmanager
def _serve(model_dir: str) -> Iterator[str]:
    with posttrain_serve(model_dir) as (url, _):
        yield url


def _check_versions(run_dir: Path, url: str, max_staleness: int) -> int:
    train_rows = read_metrics(run_dir / "metrics.jsonl", "train")
    pushed_after = {r["step"]: r["engine_version"] for r in train_rows}
    store = TraceStore(run_dir / "trace.db")
    rows = store.recent(10_000)
    assert len(rows) == store.count() > 0
    for row in rows:
        step = int(row["group_id"].split(":")[0])
        current = pushed_after.get(step - 1, 0)  # the version the trainer had pushed when step began
        assert 0 <= current - row["model_version"] <= max_staleness, (step, current, row["model_version"])
    final = train_rows[-1]["engine_version"]
    assert final >= 1  # weights did travel
    checked = [r for r in train_rows if "sync_verified" in r]  # engine.verify_sync auto: every push checked
    assert checked and all(r["sync_verified"] and r["sync_probe_max_diff"] <= 1e-4 for r in checked)
    assert max(r["model_version"] for r in rows) <= final
    assert httpx.get(url + "/admin/state", timeout=10).status_code == 401
    state = httpx.get(url + "/admin/state", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).json()
    assert state["loaded"][state["stable"]]["weights"] == final
    return final


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_loop_against_separate_server_process(tmp_path, micro_base, lora, short_domain):
    from posttrain.loop import train

    with _serve(micro_base) as url:
        extra = ["trainer.lora={rank: 4, alpha: 8}"] if lora else []
        cfg = load_config(
            None,
            [
                *TINY,
                f"model.path={micro_base}",
                f"run.out_dir={tmp_path}",
                "run.name=remote",
                "run.steps=3",
                "engine.type=openai",
                f"engine.url={url}/v1",
                *extra,
            ],
        )
        result = train(cfg, log=lambda *_: None)
        _check_versions(result.run_dir, url, cfg.pipeline.max_staleness)
        synced = sorted((result.run_dir / "weights").iterdir())
        assert len(synced) <= cfg.engine.keep_versions
        kinds = {p.name for p in synced[-1].iterdir()}
        assert ("adapter_model.safetensors" in kinds) == lora and ("model.safetensors" in kinds) == (not lora)
        _server_serves_the_trained_weights(url, micro_base, result.run_dir, tmp_path)


@pytest.mark.slow
def test_fsdp_loop_under_torchrun_against_server(tmp_path, micro_base):
    """Two torchrun ranks with trainer.fsdp: rank 0 runs the loop, rank 1 follows its trainer calls."""
    worker = Path(__file__).with_name("sync_loop_worker.py")
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    with _serve(micro_base) as url:
        overrides = [
            *TINY,
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=fsdp",
            "run.steps=3",
            "run.checkpoint_every=2",
            "engine.type=openai",
            f"engine.url={url}/v1",
            "trainer.fsdp=true",
            "model.device=cpu",
        ]
        proc = subprocess.run(
            [
                str(torchrun),
                "--nproc_per_node=2",
                "--rdzv_backend=c10d",
                "--rdzv_endpoint=127.0.0.1:0",
                str(worker),
                *overrides,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        run_dir = tmp_path / "fsdp"
        _check_versions(run_dir, url, 0)
        _server_serves_the_trained_weights(url, micro_base, run_dir, tmp_path)


def _server_serves_the_trained_weights(url: str, base: str, run_dir: Path, tmp: Path) -> None:
    """Greedy tokens from the server equal those of the run's final checkpoint, exported and loaded here."""
    from posttrain.engine.hf import HFEngine
    from posttrain.engine.openai import OpenAIEngine
    from posttrain.model.arch import load_model
    from posttrain.trainer.export import export
    from posttrain.types import GenerationRequest, SamplingParams

    export(run_dir, tmp / "exported", base)
    local = HFEngine(*load_model(tmp / "exported"))
    remote = OpenAIEngine.from_model_dir(url + "/v1", "posttrain", base)
    try:
        req = [GenerationRequest((4, 30, 31, 5), SamplingParams(max_tokens=8, temperature=0.0))]
        want, got = local.generate(req)[0][0], remote.generate(req)[0][0]
        assert got.token_ids == want.token_ids
        assert all(abs(a - b) < 1e-4 for a, b in zip(got.logprobs, want.logprobs))
    finally:
        remote.close()


def test_loop_in_process_with_lora(tmp_path, micro_base, short_domain):
    """The default hf engine shares the module peft injected adapters into: it samples the adapted policy."""
    from posttrain.loop import train
    from posttrain.trainer.checkpoint import latest_checkpoint

    cfg = load_config(
        None,
        [
            *TINY,
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=lora",
            "run.steps=2",
            "trainer.lora={rank: 4, alpha: 8}",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert rows[-1]["engine_version"] >= 1 and rows[-1]["engine_dropped_stale"] == 0
    ckpt = latest_checkpoint(result.run_dir)
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    assert not (result.run_dir / "weights").exists()  # in process: nothing written for the engine
