"""chart_zoom: chart's tasks with the chart drawn too small to read, and a zoom tool that
returns a new image (issue 40, the multi-turn variant).

The scene, question and answer are chart's (`chart.CHART.draw`: the same task at the same index,
split and level). The prompt's image is chart's 320 x 240 render reduced 4 x to 80 x 60 (a box
filter: each pixel the mean of a 4 x 4 block). How that size was chosen: chart's value labels
and names (Pillow's bundled font at 11 and 12 pixels) have digits 8 and 9 pixel rows tall in the
full render (measured with `ImageDraw.textbbox`), so 4 x smaller they are about 2 rows tall,
under the 5 rows the smallest bitmap fonts (3 x 5) need to tell ten digits apart: the bars,
points and slices stay visible, the printed text does not (and the embedded vision model, which
resizes every image to 96 x 96, gains nothing from it). The model replies, one action a turn
(the first non-empty line):

- `ZOOM <category>`: a category's name as printed (case and spaces ignored); the region is its
  column (a bar or point, with its value and name, the plot's whole height) or its pie legend row;
- `ZOOM x0,y0,x1,y1`: a box in the prompt image's pixels, inclusive, 0 <= x0 < x1 < 80 and
  0 <= y0 < y1 < 60;
- `Answer: X`: the answer (chart's: a category, case and spaces ignored, or an integer); it ends
  the episode.

A zoom's observation is one text line and a NEW image: the region cut from the chart rendered
again from its data at full size (`chart.CHART.render`, 4 x the prompt's pixels), never an
upscale of the prompt's pixels. A malformed zoom or any other reply is answered with an error
line and no image; the episode goes on to the turn budget (3).

Verifier (from the reference and the model's own actions, never an observation): outcome is 1
when the answer is right (`_vision.judge`) AND an earlier well-formed zoom covered the evidence
(the categories the question names; for the largest and the smallest, the answer's; for the
total, every category): a zoom covers a category when its region (at full size) holds that
category's whole box (`Chart.regions`). Parts: outcome, process (the share of well-formed
actions) and efficiency (2 turns / turns used); value = outcome x (0.7 + 0.15 process + 0.15
efficiency), passed = outcome. Declared cheats: answering without a zoom (the right answer or a
shortcut: the first or last label, the largest or first value), zoom spam without an answer, a
malformed zoom, a zoom of the wrong region; each scores 0. Zoom spam before a right answer passes
at a lower value (efficiency).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.domains._vision import (
    ImageDomain,
    Scene,
    encode_png,
    judge,
    normal_label,
    wrong_answer,
    wrong_shortcuts,
)
from posttrain.domains.base import Budget, actions_of
from posttrain.domains.chart import CHART
from posttrain.domains.registry import register
from posttrain.types import Episode, Image, Score, Split, StepResult, Task

SCALE = 4
"""The prompt's image is chart's render reduced SCALE times; a zoom cuts from the full render."""
SMALL = (CHART.size[0] // SCALE, CHART.size[1] // SCALE)
MIN_TURNS = 2
INSTRUCTION = (
    "The chart is drawn too small to read its text. Reply ZOOM and a category name, or ZOOM and a "
    "box x0,y0,x1,y1 in the image's pixels, to see that part at full resolution; reply Answer: and "
    "the answer when you know it."
)
_ZOOM = re.compile(r"zoom\s+(.+)", re.IGNORECASE)
_BOX = re.compile(r"(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)")
_ANSWER = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)


@dataclass(frozen=True)
class Action:
    """One parsed reply: "zoom" with its region at full size (x0, y0, x1, y1, inclusive),
    "answer" with its text, or "bad" (a malformed zoom or anything else) with why."""

    kind: str
    box: tuple[int, int, int, int] = (0, 0, 0, 0)
    text: str = ""


def parse_action(text: str, spec: Mapping[str, Any]) -> Action:
    """The reply's first non-empty line as an Action, against the chart `spec` (its categories)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if m := _ANSWER.fullmatch(line):
        return Action("answer", text=m.group(1).strip())
    m = _ZOOM.fullmatch(line)
    if m is None:
        return Action("bad", text="reply ZOOM <category>, ZOOM x0,y0,x1,y1 or Answer: <answer>")
    region = m.group(1).strip()
    if b := _BOX.fullmatch(region):
        x0, y0, x1, y1 = (int(g) for g in b.groups())
        if not (0 <= x0 < x1 < SMALL[0] and 0 <= y0 < y1 < SMALL[1]):
            return Action("bad", text=f"a box needs 0 <= x0 < x1 < {SMALL[0]} and 0 <= y0 < y1 < {SMALL[1]}")
        return Action("zoom", (x0 * SCALE, y0 * SCALE, x1 * SCALE + SCALE - 1, y1 * SCALE + SCALE - 1), region)
    names = {normal_label(label): label for label in spec["labels"]}
    label = names.get(normal_label(region))
    if label is None:
        return Action("bad", text="no such category (or a box is not four integers x0,y0,x1,y1)")
    return Action("zoom", CHART.regions(spec)[label], label)


