"""The hf engine's inference copy (`engine.generate_dtype`, engine/copy.py): the merged copy computes
the LoRA-wrapped module's function, is refreshed by a push and only by a push, and generates what the
module generates (float32: the same greedy tokens; bfloat16: close log-probs)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))  # scaleout_testlib
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))  # test_pipeline_loop's TINY
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_engine_hf's spread_model
from scaleout_testlib import batch  # noqa: E402
from test_engine_hf import spread_model  # noqa: E402
from test_pipeline_loop import TINY  # noqa: E402

from posttrain.configs.engine import EngineConfig, SpeculationConfig  # noqa: E402
from posttrain.configs.trainer import LoraConfig  # noqa: E402
from posttrain.engine.copy import InferenceCopy, merged_tensors  # noqa: E402
from posttrain.engine.hf import HFEngine, HFEngineConfig  # noqa: E402
from posttrain.engine.sync import hf_config  # noqa: E402
from posttrain.errors import ConfigError, ModelLoadError  # noqa: E402
from posttrain.trainer.lora import apply_lora  # noqa: E402
from posttrain.types import GenerationRequest, SamplingParams  # noqa: E402

PROMPT_IDS = (5, 9, 17, 3, 22, 41, 7)


def lora_model(seed: int = 0):
    """The spread micro model with LoRA adapters whose B is not zero (so the adapters change the
    function, as after training)."""
    model, tok = spread_model(seed)
    wrapped = apply_lora(model, LoraConfig(rank=4, alpha=8))
    nudge(wrapped, seed)
    return wrapped, tok


def nudge(model, seed: int, scale: float = 0.2) -> None:
    """Move every adapter weight, as an optimizer step would (in place)."""
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def logits(model, ids=PROMPT_IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_a_float32_copy_computes_the_adapted_function_and_changes_only_when_refreshed():
    model, _ = lora_model()
    base_only = copy.deepcopy(model)
    with base_only.disable_adapter():
        plain = logits(base_only)
    held = InferenceCopy(model, "float32")
    assert not any(type(m).__name__.endswith("LoraLayer") or hasattr(m, "lora_A") for m in held.model.modules())
    before = logits(model)
    assert (before - plain).abs().max() > 1e-2  # the adapters change the function: the test can fail
    torch.testing.assert_close(logits(held.model), before, atol=2e-5, rtol=0)
    nudge(model, 1)  # the trainer's step: in place, on the module only
    after = logits(model)
    torch.testing.assert_close(logits(held.model), before, atol=2e-5, rtol=0)  # not seen before a refresh
    held.refresh()
    torch.testing.assert_close(logits(held.model), after, atol=2e-5, rtol=0)


def test_the_copy_shares_no_storage_with_the_module():
    model, _ = lora_model()
    held = InferenceCopy(model, "float32")
    theirs = {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    assert not theirs & {t.untyped_storage().data_ptr() for t in held.model.state_dict().values()}
    assert not any(p.requires_grad for p in held.model.parameters())


def test_merged_tensors_names_the_plain_model_and_adds_each_adapters_delta():
    model, _ = lora_model()
    merged = dict(merged_tensors(model))
    assert not [k for k in merged if "lora_" in k or "base_layer" in k or k.startswith("base_model.")]
    name = next(k for k in merged if k.endswith("q_proj.weight"))
    layer = model.get_base_model().get_submodule(name.removesuffix(".weight"))
    expected = layer.base_layer.weight + (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * 2.0
    torch.testing.assert_close(merged[name], expected)  # alpha / r = 8 / 4, worked out by hand


def test_a_bfloat16_copy_is_bfloat16_and_close():
    model, _ = lora_model()
    held = InferenceCopy(model, "bfloat16")
    assert {p.dtype for p in held.model.parameters()} == {torch.bfloat16}
    full, half = logits(model).log_softmax(-1), logits(held.model).log_softmax(-1)
    assert (full - half).abs().mean() < 0.05  # bf16 rounding of a micro model: about 1e-2


def test_the_engine_generates_with_the_copy_and_follows_each_push():
    model, tok = lora_model()
    shared = HFEngine(model, tok, seed=0)
    copied = HFEngine(model, tok, config=HFEngineConfig(generate_dtype="float32"), seed=0)
    assert copied.model is not model and copied.source is model
    req = [GenerationRequest(PROMPT_IDS, SamplingParams(n=2, max_tokens=12, temperature=0.0))]
    first = [c.token_ids for c in shared.generate(req)[0]]
    assert [c.token_ids for c in copied.generate(req)[0]] == first
    nudge(model, 2, scale=1.0)  # a large step: the greedy path moves
    moved = [c.token_ids for c in shared.generate(req)[0]]
    assert moved != first
    assert [c.token_ids for c in copied.generate(req)[0]] == first  # no push yet: the old weights
    assert copied.update_weights(None) == 1
    assert [c.token_ids for c in copied.generate(req)[0]] == moved


def test_bfloat16_log_probs_stay_near_the_modules():
    model, tok = lora_model()
    shared = HFEngine(model, tok, seed=0)
    half = HFEngine(model, tok, config=HFEngineConfig(generate_dtype="bfloat16"), seed=0)
    req = [GenerationRequest(PROMPT_IDS, SamplingParams(n=1, max_tokens=8, temperature=0.0))]
    out = half.generate(req)[0][0]
    score = shared.generate([GenerationRequest(PROMPT_IDS, SamplingParams(n=1, max_tokens=8, temperature=0.0))])
    n = min(len(out.token_ids), len(score[0][0].token_ids))
    same = next((i for i in range(n) if out.token_ids[i] != score[0][0].token_ids[i]), n)
    assert same >= 1
    diffs = [abs(a - b) for a, b in zip(out.logprobs[:same], score[0][0].logprobs[:same])]
    assert max(diffs) < 0.1


def test_the_config_reaches_the_engine_and_refuses_the_head():
    cfg = EngineConfig.model_validate({"generate_dtype": "bfloat16"})
    assert hf_config(cfg).generate_dtype == "bfloat16"
    with pytest.raises(ValueError, match="generate_dtype"):
        EngineConfig.model_validate({"generate_dtype": "float16"})
    model, tok = lora_model()
    head = HFEngineConfig(generate_dtype="bfloat16", speculation=SpeculationConfig(kind="head"))
    with pytest.raises(ConfigError, match="generate_dtype bfloat16"):
        HFEngine(model, tok, config=head, seed=0)
    with pytest.raises(ConfigError, match="not one of"):
        InferenceCopy(model, "float16")


def test_the_async_pipelines_detached_engine_copies_the_copy_once():
    from posttrain.pipeline.step import detached_copy

    model, tok = lora_model()
    copied = HFEngine(model, tok, config=HFEngineConfig(generate_dtype="float32"), seed=0)
    twin = detached_copy(copied)
    assert twin.config.generate_dtype == "model" and twin.model is not copied.model
    req = [GenerationRequest(PROMPT_IDS, SamplingParams(n=1, max_tokens=10, temperature=0.0))]
    assert [c.token_ids for c in twin.generate(req)[0]] == [c.token_ids for c in copied.generate(req)[0]]


@pytest.mark.parametrize("pushed", [True, False])
def test_each_push_refreshes_the_copy_from_the_trainers_step(tmp_path, pushed):
    """What the loop does after each optimizer step (`WeightSync.push`): the copy then computes the
    stepped module's function; without the push it still computes the old one."""

    from posttrain.configs.trainer import TrainerConfig
    from posttrain.engine.sync import WeightSync
    from posttrain.trainer.trainer import Trainer

    model, tok = spread_model(0)
    trainer = Trainer(model, TrainerConfig(lr=5e-2, lora=LoraConfig(rank=4, alpha=8)))
    engine = HFEngine(trainer.model, tok, config=HFEngineConfig(generate_dtype="float32"), seed=0)
    sync = WeightSync(EngineConfig.model_validate({"generate_dtype": "float32"}), engine, trainer, tmp_path)
    before = logits(engine.model)
    for s in range(2):
        assert trainer.step(batch(10 + s)).outcome == "applied"
        if pushed:
            assert sync.push() == s + 1
    now = logits(trainer.model)
    assert (now - before).abs().max() > 1e-3  # the steps moved the function: the test can fail
    torch.testing.assert_close(logits(engine.model), now if pushed else before, atol=2e-5, rtol=0)


