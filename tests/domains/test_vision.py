"""The image families (chart, ui, drawing; domains/_vision.py): the answer only in the pixels (the
leak tests), the PNG bytes a function of the seed in every process, the held-out split by scene,
the exact verifier (a click point inside the box, edges included), and the declared shortcuts
scoring below the gold, task by task through the monitor's probe and as policies over many tasks."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys

import pytest
from PIL import Image as PILImage

from posttrain.configs.tasks import TasksConfig
from posttrain.domains._vision import encode_png, judge
from posttrain.domains.base import extract_answer
from posttrain.domains.registry import get
from posttrain.monitor.probes import probe_domain
from posttrain.tasks.pool import resolve_domains
from posttrain.types import Episode

FAMILIES = ("chart", "ui", "drawing")


@functools.cache
def _task(name: str, split: str, level: int, i: int):
    return get(name).sample(i, split, level)


def _tasks(name: str, n: int = 12, split: str = "train"):
    """Tasks 0..n-1 of every level (each drawn once per test session: the tests share them)."""
    return [_task(name, split, level, i) for level in range(1, get(name).levels + 1) for i in range(n)]


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    pos, out = 8, []
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        out.append((png[pos + 4 : pos + 8], png[pos : pos + 12 + length]))
        pos += 12 + length
    return out


# ---- leaks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_the_answer_is_not_in_the_prompt_text(name):
    for task in _tasks(name):
        ref, text = task.reference, task.prompt[0].content
        answer = str(ref["answer"])
        assert not re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text, re.IGNORECASE), (task.id, answer, text)
        if ref["kind"] in ("number", "point"):
            assert not re.search(r"\d", text), (task.id, text)  # no number at all in the prompt


@pytest.mark.parametrize("name", FAMILIES)
def test_the_png_holds_pixels_only_and_its_bytes_are_a_function_of_the_pixels(name):
    for task in _tasks(name, 4):
        png = task.images[0].png
        assert [k for k, _ in _chunks(png)] == [b"IHDR", b"IDAT", b"IEND"], task.id
        pixels = PILImage.open(io.BytesIO(png))
        assert pixels.info == {} and pixels.mode == "RGB"  # no text, dpi, gamma, ...
        # re-encoding the decoded pixels gives the file back: nothing in it but the pixels
        assert encode_png(pixels.tobytes(), *pixels.size) == png, task.id


@pytest.mark.parametrize("name", FAMILIES)
def test_two_tasks_with_different_answers_differ_only_in_pixel_data(name):
    tasks = _tasks(name, 6)
    a = tasks[0]
    b = next(t for t in tasks if str(t.reference["answer"]) != str(a.reference["answer"]))
    ca, cb = _chunks(a.images[0].png), _chunks(b.images[0].png)
    assert [k for k, _ in ca] == [k for k, _ in cb]
    assert ca[0] == cb[0] and ca[2] == cb[2]  # IHDR and IEND byte for byte; only IDAT differs
    assert ca[1] != cb[1]
    outside = a.images[0].png.replace(ca[1][1], b"")
    assert str(a.reference["answer"]).encode() not in outside or len(str(a.reference["answer"])) < 2


# ---- determinism and split -----------------------------------------------------------------------

_DIGESTS = """
import hashlib, json
from posttrain.domains.registry import get
out = {}
for name in ("chart", "ui", "drawing"):
    d = get(name)
    out[name] = [hashlib.sha256(d.sample(i, s, lv).images[0].png).hexdigest() for s in ("train", "eval")
                 for lv in (1, 3) for i in (0, 5)]
