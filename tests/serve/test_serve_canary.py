"""Versions: release into the registry, canary routing, automatic rollback of a broken
version with no failed request, manual promote and rollback."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import openai
import pytest
from serve_helpers import running, save_model

from posttrain.configs.serve import CanaryConfig, ServeConfig
from posttrain.errors import ConfigError
from posttrain.serve.canary import regressions
from posttrain.serve.registry import ModelRegistry
from posttrain.serve.router import Window
from posttrain.serve.server import build_server

PROMPT = [{"role": "user", "content": "sort 312="}]


def _registry(tmp_path, canary_broken: bool) -> ModelRegistry:
    reg = ModelRegistry(tmp_path / "registry")
    reg.release(reg.add(save_model(tmp_path / "good", "micro", seed=0), source="good"))
    reg.release(
        reg.add(save_model(tmp_path / "next", "micro", seed=1, broken=canary_broken), source="next"), canary_share=0.5
    )
    return reg


def test_registry_release_promote_rollback(tmp_path):
    reg = _registry(tmp_path, canary_broken=False)
    assert (reg.state().stable, reg.state().canary, reg.state().canary_share) == ("v1", "v2", 0.5)
    assert [v.name for v in reg.versions()] == ["v1", "v2"]
    reg.rollback("test")
    assert (reg.state().stable, reg.state().canary) == ("v1", None)
    with pytest.raises(ConfigError, match="no canary"):
        reg.promote()
    reg.release(reg.version("v2"))
    reg.promote()
    assert (reg.state().stable, reg.state().canary) == ("v2", None)
    assert [e["action"] for e in reg.state().events] == ["release", "canary", "rollback", "canary", "promote"]
    with pytest.raises(ConfigError, match="not in the registry"):
        reg.version("v9")


def test_regressions_thresholds():
    cfg = CanaryConfig(min_requests=2, max_error_rate_delta=0.1, max_latency_ratio=2.0)
    stable, canary = Window(), Window()
    for _ in range(4):
        stable.add(True, 0.1, 10)
        canary.add(True, 0.1, 10)
    assert regressions(canary, stable, cfg) == []
    canary.add(False, 0.1, 0)
    assert any("error rate" in r for r in regressions(canary, stable, cfg))
    slow = Window()
    for _ in range(3):
        slow.add(True, 0.5, 10)
    assert any("latency" in r for r in regressions(slow, stable, cfg))
    few = Window()
    few.add(False, 0.1, 0)
    assert regressions(few, stable, cfg) == []  # below min_requests: not judged yet


def test_broken_canary_rolled_back_automatically_without_failed_requests(tmp_path):
    reg = _registry(tmp_path, canary_broken=True)
    cfg = ServeConfig(
        registry=str(reg.root),
        canary={"check_interval_s": 0.3, "min_requests": 1, "bad_checks_to_rollback": 2, "probe_domains": []},
    )
    app = build_server(cfg)
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        def ask(i: int) -> tuple[str, str]:
            r = client.chat.completions.create(
                model="posttrain:fast" if i % 2 else "posttrain", messages=PROMPT, max_tokens=4, temperature=0
            )
            return r.model, r.choices[0].finish_reason

        served = []
        deadline = time.monotonic() + 60
        with cf.ThreadPoolExecutor(4) as pool:
            while reg.state().canary is not None and time.monotonic() < deadline:
                served += list(pool.map(ask, range(8)))  # any failure raises here
            served += list(pool.map(ask, range(8)))
        state = reg.state()
        assert state.canary is None and state.stable == "v1"
        assert state.events[-1]["action"] == "rollback" and state.events[-1]["reason"].startswith("automatic")
        assert all(m.startswith("posttrain@v1:") for m, _ in served)  # the broken v2 never answered
        metrics = httpx.get(url + "/metrics").text
        assert 'posttrain_failovers_total{tier="' in metrics and 'version="v2"' in metrics
        assert 'posttrain_rollbacks_total{reason="automatic",version="v2"} 1' in metrics
        assert httpx.get(url + "/health").status_code == 200


def test_manual_promote_and_rollback_endpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", "canary-admin")
    admin = {"Authorization": "Bearer canary-admin"}
    reg = _registry(tmp_path, canary_broken=False)
    cfg = ServeConfig(registry=str(reg.root), canary={"check_interval_s": 3600, "probe_domains": []})
    app = build_server(cfg)
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        models = {
            client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=2).model for _ in range(30)
        }
        assert models == {"posttrain@v1:standard", "posttrain@v2:standard"}  # 50% canary share
        pinned = client.chat.completions.create(model="posttrain@v2:fast", messages=PROMPT, max_tokens=2)
        assert pinned.model == "posttrain@v2:fast"
        assert httpx.post(url + "/admin/promote").status_code == 401  # no token: nothing changes
        assert reg.state().stable == "v1"
        assert httpx.post(url + "/admin/promote", headers=admin).json() == {"stable": "v2", "canary": None}
        assert reg.state().stable == "v2"
        assert httpx.post(url + "/admin/rollback", headers=admin).status_code == 409
        assert (
            client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=2).model
            == "posttrain@v2:standard"
        )


def test_canary_that_cannot_load_is_rolled_back_at_once(tmp_path):
    reg = _registry(tmp_path, canary_broken=False)
    (reg.root / "versions" / "v2" / "model.safetensors").write_bytes(b"not a safetensors file")
    app = build_server(ServeConfig(registry=str(reg.root), canary={"probe_domains": []}))
    with running(app) as url:
        assert httpx.get(url + "/health").json()["canary"] is None
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=2).model.startswith(
            "posttrain@v1"
        )
    assert reg.state().canary is None and "failed to load" in reg.state().events[-1]["reason"]