def test_auto_is_bfloat16_only_where_the_cpu_multiplies_bf16_in_hardware():
    from posttrain.engine.copy import resolve

    cpu = torch.device("cpu")
    assert resolve("auto", cpu, frozenset({"avx2", "avx512f", "avx512_bf16"})) == "bfloat16"
    assert resolve("auto", cpu, frozenset({"amx_bf16", "amx_tile"})) == "bfloat16"
    assert resolve("auto", cpu, frozenset({"avx2", "avx512f"})) == "model"  # bf16 emulated: slower than fp32
    assert resolve("auto", cpu, frozenset()) == "model"  # flags unreadable (not Linux)
    assert resolve("float32", cpu, frozenset()) == "float32" and resolve("model", cpu) == "model"


def test_auto_under_a_drafting_head_generates_with_the_module(monkeypatch):
    import posttrain.engine.hf as hf

    monkeypatch.setattr(hf, "resolve_dtype", lambda kind, device: "bfloat16" if kind == "auto" else kind)
    model, tok = lora_model()
    assert HFEngine(model, tok, config=HFEngineConfig(generate_dtype="auto"), seed=0).generates_with == "bfloat16"
    head = HFEngineConfig(generate_dtype="auto", speculation=SpeculationConfig(kind="head"))
    with pytest.raises(ConfigError, match="no draft head to draft with"):  # the head's own error
        HFEngine(model, tok, config=head, seed=0)