print(json.dumps(out))
"""


def _digests_here() -> dict[str, list[str]]:
    out = {}
    for name in FAMILIES:
        d = get(name)
        out[name] = [
            hashlib.sha256(d.sample(i, s, lv).images[0].png).hexdigest()
            for s in ("train", "eval")
            for lv in (1, 3)
            for i in (0, 5)
        ]
    return out


@pytest.mark.heavy
def test_the_png_bytes_are_the_same_in_another_process():
    """A fresh process (another hash seed) renders the same PNG bytes, task for task (2.5 s)."""
    env = dict(os.environ, PYTHONHASHSEED="4242", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _DIGESTS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == _digests_here()


@pytest.mark.parametrize("name", FAMILIES)
def test_train_and_eval_never_share_an_image_and_eval_is_held_out(name):
    train = {t.images[0].sha256 for t in _tasks(name, 12)}
    held = {t.images[0].sha256 for t in _tasks(name, 6, "eval")}
    assert len(train) == 3 * 12 and len(held) == 3 * 6 and not train & held
    d = get(name)
    assert all(d.sample(i, "eval", 1).meta.split == "eval" for i in range(3))
    # the split is by scene, not by question: one question's images are in both splits
    train_q = {t.prompt[0].content for t in _tasks(name, 12)}
    assert train_q & {t.prompt[0].content for t in _tasks(name, 6, "eval")}


# ---- verifier ------------------------------------------------------------------------------------


def test_a_click_scores_inside_the_box_edges_included_and_not_a_pixel_outside():
    ref = {"kind": "point", "answer": "15,25", "box": [10, 20, 20, 30]}
    for point in ("10,20", "20,30", "(15, 25)", "10,30"):
        assert judge(ref, point) == (True, True), point
    for point in ("9,20", "10,19", "21,30", "20,31", "15,25 16,26", "15;25", "x"):
        assert not judge(ref, point)[1], point


def test_labels_ignore_case_and_spaces_numbers_and_letters_are_exact():
    assert judge({"kind": "label", "answer": "Remember me"}, " remember   ME ") == (True, True)
    assert judge({"kind": "label", "answer": "Save"}, "Save button") == (True, False)
    assert judge({"kind": "number", "answer": "42"}, "42") == (True, True)
    assert judge({"kind": "number", "answer": "42"}, "42 mm") == (False, False)
    assert judge({"kind": "number", "answer": "42"}, "42.0") == (False, False)
    assert judge({"kind": "letter", "answer": "K"}, "k") == (True, True)
    assert judge({"kind": "letter", "answer": "K"}, "KM") == (False, False)


# ---- cheats --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_the_monitor_probe_finds_no_declared_cheat_accepted(name):
    d = get(name)
    result = probe_domain(d, 1, 3)
    assert result is not None and result.cheats > 0 and not result.accepted, result
    for t in _tasks(name, 4):  # every shortcut that is not right for the task is a declared cheat
        wrong = [a for a in t.reference["shortcuts"].values() if not judge(t.reference, a)[1]]
        assert wrong and set(wrong) <= {extract_answer(c) for c in d.cheats(t)}, t.id


@pytest.mark.parametrize("name", FAMILIES)
def test_each_shortcut_as_a_policy_scores_far_below_the_gold(name):
    """Over 40 tasks a level, each shortcut (the first label, the largest number, the image centre,
    ...) answered on every task: at most 0.6 of the gold's 1.0 over the family (a shortcut seen 30
    times or more), at most 0.75 on the question it suits best (seen 12 times or more; a two-way
    confusion, width or height, is right about half the time)."""
    d = get(name)
    per: dict[tuple[str, str], list[float]] = {}
    for t in _tasks(name, 40):
        assert d.score(t, Episode(d.gold(t))).passed
        for key, answer in t.reference["shortcuts"].items():
            per.setdefault((t.reference["ask"], key), []).append(
                d.score(t, Episode(f"<answer>{answer}</answer>")).value
            )
    overall: dict[str, list[float]] = {}
    for (_, key), values in per.items():
        overall.setdefault(key, []).extend(values)
    means = {k: sum(v) / len(v) for k, v in overall.items() if len(v) >= 30}
    asked = {k: sum(v) / len(v) for k, v in per.items() if len(v) >= 12}
    assert max(means.values()) <= 0.6 and max(asked.values()) <= 0.75, (means, asked)


# ---- what they are for today ---------------------------------------------------------------------


def test_no_pattern_trains_them_but_a_name_does():
    picked = resolve_domains(TasksConfig.model_validate({"domains": {"*": {}}}))
    assert not set(FAMILIES) & set(picked)
    assert set(resolve_domains(TasksConfig.model_validate({"domains": {n: {} for n in FAMILIES}}))) == set(FAMILIES)
