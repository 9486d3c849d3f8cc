"""chart_zoom (domains/chart_zoom.py): chart's tasks drawn too small to read, and a ZOOM tool that
returns a new image, the region rendered again at full size. The leak tests of the image families
extended to the observation images, the grammar, and the declared cheats below the gold."""

from __future__ import annotations

import functools
import io
import re

import pytest
from PIL import Image as PILImage

from posttrain.domains._vision import encode_png
from posttrain.domains.base import play_actions
from posttrain.domains.chart import CHART
from posttrain.domains.chart_zoom import SCALE, SMALL, ZoomEnv
from posttrain.domains.registry import get
from posttrain.errors import TaskError
from posttrain.monitor.probes import probe_domain
from posttrain.types import Episode, StepResult

D = get("chart_zoom")


@functools.cache
def _task(split: str, level: int, i: int):
    return D.sample(i, split, level)


def _tasks(n: int = 8, split: str = "train"):
    return [_task(split, level, i) for level in (1, 2, 3) for i in range(n)]


def _play(task, actions):
    return play_actions(ZoomEnv(), task, actions)


def _pixels_only(png: bytes) -> None:
    pic = PILImage.open(io.BytesIO(png))
    assert pic.info == {} and pic.mode == "RGB"
    assert encode_png(pic.tobytes(), *pic.size) == png  # nothing in the file but its pixels


def test_a_task_is_charts_task_with_the_chart_drawn_four_times_smaller():
    for t in _tasks(4):
        level, i = t.meta.difficulty, int(t.id.rsplit(":", 1)[1])
        chart = get("chart").sample(i, "train", level)
        assert t.reference["scene"] == chart.reference["scene"] and t.reference["answer"] == chart.reference["answer"]
        small = CHART.render(t.reference["scene"]).resize(SMALL, PILImage.Resampling.BOX)
        assert (t.images[0].width, t.images[0].height) == SMALL == (80, 60)
        assert PILImage.open(io.BytesIO(t.images[0].png)).tobytes() == small.tobytes()


def test_the_gold_zooms_on_the_evidence_then_answers_and_scores_1_with_a_new_image():
    for t in _tasks():
        ep = _play(t, D.gold_turns(t))
        score = D.score(t, ep)
        assert score.value == 1.0 and score.passed, (t.id, score, ep.turns)
        assert len(ep.turns) == 2 and len(ep.turns[0].images) == 1 and not ep.turns[1].images
        assert ep.turns[0].images[0] != t.images[0].sha256


def test_a_zoom_is_the_region_rendered_again_at_full_size_not_an_upscale_of_the_prompt():
    t = _task("train", 2, 3)
    env = ZoomEnv()
    env.reset(t)
    got = env.step("ZOOM 10,5,50,40")
    assert not got.done and len(got.images) == 1
    assert got.observation == "zoom 10,5,50,40: that region at full resolution"
    zoom = PILImage.open(io.BytesIO(got.images[0].png))
    box = (10 * SCALE, 5 * SCALE, 51 * SCALE, 41 * SCALE)
    assert zoom.size == (41 * SCALE, 36 * SCALE)
    assert zoom.tobytes() == CHART.render(t.reference["scene"]).convert("RGB").crop(box).tobytes()
    small = PILImage.open(io.BytesIO(t.images[0].png)).crop((10, 5, 51, 41))
    for resample in (PILImage.Resampling.NEAREST, PILImage.Resampling.BICUBIC):
        assert small.resize(zoom.size, resample).tobytes() != zoom.tobytes()
    by_name = env.step(f"zoom  {t.reference['scene']['labels'][0].upper()} ")
    assert len(by_name.images) == 1 and not by_name.done


@pytest.mark.parametrize(
    "action",
    ["ZOOM", "ZOOM 5,5,5,9", "ZOOM 0,0,80,10", "ZOOM 0,0,10,60", "ZOOM 1,2,3", "ZOOM -1,0,5,5", "ZOOM Bananas", "look"],
)
def test_a_malformed_zoom_is_answered_with_an_error_and_no_image(action):
    env = ZoomEnv()
    env.reset(_task("train", 1, 0))
    got = env.step(action)
    assert got.observation.startswith("error: ") and not got.images and not got.done