def test_the_memory_estimate_counts_the_copy(micro_base):
    from posttrain.configs import load_config
    from posttrain.model.arch import load_model
    from posttrain.trainer.fit import estimate

    model = load_model(micro_base)[0]
    params = sum(p.numel() for p in model.parameters())
    terms = {
        kind: estimate(load_config(None, [f"engine.generate_dtype={kind}"]), model).terms.get("inference copy", 0)
        for kind in ("model", "auto", "bfloat16", "float32")
    }
    assert terms == {"model": 0, "auto": 2 * params, "bfloat16": 2 * params, "float32": 4 * params}


def test_a_verified_push_to_a_bf16_copy_passes_at_the_bf16_tolerance(tmp_path):
    """engine.verify_sync on an hf engine generating with a bf16 copy: the probe's tolerance is
    bf16's (5e-2), not the float32 trainer's (1e-4), and a push passes it."""

    from posttrain.configs.trainer import TrainerConfig
    from posttrain.engine.probe import TOLERANCE
    from posttrain.engine.sync import WeightSync
    from posttrain.trainer.trainer import Trainer

    model, tok = spread_model(0, max_positions=1024)
    trainer = Trainer(model, TrainerConfig(lr=5e-2, lora=LoraConfig(rank=4, alpha=8)))
    cfg = EngineConfig.model_validate({"generate_dtype": "bfloat16", "verify_sync": "on", "verify_prompt_tokens": 16})
    engine = HFEngine(trainer.model, tok, config=hf_config(cfg), seed=0)
    sync = WeightSync(cfg, engine, trainer, tmp_path)
    assert sync.probe.tolerance == TOLERANCE["bfloat16"]
    assert trainer.step(batch(10)).outcome == "applied"
    assert sync.push() == 1
    fp32 = HFEngine(trainer.model, tok, config=HFEngineConfig(generate_dtype="float32"), seed=0)
    assert (
        WeightSync(EngineConfig.model_validate({"verify_sync": "on"}), fp32, trainer, tmp_path).probe.tolerance
        == (TOLERANCE["float32"])
    )


