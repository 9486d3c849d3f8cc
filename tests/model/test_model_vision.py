"""The embedded vision-language model (model/vision.py): a build is a pure function of its spec
(same seed, same weights digest), its folder loads with plain transformers offline, and the
processor's own handling of the image token gives the ids and pixels posttrain computes."""

from __future__ import annotations

import io
import json

import pytest
import torch

from posttrain.domains.registry import get
from posttrain.model import vision
from posttrain.model.vision import VisionSpec

SPEC = VisionSpec(steps=2, batch_size=2, pool=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    return vision.build_vlm(SPEC, root / "a", progress=False), root


def _info(folder):
    return json.loads((folder / vision.INFO).read_text())


def test_a_build_is_deterministic_from_its_seed_and_records_time_and_rss(built):
    folder, root = built
    again = vision.build_vlm(SPEC, root / "b", progress=False)
    other = vision.build_vlm(VisionSpec(seed=1, steps=2, batch_size=2, pool=1), root / "c", progress=False)
    info = _info(folder)
    assert info["weights_digest"] == _info(again)["weights_digest"]
    assert info["weights_digest"] != _info(other)["weights_digest"]
    assert info["build_seconds"] > 0 and info["peak_rss_mib"] > 0 and info["spec"]["seed"] == 0


def test_the_folder_loads_with_plain_transformers_and_its_processor_expands_the_image(built):
    from PIL import Image as PILImage
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder, _ = built
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
    proc = AutoProcessor.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "LlavaForConditionalGeneration" and vision.is_vision_dir(folder)
    assert vision.weights_digest(model) == _info(folder)["weights_digest"]
    task = get("ui").sample(0, "train", 1)
    text = proc.apply_chat_template(vision.chat(task.prompt), add_generation_prompt=True, tokenize=False)
    png = task.prompt[0].images[0].png
    enc = proc(text=text, images=[PILImage.open(io.BytesIO(png)).convert("RGB")], return_tensors="pt")
    tok = proc.tokenizer
    ids = tok.apply_chat_template(vision.chat(task.prompt), add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    image_id = tok.convert_tokens_to_ids(vision.IMAGE_TOKEN)
    ours = vision.expand_ids(ids, image_id, SPEC.image_tokens)
    assert tuple(enc["input_ids"][0].tolist()) == ours and ours.count(image_id) == SPEC.image_tokens == 64
    assert torch.equal(enc["pixel_values"], vision.pixel_values(proc, task.prompt[0].images))
    assert tok.decode([t for t in ours if t != image_id]) == text.replace(vision.IMAGE_TOKEN, "")


def test_ensure_caches_by_spec(tmp_path, monkeypatch):
    from posttrain.model import pretrain

    monkeypatch.setattr(pretrain, "DEFAULT_CACHE", tmp_path)
    spec = VisionSpec(steps=1, batch_size=1, pool=1)
    out = vision.ensure_vlm(spec, progress=False)
    assert out == tmp_path / f"vlm-{spec.fingerprint()}" and (out / vision.INFO).is_file()
    stamp = (out / vision.INFO).stat().st_mtime_ns
    assert vision.ensure_vlm(spec, progress=False) == out and (out / vision.INFO).stat().st_mtime_ns == stamp


def test_a_bad_spec_names_its_field():
    with pytest.raises(ValueError, match="VisionSpec.image_size 100 is not a multiple of patch_size"):
        VisionSpec(image_size=100)
    with pytest.raises(ValueError, match="VisionSpec.buggy_fraction"):
        VisionSpec(buggy_fraction=1.5)


def test_the_command_builds_into_a_folder_and_says_what_it_built(tmp_path, capsys):
    from posttrain.cli import main

    assert main(["base", "vlm", "--seed", "3", "--steps", "1", "--pool", "1", "--out", str(tmp_path / "v")]) == 0
    said = capsys.readouterr().out
    digest = _info(tmp_path / "v")["weights_digest"]
    assert f"vision model: {tmp_path / 'v'} (seed 3, 1 steps): weights {digest}, built in" in said
    assert "peak RSS" in said


def test_the_name_posttrain_vlm_stands_for_the_default_build(tmp_path, monkeypatch):
    from posttrain.engine.hf import HFEngine
    from posttrain.model import pretrain
    from posttrain.model.real import resolve

    monkeypatch.setattr(pretrain, "DEFAULT_CACHE", tmp_path)
    where = vision.default_dir(VisionSpec())
    vision.build_vlm(VisionSpec(steps=1, batch_size=1, pool=1), where, progress=False)  # stands in for it
    assert resolve(vision.NAME) == str(where) and vision.is_vision_dir(vision.NAME)
    assert HFEngine.from_pretrained(vision.NAME, device="cpu").processor is not None
