"""The `openai` engine against posttrain's own server: ids, log-probs, versions, weight updates."""

from __future__ import annotations

import math

import pytest
from serve_helpers import running, save_model

from posttrain.configs.serve import ServeConfig
from posttrain.engine.hf import HFEngine
from posttrain.engine.openai import OpenAIEngine
from posttrain.errors import ConfigError, GenerationError
from posttrain.model.arch import load_model
from posttrain.serve.server import build_server
from posttrain.types import GenerationRequest, Message, SamplingParams

ADMIN = "engine-test-admin-token"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("oai")
    path = save_model(root / "m", "micro", seed=2)
    save_model(root / "m2", "micro", seed=3)
    (root / "admin.token").write_text(ADMIN + "\n")
    cfg = ServeConfig(model=str(path), canary={"probe_domains": []}, admin={"token_file": str(root / "admin.token")})
    app = build_server(cfg)
    with running(app) as url:
        engine = OpenAIEngine.from_model_dir(url + "/v1", "posttrain", path, admin_token=ADMIN)
        yield engine, path, root
        engine.close()


def test_generate_matches_in_process_engine(setup):
    engine, path, _ = setup
    local = HFEngine(*load_model(path))
    prompt = engine.encode_chat([Message("user", "rev abc=")])
    assert prompt == local.encode_chat([Message("user", "rev abc=")])
    reqs = [
        GenerationRequest(prompt, SamplingParams(max_tokens=12, temperature=1.0, n=3, seed=11)),
        GenerationRequest(prompt[:-2], SamplingParams(max_tokens=5, temperature=0.0, seed=1)),
    ]
    remote, here = engine.generate(reqs), local.generate(reqs)
    for g_remote, g_here in zip(remote, here):
        assert len(g_remote) == len(g_here)
        for a, b in zip(g_remote, g_here):
            assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
            assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a.logprobs, b.logprobs))


def test_update_weights_over_http(setup, monkeypatch):
    engine, path, root = setup
    prompt = (4, 30, 31, 5)
    req = [GenerationRequest(prompt, SamplingParams(max_tokens=8, temperature=0.0))]
    new_local = HFEngine(*load_model(root / "m2"))
    monkeypatch.delenv("POSTTRAIN_ADMIN_TOKEN", raising=False)
    for token in (None, "wrong-token"):  # api_key "none", then a wrong admin token: refused, nothing loaded
        other = OpenAIEngine(engine.base_url, "posttrain", engine.tokenizer, admin_token=token)
        with pytest.raises(GenerationError, match="HTTP 401"):
            other.update_weights(str(root / "m2"))
        other.close()
    assert engine.generate(req)[0][0].model_version == 0
    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", ADMIN)  # the environment variable is read when none is given
    from_env = OpenAIEngine(engine.base_url, "posttrain", engine.tokenizer)
    assert from_env.update_weights(str(path)) == 1  # the same weights again: version 1
    from_env.close()
    assert engine.update_weights(str(root / "m2")) == 2
    out = engine.generate(req)[0][0]
    assert out.model_version == 2
    assert out.token_ids == new_local.generate(req)[0][0].token_ids
    with pytest.raises(GenerationError, match="no config.json|does not exist"):
        engine.update_weights(str(root / "missing"))
    with pytest.raises(ConfigError):
        engine.update_weights({"w": 1})


def test_rejected_request_is_generation_error(setup):
    engine, _, _ = setup
    with pytest.raises(GenerationError, match="rejected"):
        engine.generate([GenerationRequest((4, 999999), SamplingParams(max_tokens=2))])


def test_unreachable_server_is_generation_error(setup):
    _, path, _ = setup
    dead = OpenAIEngine.from_model_dir("http://127.0.0.1:9/v1", "posttrain", path, retries=1, timeout_s=2)
    with pytest.raises(GenerationError, match="failed after 2 attempts"):
        dead.generate([GenerationRequest((4, 5), SamplingParams(max_tokens=2))])


def test_token_id_strings_without_ids(setup):
    engine, _, _ = setup
    assert engine._token_id("token_id:42") == 42
    assert engine._token_id("a") == engine.tokenizer.convert_tokens_to_ids("a")
    with pytest.raises(GenerationError, match="return_token_ids"):
        engine._token_id("abc")


def test_loop_engine_sends_the_token_from_engine_admin_token_file(setup, monkeypatch):
    from posttrain.configs.engine import EngineConfig
    from posttrain.engine.sync import make_engine

    engine, path, root = setup
    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", "not-the-token")  # the file wins over the environment
    cfg = EngineConfig(type="openai", url=engine.base_url, admin_token_file=str(root / "admin.token"))
    loop_engine = make_engine(cfg, None, engine.tokenizer, seed=0)
    try:
        before = engine.generate([GenerationRequest((4, 5), SamplingParams(max_tokens=1))])[0][0].model_version
        assert loop_engine.update_weights(str(path)) == before + 1
    finally:
        loop_engine.close()
    env_only = make_engine(EngineConfig(type="openai", url=engine.base_url), None, engine.tokenizer, seed=0)
    with pytest.raises(GenerationError, match="HTTP 401"):
        env_only.update_weights(str(path))  # the wrong token from the environment is refused
    env_only.close()