def covers(outer: Sequence[int], inner: Sequence[int]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def zoom_image(spec: Mapping[str, Any], box: Sequence[int]) -> Image:
    """The region `box` (inclusive, at full size) of the chart rendered again from `spec`."""
    crop = CHART.render(spec).convert("RGB").crop((box[0], box[1], box[2] + 1, box[3] + 1))
    return Image.from_png(encode_png(crop.tobytes(), *crop.size))


class ZoomEnv:
    """The zoom tool over one task's chart: a zoom returns its region as a new image (and a line
    naming it); an answer ends the episode; anything else is answered with an error line."""

    def reset(self, task: Task) -> str:
        self.spec = task.reference["scene"]
        return ""

    def step(self, action: str) -> StepResult:
        act = parse_action(action, self.spec)
        if act.kind == "answer":
            return StepResult("", done=True)
        if act.kind == "bad":
            return StepResult(f"error: {act.text}")
        image = zoom_image(self.spec, act.box)
        return StepResult(f"zoom {act.text}: that region at full resolution", images=(image,))

    def close(self) -> None:
        pass


def evidence(task: Task) -> list[str]:
    """The categories whose printed text decides the answer (see the module docstring)."""
    return list(task.reference["evidence"])


class ZoomVerifier:
    name = "chart_zoom"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        ref = task.reference
        spec, regions = ref["scene"], CHART.regions(ref["scene"])
        seen: set[str] = set()
        answer, used, good = None, 0, 0
        for text in actions_of(episode):
            act = parse_action(text, spec)
            used += 1
            good += act.kind != "bad"
            if act.kind == "zoom":
                seen |= {label for label, box in regions.items() if covers(act.box, box)}
            if act.kind == "answer":
                answer = act.text
                break
        zoomed = set(evidence(task)) <= seen
        right = answer is not None and judge(ref, answer)[1]
        parts = {
            "outcome": float(right and zoomed),
            "process": good / used if used else 0.0,
            "efficiency": min(1.0, MIN_TURNS / used) if used else 0.0,
        }
        if not (right and zoomed):
            why = "no answer" if answer is None else "wrong answer" if not right else "answered without zooming on it"
            return Score(0.0, parts, False, why)
        return Score(0.7 + 0.15 * parts["process"] + 0.15 * parts["efficiency"], parts, True)


class ChartZoom(ImageDomain):
    name = "chart_zoom"
    description = "chart's questions on a chart too small to read, with a ZOOM tool that returns the region re-rendered"
    budget = Budget(turns=3, tokens=32, seconds=60.0)
    verifier = ZoomVerifier()
    size = SMALL
    instruction = INSTRUCTION

    def scene(self, rng: random.Random, difficulty: int) -> Scene:
        return CHART.scene(rng, difficulty)

    def draw(self, split: Split, index: int, difficulty: int) -> Scene:
        """chart's scene of the same task (so chart's held-out split is this family's)."""
        self.check_difficulty(difficulty)
        return CHART.draw(split, index, difficulty)

    def render(self, spec: Mapping[str, Any]) -> Any:
        from PIL import Image as PILImage

        return CHART.render(spec).convert("RGB").resize(SMALL, PILImage.Resampling.BOX)

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        task = super().sample(index, split, difficulty)
        spec, question = task.reference["scene"], task.prompt[0].content
        named = [label for label in spec["labels"] if re.search(rf"\b{re.escape(label)}\b", question)]
        ask = task.reference["ask"]
        need = named or (list(spec["labels"]) if ask == "sum" else [str(task.reference["answer"])])
        return dataclasses.replace(task, reference={**task.reference, "evidence": need})

    def environment(self) -> type[ZoomEnv]:
        return ZoomEnv

    def gold_zoom(self, task: Task) -> str:
        """A zoom covering the evidence: the one category's name when the question names one,
        else the smallest box of prompt pixels around every evidence category's region."""
        need = evidence(task)
        if task.reference["ask"] == "value":
            return f"ZOOM {need[0]}"
        boxes = [CHART.regions(task.reference["scene"])[label] for label in need]
        x0, y0 = min(b[0] for b in boxes) // SCALE, min(b[1] for b in boxes) // SCALE
        x1, y1 = max(b[2] for b in boxes) // SCALE, max(b[3] for b in boxes) // SCALE
        return f"ZOOM {x0},{y0},{x1},{y1}"

    def gold_turns(self, task: Task) -> list[str]:
        """Zoom on the evidence, then answer."""
        return [self.gold_zoom(task), f"Answer: {task.reference['answer']}"]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        return f"{self.gold_zoom(task)}\nAnswer: {wrong_answer(task.reference)}"

    def cheats(self, task: Task) -> Sequence[str]:
        """Answering without a zoom (the right answer, each shortcut), zoom spam with no answer, a
        malformed zoom or a zoom of the title strip (no category) before the right answer, the
        prompt echoed, an empty reply, and two answers in one."""
        ref, gold, zoom = task.reference, str(task.reference["answer"]), self.gold_zoom(task)
        shortcuts = wrong_shortcuts(ref)
        return (
            "",
            " ",
            task.prompt[-1].content,
            f"Answer: {gold}",
            *(f"Answer: {s}" for s in shortcuts),
            *(f"{zoom}\nAnswer: {s}" for s in shortcuts),
            "\n".join([zoom] * self.budget.turns),
            f"ZOOM 0,0,{SMALL[0]},{SMALL[1]}\nAnswer: {gold}",
            f"ZOOM {gold}{gold}\nAnswer: {gold}",
            f"ZOOM 0,0,{SMALL[0] - 1},4\nAnswer: {gold}",
            f"{zoom}\nAnswer: {wrong_answer(ref)} {gold}",
        )


register(ChartZoom())
