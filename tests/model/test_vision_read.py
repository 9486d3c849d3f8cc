"""The VLM build's reading stage (model/vision.py `read_stage`, `ocr_targets`) and what it reads
from: each family's `ImageDomain.printed` (every string its render prints, with each
character's place). The targets must sit on the ink they name, watching a render must leave its
image as the task draws it, and a build with the stage is as deterministic as one without."""

from __future__ import annotations

import json

import pytest

from posttrain.domains.registry import get
from posttrain.model import vision
from posttrain.model.vision import VisionSpec

FAMILIES = ("chart", "ui", "drawing")


@pytest.mark.parametrize("name", FAMILIES)
def test_watching_a_render_leaves_the_task_image_as_drawn(name):
    domain = get(name)
    for index in range(4):
        task = domain.sample(index, "train", 1 + index % 3)
        image, printed = domain.image_and_printed(task.reference["scene"])
        assert printed == domain.printed(task.reference["scene"]) and printed
        assert image.png == domain.image(task.reference["scene"]).png == task.prompt[0].images[0].png


def test_every_label_value_and_title_a_chart_prints_is_recorded_with_a_centre_a_character():
    domain = get("chart")
    for index in range(12):
        scene = domain.draw("train", index, 1 + index % 3)
        printed = domain.printed(scene.spec)
        texts = [p.text for p in printed]
        joined = " ".join(texts)
        for label, value in zip(scene.spec["labels"], scene.spec["values"]):
            assert label in joined and str(value) in joined
        assert scene.spec["title"] in texts
        for p in printed:
            assert len(p.centres) == len(p.text)
            xs = [x for x, _ in p.centres]
            assert xs == sorted(xs) and p.box[0] <= xs[0] and xs[-1] <= p.box[2]  # left to right, inside the box


@pytest.mark.parametrize("name", FAMILIES)
def test_each_character_target_lies_over_ink_in_its_sub_column(name):
    spec = VisionSpec(image_size=384, patch_size=32, ocr_slots=8)
    g, patch, width = 12, 32, 4
    domain = get(name)
    marked = 0
    for index in range(6):
        scene = domain.draw("train", index, 1 + index % 3)
        tgt = vision.ocr_targets(domain.printed(scene.spec), domain.size, spec)
        assert tgt.shape == (g * g, 8)
        grey = domain.render(scene.spec).convert("L").resize((384, 384))
        px = grey.load()
        for cell in range(g * g):
            for slot in range(8):
                if int(tgt[cell, slot]) == 0:
                    continue
                marked += 1
                x0, y0 = (cell % g) * patch + slot * width, (cell // g) * patch
                # contrast (black ink, or a button's white on blue) within a character's width of
                # the sub-column, in the patch's row
                values = [
                    px[x, y] for x in range(max(0, x0 - width), min(384, x0 + 2 * width)) for y in range(y0, y0 + patch)
                ]
                assert max(values) - min(values) > 100, (name, index, cell, slot)
    assert marked > 10 * 6  # a scene prints tens of characters


def test_the_reading_stage_moves_the_tower_and_nothing_else():
    import torch
    from transformers import LlavaForConditionalGeneration

    spec = VisionSpec(ocr_steps=1, read_eval=1)
    tok = vision.build_tokenizer()
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(vision.make_config(spec, tok))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vision.read_stage(model, vision.processor(spec, tok), spec, progress=False)
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all("vision_tower" in k for k in moved)


def test_specs_made_before_the_reading_stage_keep_their_cache_folders():
    # the fingerprint of the default build as it was before the reading stage's fields existed
    assert VisionSpec().fingerprint() == vision.VisionSpec(tower_width=64, ocr_steps=0).fingerprint()
    assert VisionSpec(steps=3, batch_size=2, pool=2).fingerprint() == "82333ef7fab0"
    assert VisionSpec(ocr_steps=1).fingerprint() != VisionSpec().fingerprint()


def test_a_bad_reading_spec_names_its_field():
    with pytest.raises(ValueError, match="VisionSpec.ocr_steps"):
        VisionSpec(ocr_steps=-1)
    with pytest.raises(ValueError, match="VisionSpec.tower_width must be a multiple of 4"):
        VisionSpec(tower_width=30)
    with pytest.raises(ValueError, match="VisionSpec.ocr_slots"):
        VisionSpec(ocr_slots=0)
    with pytest.raises(ValueError, match="VisionSpec.read_eval"):
        VisionSpec(read_eval=0)


def test_the_command_builds_with_a_reading_stage_deterministically_and_says_what_it_reads(tmp_path, capsys):
    from posttrain.cli import main

    out = tmp_path / "v"
    args = ["base", "vlm", "--steps", "1", "--pool", "1", "--ocr-steps", "1", "--fresh", "--out", str(out)]
    assert main(args) == 0
    said = capsys.readouterr().out
    info = json.loads((out / vision.INFO).read_text())
    assert info["spec"]["ocr_steps"] == 1 and info["spec"]["fresh"] is True
    assert set(info["read_heldout"]) == set(FAMILIES) and all(0 <= v <= 1 for v in info["read_heldout"].values())
    reads = ", ".join(f"{k} {v:.2f}" for k, v in sorted(info["read_heldout"].items()))
    assert f"characters read on held-out images (1 reading steps): {reads}" in said
    again = vision.build_vlm(VisionSpec(**info["spec"]), tmp_path / "again", progress=False)
    assert json.loads((again / vision.INFO).read_text())["weights_digest"] == info["weights_digest"]
    narrow = VisionSpec(steps=1, batch_size=2, pool=1, tower_width=32, tower_depth=1)
    model, _, _ = vision.load_vlm(vision.build_vlm(narrow, tmp_path / "narrow", progress=False))
    assert model.config.vision_config.hidden_size == 32 and model.config.vision_config.num_hidden_layers == 1
