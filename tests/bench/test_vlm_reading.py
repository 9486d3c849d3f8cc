"""bench/vlm_reading.py's OCR stage on the families' own renders: recording the text leaves the
image as the task draws it, every string the scene prints is recorded, and each character target
sits over ink in the patch sub-column it names."""

from __future__ import annotations

import pytest
from bench_loader import load

from posttrain.domains.registry import get

vr = load("vlm_reading")


@pytest.mark.parametrize("name", ["chart", "ui", "drawing"])
def test_recording_the_text_leaves_the_task_image_as_drawn(name):
    domain = get(name)
    for index in range(4):
        task = domain.sample(index, "train", 1 + index % 3)
        with vr.drawn_text() as texts:
            img = domain.render(task.reference["scene"]).convert("RGB")
        assert texts
        assert img.tobytes() == domain.render(task.reference["scene"]).convert("RGB").tobytes()
        assert domain.image(task.reference["scene"]).png == task.prompt[0].images[0].png


def test_every_label_and_value_a_chart_prints_is_recorded():
    domain = get("chart")
    for index in range(12):
        scene = domain.draw("train", index, 1 + index % 3)
        with vr.drawn_text() as texts:
            domain.render(scene.spec)
        printed = " ".join(t for t, _, _ in texts)
        for label, value in zip(scene.spec["labels"], scene.spec["values"]):
            assert label in printed and str(value) in printed
        assert scene.spec["title"] in printed


@pytest.mark.parametrize("name", ["chart", "ui", "drawing"])
def test_each_character_target_lies_over_ink_in_its_sub_column(name):
    size, patch, slots = 384, 32, 8
    g, width = size // patch, patch // slots
    marked = 0
    for index in range(6):
        img, tgt = vr.family_ocr_sample(name, "train", index, 1 + index % 3, size, patch, slots)
        grey = img.convert("L").resize((size, size))
        px = grey.load()
        for cell in range(g * g):
            for slot in range(slots):
                if int(tgt[cell, slot]) == 0:
                    continue
                marked += 1
                x0 = (cell % g) * patch + slot * width
                y0 = (cell // g) * patch
                # ink (or a button's white-on-blue contrast) within the sub-column, a character's
                # width to either side, in the patch row
                xs = range(max(0, x0 - width), min(size, x0 + 2 * width))
                ys = range(y0, min(size, y0 + patch))
                values = [px[x, y] for x in xs for y in ys]
                assert max(values) - min(values) > 100, (name, index, cell, slot)
    assert marked > 10 * 6  # a scene prints tens of characters