def test_evaluation_generates_with_the_module_and_carries_the_pushed_version():
    """Held-out evaluation measures the policy's own weights: the loop's evaluator gets the module's
    twin of an engine that generates with a copy (same greedy tokens as the module, the engine's
    version after every push), and `posttrain eval`'s config asks for the module."""
    from posttrain.engine.sync import evaluation_engine

    model, tok = lora_model()
    plain = HFEngine(model, tok, seed=0)
    assert evaluation_engine(plain) is plain
    half = HFEngine(model, tok, config=HFEngineConfig(generate_dtype="bfloat16"), seed=0)
    twin = evaluation_engine(half)
    assert twin is not half and twin.model is model and twin.generates_with == "model"
    req = [GenerationRequest(PROMPT_IDS, SamplingParams(n=1, max_tokens=12, temperature=0.0))]
    assert [c.token_ids for c in twin.generate(req)[0]] == [c.token_ids for c in plain.generate(req)[0]]
    assert [c.logprobs for c in twin.generate(req)[0]] == [c.logprobs for c in plain.generate(req)[0]]
    half.update_weights(None)
    half.update_weights(None)
    assert twin.version == half.version == 2 and twin.generate(req)[0][0].model_version == 2
    cfg = EngineConfig.model_validate({"generate_dtype": "bfloat16"})
    assert hf_config(cfg, evaluation=True).generate_dtype == "model"


@pytest.fixture(scope="module")
def spread_dir(tmp_path_factory):
    """The spread micro model saved as a model folder (its greedy paths move under bf16 rounding)."""
    from posttrain.model.tokenizer import save_tokenizer

    model, tok = spread_model(3)
    out = tmp_path_factory.mktemp("spread") / "model"
    model.save_pretrained(out)
    save_tokenizer(tok, out)
    return out


def _before_completions(tmp_path, model_dir, name: str, generate_dtype: str) -> list:
    import json

    from posttrain.configs import load_config
    from posttrain.loop import train

    overrides = [f"model.path={model_dir}", f"run.out_dir={tmp_path}", f"run.name={name}", "run.steps=1"]
    more = ["eval.tasks_per_domain=16", "eval.max_tokens=24"]
    cfg = load_config(None, [*TINY, *overrides, f"engine.generate_dtype={generate_dtype}", *more])
    run_dir = train(cfg, log=lambda *_: None).run_dir
    first = json.loads((run_dir / "eval_samples.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0
    return [x["completion"] for d in sorted(first["domains"]) for x in first["domains"][d]]


@pytest.mark.parametrize("evaluates_the_module", [True, False])
def test_posttrain_train_evaluates_the_policys_own_weights(tmp_path, spread_dir, monkeypatch, evaluates_the_module):
    """`posttrain train` with a bf16 rollout copy evaluates held-out with the module: the before's
    greedy completions equal a float32 run's; the control (the evaluator handed the copy's engine)
    differs, so the comparison can fail."""
    if not evaluates_the_module:
        import posttrain.engine.sync as sync

        monkeypatch.setattr(sync, "evaluation_engine", lambda engine: engine)
    full = _before_completions(tmp_path, spread_dir, "full", "model")
    half = _before_completions(tmp_path, spread_dir, "half", "bfloat16")
    assert len(full) >= 8 and (full == half) is evaluates_the_module


def test_a_module_with_its_adapter_merged_already_or_a_weight_missing_is_refused(monkeypatch):
    """Bad sources get one clear error at construction: an adapter merged into its base (its delta
    would count twice) and a source that lacks a weight the copy holds."""
    import posttrain.engine.copy as engine_copy

    model, _ = lora_model()
    merged = copy.deepcopy(model)
    merged.merge_adapter()
    with pytest.raises(ModelLoadError, match="merged into the base already"):
        InferenceCopy(merged, "float32")
    plan = engine_copy._plan
    monkeypatch.setattr(engine_copy, "_plan", lambda module: [p for p in plan(module) if "q_proj" not in p[0]])
    with pytest.raises(ModelLoadError, match="has no weights for .*q_proj"):
        InferenceCopy(model, "float32")
