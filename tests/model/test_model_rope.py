"""RoPE options of the embedded base (`base.rope_theta`, `base.rope_scaling`): validated by name,
written into the built model's config, reusing the unscaled base's weights, and leaving the
default base (its cache key, its config, its weights) as it was."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from posttrain.configs import load_config
from posttrain.configs.base import BaseConfig
from posttrain.errors import ConfigError
from posttrain.model import pretrain
from posttrain.model.arch import make_config, position_limit, random_model, rope_settings

MICRO = BaseConfig(preset="micro", steps=2, batch_size=4, threads=1, domains={"add": 1}, max_positions=256)


def with_rope(**fields) -> BaseConfig:
    return BaseConfig.model_validate({**MICRO.model_dump(), **fields})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain, "DEFAULT_CACHE", tmp_path)
    pretrained: list[tuple] = []
    real = pretrain.fit_masked_lm

    def counting(*args, **kwargs):
        pretrained.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrain, "fit_masked_lm", counting)
    return pretrained


def test_the_default_bases_keep_their_cache_keys():
    # computed on main before these fields existed: the demo's base (configs/default.yaml) and
    # the plain default must not be rebuilt
    assert BaseConfig().fingerprint() == "ed0ad328281a"
    assert load_config("configs/default.yaml").base.fingerprint() == "2cbcfbbe2d08"
    assert BaseConfig(rope_theta=10000).fingerprint() == "ed0ad328281a"  # the default, spelt out
    keys = {
        BaseConfig(rope_theta=500000).fingerprint(),
        BaseConfig(rope_scaling={"type": "linear", "factor": 8}).fingerprint(),
        BaseConfig(rope_scaling={"type": "dynamic", "factor": 8}).fingerprint(),
        BaseConfig(rope_scaling={"type": "yarn", "factor": 8}).fingerprint(),
        BaseConfig(rope_scaling={"type": "linear", "factor": 4}).fingerprint(),
    }
    assert len(keys) == 5 and "ed0ad328281a" not in keys  # another RoPE, another cached base


def test_the_default_model_is_built_as_before():
    positions, rope = rope_settings(BaseConfig())
    assert (positions, rope) == (8192, {"rope_type": "default", "rope_theta": 10000.0})
    before = make_config("tiny", 104, 0, 2, 8192)  # the call the build made before these options
    assert make_config("tiny", 104, 0, 2, positions, rope).to_json_string() == before.to_json_string()
    old, _ = random_model("micro", 3, 8192)
    new, _ = random_model("micro", 3, positions, rope)
    for (name, a), (_, b) in zip(old.state_dict().items(), new.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("base.rope_scaling={type: ntk, factor: 2}", "base.rope_scaling.type"),
        ("base.rope_scaling={type: linear, factor: 1}", "base.rope_scaling.factor"),
        ("base.rope_scaling={type: dynamic, factor: 0.5}", "base.rope_scaling.factor"),
        ("base.rope_scaling={type: yarn}", "base.rope_scaling.factor"),
        ("base.rope_scaling={factor: 2}", "base.rope_scaling.type"),
        ("base.rope_scaling={type: linear, factor: 3}", "base.rope_scaling.factor"),  # 8192 / 3 positions
        ("base.rope_scaling={type: yarn, factor: 4, original_max_positions: 4096}", "original_max_positions"),
        ("base.rope_scaling={type: linear, factor: 2, beta_fast: 32}", "base.rope_scaling.beta_fast"),
        ("base.rope_theta=0", "base.rope_theta"),
        ("base.rope_scaling=linear", "base.rope_scaling"),
    ],
)
def test_a_bad_rope_value_is_refused_naming_its_field(override, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert named in str(err.value) and len(str(err.value).splitlines()) == 1


def test_each_scaling_writes_what_transformers_and_vllm_read():
    for kind, positions, extra in [
        ("linear", 1024, {}),
        ("dynamic", 1024, {}),
        ("yarn", 8192, {"original_max_position_embeddings": 1024}),
    ]:
        cfg = BaseConfig(rope_scaling={"type": kind, "factor": 8}, rope_theta=20000)
        got = rope_settings(cfg)
        assert got == (positions, {"rope_type": kind, "rope_theta": 20000.0, "factor": 8.0, **extra}), kind
        assert position_limit(make_config("micro", 104, 0, 2, *got)) == 8192 == cfg.max_positions, kind
    legacy = SimpleNamespace(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 2.0})
    assert position_limit(legacy) == 8192  # a config.json from before transformers 5, read as JSON (the vllm engine)
    nested = SimpleNamespace(max_position_embeddings=4096, rope_parameters={"full_attention": {"rope_type": "linear"}})
    assert position_limit(nested) == 4096 and position_limit(SimpleNamespace()) is None
    stated = BaseConfig(rope_scaling={"type": "yarn", "factor": 8, "original_max_positions": 1024})
    assert stated.learned_positions() == 1024


def test_a_scaled_base_reuses_the_weights_and_changes_only_long_positions(cache):
    plain_dir = pretrain.ensure_base(MICRO, progress=False)
    assert len(cache) == 1
    configs = {k: with_rope(rope_scaling={"type": k, "factor": 4}) for k in ("linear", "dynamic", "yarn")}
    scaled = {kind: pretrain.ensure_base(cfg, progress=False) for kind, cfg in configs.items()}
    assert len(cache) == 1  # no pretraining of their own: the plain base's weights
    assert "with yarn RoPE scaling" in pretrain.build_note(configs["yarn"]) and plain_dir.name in pretrain.build_note(
        configs["yarn"]
    )
    builds = (pretrain.DEFAULT_CACHE / pretrain.BUILDS).read_text().splitlines()
    assert len(builds) == 1  # the build-time log (estimates for other bases) holds the pretraining only
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(plain_dir, local_files_only=True).eval()
    models = {k: AutoModelForCausalLM.from_pretrained(d, local_files_only=True).eval() for k, d in scaled.items()}
    for kind, model in models.items():
        for (name, a), (_, b) in zip(plain.state_dict().items(), model.state_dict().items(), strict=True):
            assert torch.equal(a, b), (kind, name)
        info = json.loads((scaled[kind] / "posttrain_base.json").read_text())
        assert info["weights_of"] == plain_dir.name and info["base_config"]["rope_scaling"]["type"] == kind
    for kind, model in models.items():  # plain transformers reads back what the build wrote
        assert (model.config.max_position_embeddings, model.config.rope_parameters) == rope_settings(configs[kind])
    assert position_limit(models["dynamic"].config) == 256 == position_limit(plain.config)

    ids = torch.randint(3, 100, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base_logits = plain(ids).logits
        # linear: position 4k under factor 4 is position k of the plain base (p / factor, exactly)
        stretched = models["linear"](ids[:, :50], position_ids=torch.arange(50)[None] * 4).logits
        torch.testing.assert_close(stretched, plain(ids[:, :50]).logits, rtol=1e-5, atol=1e-5)
        assert (models["linear"](ids).logits - base_logits).abs().max() > 1e-4  # float noise is about 1e-7
        # dynamic: as the plain base within the learned 64 positions, other past them
        torch.testing.assert_close(models["dynamic"](ids[:, :64]).logits, base_logits[:, :64], rtol=1e-5, atol=1e-5)
        assert (models["dynamic"](ids).logits[:, 64:] - base_logits[:, 64:]).abs().max() > 1e-4
        assert (models["yarn"](ids).logits[:, 64:] - base_logits[:, 64:]).abs().max() > 1e-4


def test_the_engine_takes_the_scaled_length(cache):
    """Linear scaling writes the learned 64 positions as max_position_embeddings (vLLM's rule);
    the hf engine still generates up to base.max_positions (256)."""
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import load_model
    from posttrain.types import GenerationRequest, SamplingParams

    linear = with_rope(rope_scaling={"type": "linear", "factor": 4})
    model, tok = load_model(pretrain.ensure_base(linear, progress=False))
    assert model.config.max_position_embeddings == 64
    request = GenerationRequest(tuple([20] * 250), SamplingParams(max_tokens=50, temperature=0))
    completion = HFEngine(model, tok).generate([request])[0][0]
    assert len(completion.token_ids) == 6 or completion.finish_reason == "stop"  # 250 + 6 = 256 positions


def test_a_rope_theta_is_a_model_of_its_own(cache):
    other = with_rope(rope_theta=1000.0)
    out = pretrain.ensure_base(other, progress=False)
    assert out != pretrain.default_dir(MICRO) and len(cache) == 1  # pretrained, with its own rotation
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_theta"] == 1000.0
