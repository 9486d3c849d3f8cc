"""bench/vlm_probe.py: each probe's answer is in its pixels and nowhere else, and placement does
what the probe's table says (a centred word is one image per word; a spread moves it)."""

from __future__ import annotations

import random

import pytest
from bench_loader import load

vp = load("vlm_probe")


def pixels(img):
    return img.tobytes()


def test_a_centred_word_is_one_image_per_word_and_a_spread_moves_it():
    rng = random.Random(0)
    by_word: dict[str, set[bytes]] = {}
    for _ in range(60):
        img, q, a = vp.sample("word40", rng, spread=0.0)
        assert q == "What word is written?"
        by_word.setdefault(a, set()).add(pixels(img))
    assert len(by_word) > 8 and all(len(v) == 1 for v in by_word.values())  # the word alone sets the image
    assert len({next(iter(v)) for v in by_word.values()}) == len(by_word)  # and each word draws another one
    moved: dict[str, set[bytes]] = {}
    for _ in range(60):
        img, _, a = vp.sample("word40", rng, spread=0.1)
        moved.setdefault(a, set()).add(pixels(img))
    assert any(len(v) > 1 for v in moved.values())


def test_the_colour_probe_paints_the_named_colour_and_the_count_probe_its_discs():
    rng = random.Random(1)
    for _ in range(20):
        img, _, name = vp.sample("colour", rng)
        colours = {c for _, c in img.getcolors(maxcolors=1 << 16)}
        assert vp.COLOURS[name] in colours
        assert not (set(vp.COLOURS.values()) - {vp.COLOURS[name]}) & colours  # no other named colour
    counts = set()
    for _ in range(30):
        img, _, n = vp.sample("count", rng)
        dark = {c: k for k, c in img.getcolors(maxcolors=1 << 16)}.get((0, 0, 0), 0)
        assert 0.9 * 700 * int(n) <= dark <= 1.1 * 1963 * int(n)  # n discs of radius 15 to 25, apart
        counts.add(n)
    assert counts == {"1", "2", "3", "4", "5"}


def test_an_unknown_probe_is_refused():
    with pytest.raises(ValueError, match="unknown probe"):
        vp.sample("texture", random.Random(0))


def test_the_dense_stage_box_holds_all_of_the_words_ink():
    rng = random.Random(2)
    for _ in range(20):
        img, _, _ = vp.sample("word40", rng, spread=1.0)
        x0, y0, x1, y1 = img.info["box"]
        grey = img.convert("L")
        ink = grey.point(lambda v: 255 if v < 128 else 0).getbbox()
        assert ink is not None
        assert x0 - 1 <= ink[0] and y0 - 1 <= ink[1] and ink[2] <= x1 + 1 and ink[3] <= y1 + 1
