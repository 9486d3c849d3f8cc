"""`posttrain export`: a LoRA checkpoint merges into its base; a full one copies without trainer state."""

from __future__ import annotations

import pytest
import torch

from posttrain.cli import main
from posttrain.configs.trainer import LoraConfig, TrainerConfig
from posttrain.errors import ConfigError
from posttrain.model.arch import load_model, random_model
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer


def _batch() -> TrainBatch:
    rows = [TrainRow((4, 30, 31), (40 + k, 41, 5), (-3.0, -3.1, -2.9), float(k % 2), "g", (1, 1, 1)) for k in range(4)]
    return TrainBatch(tuple(rows))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "m"
    model, tok = random_model("micro", 3)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_export_serves_the_trained_function(tmp_path, base_dir, lora):
    """...and the co-trained draft head goes with the model (the fast tier drafts with it); the
    head's optimizer state does not."""
    from posttrain.configs.trainer import DraftHeadConfig
    from posttrain.model.draft_head import META, WEIGHTS, load

    model, tok = load_model(base_dir)
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4) if lora else None, draft_head=DraftHeadConfig(enabled=True))
    trainer = Trainer(model, cfg)
    assert trainer.step(_batch()).outcome == "applied"
    ckpt = trainer.save(tmp_path / "run", tok, {})
    args = ["export", str(ckpt), "--out", str(tmp_path / "out")] + (["--base", str(base_dir)] if lora else [])
    assert main(args) == 0
    exported, _ = load_model(tmp_path / "out")
    assert not (tmp_path / "out" / "optimizer.pt").exists()
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()
    assert (tmp_path / "out" / WEIGHTS).is_file() and (tmp_path / "out" / META).is_file()
    assert not (tmp_path / "out" / "draft_head_optimizer.pt").exists()
    for k, v in load(tmp_path / "out").state_dict().items():
        assert torch.equal(v, trainer.draft_head.state_dict()[k]), k
    ids = torch.tensor([[4, 30, 31, 40, 41]])
    assert torch.allclose(_logits(exported, ids), _logits(trainer.model, ids), atol=1e-5)
    assert not torch.allclose(_logits(load_model(base_dir)[0], ids), _logits(trainer.model, ids), atol=1e-4)


def test_export_refuses_a_non_empty_out_and_a_baseless_adapter(tmp_path, base_dir, capsys):
    model, tok = load_model(base_dir)
    trainer = Trainer(model, TrainerConfig(lora=LoraConfig(rank=2)))
    ckpt = trainer.save(tmp_path / "run", tok, {})
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    assert main(["export", str(ckpt), "--out", str(tmp_path / "full")]) != 0
    assert "--out" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    from posttrain.trainer.export import export

    with pytest.raises(ConfigError, match="--base"):
        export(ckpt, tmp_path / "o2")
    assert not (tmp_path / "o2").exists()


def test_a_lora_runs_checkpoint_is_evaluated_merged_into_its_base(tmp_path, base_dir):
    """`posttrain eval --run` / `compare` on a LoRA run (make demo-real's benchmarks after
    training): the adapter is merged into the run's model.path once, into RUN/merged/, and
    reused; before, the adapter folder itself was handed to the engine ('has no config.json')."""
    from posttrain.evaluate.compare import resolve

    model, tok = load_model(base_dir)
    trainer = Trainer(model, TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4)))
    assert trainer.step(_batch()).outcome == "applied"
    run = tmp_path / "run"
    ckpt = trainer.save(run, tok, {})
    (run / "config.yaml").write_text(f"model:\n  path: {base_dir}\n")
    side = resolve(str(run))
    assert side.model_dir == run / "merged" / ckpt.name and side.run_dir == run
    merged, _ = load_model(side.model_dir)
    ids = torch.tensor([[4, 30, 31, 40, 41]])
    assert torch.allclose(_logits(merged, ids), _logits(trainer.model, ids), atol=1e-5)
    stamp = (side.model_dir / "export.json").stat().st_mtime_ns
    assert resolve(str(run)).model_dir == side.model_dir  # made once, then reused
    assert (side.model_dir / "export.json").stat().st_mtime_ns == stamp
    # one of the run's checkpoints named directly (`posttrain eval --model RUN/checkpoints/step_N`,
    # `compare`): the same merge, not 'has no config.json'
    assert resolve(str(ckpt)).model_dir == side.model_dir
    from argparse import Namespace

    from posttrain.commands.eval import _model

    assert _model(Namespace(model=str(ckpt), run=None), None) == str(side.model_dir)


def test_two_evaluations_merging_one_checkpoint_at_once_both_get_the_merge(tmp_path, base_dir, monkeypatch):
    """Two `posttrain eval` processes on one LoRA checkpoint: the second's merge finds the first's
    folder renamed into place when it renames its own (it failed with 'Directory not empty')."""
    import posttrain.trainer.lora as lora
    from posttrain.trainer.export import export, servable

    model, tok = load_model(base_dir)
    trainer = Trainer(model, TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4)))
    assert trainer.step(_batch()).outcome == "applied"
    run = tmp_path / "run"
    ckpt = trainer.save(run, tok, {})
    merged = run / "merged" / ckpt.name
    real_merge = lora.merge_to_dir

    def merge_while_another_finishes(base, adapter, out):
        monkeypatch.setattr(lora, "merge_to_dir", real_merge)
        export(ckpt, merged, base=str(base_dir))  # the other process wins the race
        real_merge(base, adapter, out)

    monkeypatch.setattr(lora, "merge_to_dir", merge_while_another_finishes)
    monkeypatch.setattr("posttrain.trainer.export.base_for", lambda ckpt, base: str(base_dir))
    assert servable(ckpt) == merged
    assert (merged / "export.json").is_file() and not list(merged.parent.glob(".tmp-*"))
    ids = torch.tensor([[4, 30, 31, 40, 41]])
    assert torch.allclose(_logits(load_model(merged)[0], ids), _logits(trainer.model, ids), atol=1e-5)

    # the other process finished between this one's check and its merge's start ('not empty')
    import shutil

    import posttrain.trainer.export as export_module

    shutil.rmtree(merged)
    monkeypatch.setattr(lora, "merge_to_dir", real_merge)

    def export_after_another(source, out, base=None):
        export(source, out, base=str(base_dir))  # the other process
        return export(source, out, base=str(base_dir))

    monkeypatch.setattr(export_module, "export", export_after_another)
    assert servable(ckpt) == merged and (merged / "export.json").is_file()