def test_an_answer_ends_the_episode():
    env = ZoomEnv()
    env.reset(_task("train", 1, 0))
    assert env.step("Answer: Apples").done


# ---- leaks: the answer only in the pixels, the prompt's and the observations' ----------------------


def test_the_answer_is_not_in_the_prompt_text_nor_any_number():
    for t in _tasks(12):
        text, answer = t.prompt[0].content, str(t.reference["answer"])
        assert not re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text, re.IGNORECASE), (t.id, text)
        assert re.findall(r"\d", text.replace("x0,y0,x1,y1", "")) == [], (t.id, text)


def test_every_image_holds_pixels_only_and_an_observation_text_only_echoes_the_action():
    for t in _tasks(4):
        _pixels_only(t.images[0].png)
        labels = t.reference["scene"]["labels"]
        actions = [D.gold_zoom(t), f"ZOOM {labels[-1]}", "ZOOM 0,0,79,59"]
        env = ZoomEnv()
        env.reset(t)
        for action in actions:
            got = env.step(action)
            for image in got.images:
                _pixels_only(image.png)
            region = action.split(maxsplit=1)[1]
            rest = got.observation.replace(region, "")
            assert not re.search(r"\d", rest), (t.id, got.observation)
            if str(t.reference["answer"]) not in region:
                assert str(t.reference["answer"]) not in got.observation


def test_train_and_eval_are_charts_splits():
    train = {t.images[0].sha256 for t in _tasks(8)}
    held = {t.images[0].sha256 for t in _tasks(4, "eval")}
    assert not train & held
    assert all(get("chart").draw("eval", i, 1) == D.draw("eval", i, 1) for i in range(3))


# ---- verifier and cheats -----------------------------------------------------------------------------


def test_the_declared_cheats_score_0_as_one_completion_and_as_played_turns():
    assert not probe_domain(D, 1, 3).accepted
    for t in _tasks(4):
        for cheat in D.cheats(t):
            as_one = D.score(t, Episode(cheat))
            played = D.score(t, _play(t, [line for line in cheat.splitlines() if line.strip()] or [cheat]))
            assert as_one.value == 0.0 and played.value == 0.0, (t.id, cheat, as_one, played)


def test_answering_without_a_zoom_scores_0_even_when_right():
    t = _task("train", 1, 1)
    got = D.score(t, _play(t, [f"Answer: {t.reference['answer']}"]))
    assert got.value == 0.0 and got.reason == "answered without zooming on it"


def test_zoom_spam_and_a_malformed_zoom_before_a_right_answer_pass_below_the_gold():
    for t in _tasks(3):
        zoom, answer = D.gold_turns(t)
        spam = D.score(t, _play(t, [zoom, zoom, answer]))
        malformed = D.score(t, _play(t, ["ZOOM 0,0,99,99", zoom, answer]))
        assert spam.passed and spam.value < 1.0 and spam.parts["efficiency"] == pytest.approx(2 / 3)
        assert malformed.passed and malformed.value < spam.value and malformed.parts["process"] == pytest.approx(2 / 3)


def test_the_wrong_region_does_not_count_as_zooming_on_the_evidence():
    t = next(t for t in _tasks(8) if t.reference["ask"] == "value")
    other = next(label for label in t.reference["scene"]["labels"] if label not in t.reference["evidence"])
    got = D.score(t, _play(t, [f"ZOOM {other}", f"Answer: {t.reference['answer']}"]))
    assert got.value == 0.0 and not got.passed


def test_a_step_result_takes_only_image_records():
    image = _task("train", 1, 0).images[0]
    assert StepResult("x", images=(image,)).images == (image,)
    for bad in ([image], (image.png,), ("sha",)):
        with pytest.raises(TaskError, match="StepResult.images must be a tuple of Image records"):
            StepResult("x", images=bad)  # type: ignore[arg-type]


def test_domains_show_prints_the_task_its_image_and_the_gold_zoom_then_answer(capsys):
    from posttrain.cli import main

    assert main(["domains", "show", "chart_zoom"]) == 0
    out = capsys.readouterr().out
    t = D.sample(0, "train", 1)
    assert "multi-turn yes" in out and t.images[0].marker in out
    assert f"{D.gold(t)}\n-> score 1.000" in out
