"""drawing: a dimensioned engineering drawing of a drilled plate (its top view) and a question
about the part (issue 40): a dimension, the hole count, the centre distance of two holes, or which
of three small lettered views is the same part.

The main view carries the overall width (below the part), the overall height (right of it), the
holes' diameter (a leader from the top-right hole to `DIA n`) and the positions of the first and
the last column of holes from the left edge (baseline dimensions above the part); all in whole
millimetres, drawn to scale. Levels: 1, a plate 30-110 mm each way, one to four columns and one
to three rows of holes (in half the plates some left out), asked the width, the height or the
hole count; 2, every grid with holes left out, also the diameter and the matching view; 3, at
least two columns, asked the count, the diameter, the centre distance of the two dimensioned hole
columns (computed: the difference of two printed dimensions) or the matching view. The candidate
views (for the view question only) are the part, the part with one hole fewer or more, and the
part with other proportions, in a random order under three random letters (never A or I, which
read as words). Shortcuts declared as cheats: the other overall dimension, the largest or the
first printed number, the number of dimensioned hole columns or of all columns, four, a radius
for a diameter, the farther column's dimension for a distance, the topmost or the bottom
candidate's letter.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from posttrain.domains._vision import ImageDomain, Scene, canvas, font, text_centred
from posttrain.domains.registry import register

LETTERS = "BCDEFGHKMNPRSTUVWXYZ"
INK, THIN = (0, 0, 0), (70, 70, 70)
LEVELS: dict[int, tuple[tuple[int, int], bool, tuple[str, ...]]] = {
    1: ((1, 4), False, ("width", "height", "holes")),  # half the grids with holes left out
    2: ((1, 4), True, ("width", "height", "holes", "diameter", "view")),
    3: ((2, 4), True, ("holes", "diameter", "pitch", "view")),
}
QUESTIONS = {
    "width": "What is the overall width of the plate in millimetres?",
    "height": "What is the overall height of the plate (top to bottom as drawn) in millimetres?",
    "holes": "How many holes does the plate have?",
    "diameter": "What is the diameter of the holes in millimetres?",
    "pitch": (
        "What is the distance in millimetres between the centres of the two hole columns whose "
        "positions are dimensioned from the left edge?"
    ),
    "view": "Which of the lettered small views on the right shows the same plate as the main view? "
    "Answer with its letter.",
}
AREA = (30, 62, 230, 232)  # the main view's box: left, top, right, bottom
SLOTS = ((300, 40), (300, 125), (300, 210))  # the candidate views' top-left corners (80 x 60 each)


def _spaced(rng: random.Random, lo: int, hi: int, n: int, gap: int) -> list[int] | None:
    """`n` sorted integers in [lo, hi] at least `gap` apart, or None when none were found."""
    for _ in range(50):
        got = sorted(rng.sample(range(lo, hi + 1), n)) if hi - lo + 1 >= n else []
        if got and all(b - a >= gap for a, b in zip(got, got[1:])):
            return got
    return None


class Drawing(ImageDomain):
    name = "drawing"
    description = (
        "dimensioned drawings of drilled plates: a dimension, the hole count, a centre distance, the matching view"
    )
    size = (400, 300)

    def scene(self, rng: random.Random, difficulty: int) -> Scene:
        (lo_c, hi_c), sparse, kinds = LEVELS[difficulty]
        while True:
            w, h, dia = rng.randint(30, 110), rng.randint(30, 110), rng.randint(4, 10)
            xs = _spaced(rng, dia + 3, w - dia - 3, rng.randint(lo_c, hi_c), 2 * dia + 4)
            ys = _spaced(rng, dia + 3, h - dia - 3, rng.randint(1, 3), 2 * dia + 4)
            if xs and ys:
                break
        holes = [[x, y] for x in xs for y in ys]
        if (sparse or rng.random() < 0.5) and len(holes) > 2:  # the count is counted, not columns x rows
            holes = sorted(rng.sample(holes, rng.randint(2, len(holes))))
        cols = sorted({x for x, _ in holes})
        dims = [cols[0], cols[-1]] if len(cols) > 1 else [cols[0]]
        spec: dict[str, Any] = {"w": w, "h": h, "dia": dia, "holes": holes, "dims": dims, "views": []}
        kind = rng.choice([k for k in kinds if k != "pitch" or len(dims) == 2])
        printed = [w, h, dia, *dims]
        shortcuts = {"largest": str(max(printed)), "first": str(dims[0])}
        if kind == "width":
            answer, shortcuts["other"] = w, str(h)
        elif kind == "height":
            answer, shortcuts["other"] = h, str(w)
        elif kind == "holes":
            answer = len(holes)
            shortcuts = {"dimensioned": str(len(dims)), "columns": str(len(cols)), "four": "4"}
        elif kind == "diameter":
            answer, shortcuts["radius"] = dia, str(dia // 2)
        elif kind == "pitch":
            answer, shortcuts["far"] = dims[1] - dims[0], str(dims[1])
        else:
            letters = rng.sample(LETTERS, 3)
            views = [{"w": w, "h": h, "holes": holes}, self._fewer_or_more(rng, spec), self._reshaped(spec)]
            order = rng.sample(range(3), 3)
            spec["views"] = [{"letter": letters[k], **views[i]} for k, i in enumerate(order)]
            answer = letters[order.index(0)]
            return Scene(
                spec, QUESTIONS[kind], answer, "letter", shortcuts={"top": letters[0], "bottom": letters[2]}, ask=kind
            )
        return Scene(spec, QUESTIONS[kind], str(answer), "number", shortcuts=shortcuts, ask=kind)

    @staticmethod
    def _fewer_or_more(rng: random.Random, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The part with one hole left out (when it has two or more), else with one more beside it."""
        holes = [list(p) for p in spec["holes"]]
        if len(holes) > 1:
            holes.pop(rng.randrange(len(holes)))
        else:
            x, y = holes[0]
            holes.append([x + 2 * spec["dia"] + 4 if x < spec["w"] / 2 else x - 2 * spec["dia"] - 4, y])
        return {"w": spec["w"], "h": spec["h"], "holes": holes}

    @staticmethod
    def _reshaped(spec: Mapping[str, Any]) -> dict[str, Any]:
        """The part with its proportions changed (half again as tall, or as wide when it is tall), its
        holes kept where they are relative to its corner."""
        w, h = spec["w"], spec["h"]
        return (
            {"w": w, "h": h * 3 // 2, "holes": spec["holes"]}
            if w >= h
            else {"w": w * 3 // 2, "h": h, "holes": spec["holes"]}
        )

    def render(self, spec: Mapping[str, Any]) -> Any:
        img, d = canvas(*self.size)
        d.text((10, 12), "MAIN VIEW", fill=INK, font=font(11), anchor="lm")
        w, h, dia = spec["w"], spec["h"], spec["dia"]
        left, top, right, bottom = AREA
        s = min((right - left) / w, (bottom - top) / h)
        x0, y0 = left + ((right - left) - w * s) / 2, top + ((bottom - top) - h * s) / 2
        x1, y1 = x0 + w * s, y0 + h * s
        d.rectangle([x0, y0, x1, y1], outline=INK, width=2)
        for hx, hy in spec["holes"]:
            cx, cy, r = x0 + hx * s, y0 + hy * s, dia * s / 2
            d.ellipse([cx - r, cy - r, cx + r, cy + r], outline=INK, width=2)
            d.line([(cx - r - 3, cy), (cx + r + 3, cy)], fill=THIN)  # centre marks
            d.line([(cx, cy - r - 3), (cx, cy + r + 3)], fill=THIN)
        self._dim_h(d, x0, x1, y1 + 20, str(w), ext_from=y1)  # overall width, below
        self._dim_v(d, y0, y1, x1 + 16, str(h), ext_from=x1)  # overall height, right
        for k, dx in enumerate(spec["dims"]):  # hole columns from the left edge, above
            self._dim_h(d, x0, x0 + dx * s, y0 - 12 - 16 * k, str(dx), ext_from=y0)
        hx, hy = max(spec["holes"], key=lambda p: p[0] - p[1])  # the top-right hole takes the leader
        cx, cy, r = x0 + hx * s, y0 + hy * s, dia * s / 2
        tx, ty = x1 + 12, y0 - 24  # above the part, right of the column dimensions
        d.line([(cx + r * 0.7, cy - r * 0.7), (tx, ty)], fill=THIN)
        d.text((tx + 2, ty), f"DIA {dia}", fill=INK, font=font(12), anchor="lm")
        for view, (vx, vy) in zip(spec["views"], SLOTS):
            self._small(d, view, vx, vy, dia)
        return img

    @staticmethod
    def _arrow(d: Any, tip: tuple[float, float], dx: float, dy: float) -> None:
        (x, y), px, py = tip, -dy, dx
        d.polygon(
            [(x, y), (x - 6 * dx + 2.5 * px, y - 6 * dy + 2.5 * py), (x - 6 * dx - 2.5 * px, y - 6 * dy - 2.5 * py)],
            fill=THIN,
        )

    def _dim_h(self, d: Any, xa: float, xb: float, y: float, text: str, ext_from: float) -> None:
        for x in (xa, xb):
            d.line([(x, ext_from + (2 if y > ext_from else -2)), (x, y + (3 if y > ext_from else -3))], fill=THIN)
        d.line([(xa, y), (xb, y)], fill=THIN)
        self._arrow(d, (xa, y), -1, 0)
        self._arrow(d, (xb, y), 1, 0)
        box = d.textbbox(((xa + xb) / 2, y), text, font=font(11), anchor="mm")
        d.rectangle([box[0] - 1, box[1] - 1, box[2] + 1, box[3] + 1], fill=(255, 255, 255))
        text_centred(d, ((xa + xb) / 2, y), text, 11)

    def _dim_v(self, d: Any, ya: float, yb: float, x: float, text: str, ext_from: float) -> None:
        for y in (ya, yb):
            d.line([(ext_from + 2, y), (x + 3, y)], fill=THIN)
        d.line([(x, ya), (x, yb)], fill=THIN)
        self._arrow(d, (x, ya), 0, -1)
        self._arrow(d, (x, yb), 0, 1)
        d.text((x + 5, (ya + yb) / 2), text, fill=INK, font=font(11), anchor="lm")

    @staticmethod
    def _small(d: Any, view: Mapping[str, Any], vx: float, vy: float, dia: int) -> None:
        w, h = view["w"], view["h"]
        s = min(80 / w, 60 / h)
        x0, y0 = vx + (80 - w * s) / 2, vy + (60 - h * s) / 2
        d.rectangle([x0, y0, x0 + w * s, y0 + h * s], outline=INK, width=1)
        for hx, hy in view["holes"]:
            cx, cy, r = x0 + hx * s, y0 + hy * s, max(1.5, dia * s / 2)
            d.ellipse([cx - r, cy - r, cx + r, cy + r], outline=INK, width=1)
        d.text((vx - 14, vy + 30), view["letter"], fill=INK, font=font(14), anchor="mm")


register(Drawing())
