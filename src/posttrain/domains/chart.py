"""chart: a bar, line or pie chart with its values printed, and a question read or computed from
them (issue 40). The image carries the whole answer; the question names at most the categories.

Levels: 1, three or four categories with values 1-50, asked which is largest or a category's
value; 2, four or five categories with values 1-99, also the smallest and the difference of two;
3, five to seven categories with values 10-199, also the total. Values within a chart are
distinct, so the largest and the smallest are one category each. Bars and pie slices carry
their values (a pie's in its legend, beside each label); a line chart's points carry theirs and
its categories are consecutive months. Answers: a category (case and spaces ignored) or an
integer, inside <answer></answer> (`_vision.judge`). Shortcuts declared as cheats: the first and
the last category, the largest and the first value, the two values summed when their difference is asked.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from posttrain.domains._vision import ImageDomain, Scene, canvas, font, text_centred
from posttrain.domains.registry import register

FRUITS = (
    "Apples Pears Plums Figs Limes Kiwis Mangos Grapes Melons Cherries Lemons Dates Oranges Peaches Guavas Papayas"
).split()
MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
TITLES = ("Fruit sold", "Crates shipped", "Orders taken", "Boxes packed", "Stock on hand", "Units returned")
COLOURS = ((66, 133, 244), (219, 68, 55), (244, 180, 0), (15, 157, 88), (171, 71, 188), (0, 172, 193), (255, 112, 67))
# level -> (category counts, value range, question kinds)
LEVELS: dict[int, tuple[tuple[int, int], tuple[int, int], tuple[str, ...]]] = {
    1: ((3, 4), (1, 50), ("max", "value")),
    2: ((4, 5), (1, 99), ("max", "min", "value", "diff")),
    3: ((5, 7), (10, 199), ("max", "min", "value", "diff", "sum")),
}


class Chart(ImageDomain):
    name = "chart"
    description = "bar, line and pie charts with printed values: the largest, a value, a difference, the total"

    def scene(self, rng: random.Random, difficulty: int) -> Scene:
        (lo_n, hi_n), (lo_v, hi_v), kinds = LEVELS[difficulty]
        chart = rng.choice(("bar", "line", "pie"))
        n = rng.randint(lo_n, hi_n)
        if chart == "line":
            start = rng.randrange(12 - n + 1)
            labels = MONTHS[start : start + n]
        else:
            labels = rng.sample(FRUITS, n)
        values = rng.sample(range(lo_v, hi_v + 1), n)
        spec = {"chart": chart, "title": rng.choice(TITLES), "labels": labels, "values": values}
        kind = rng.choice(kinds)
        by = dict(zip(labels, values))
        noun = "month" if chart == "line" else "category"
        if kind == "max":
            q, answer, akind = f"Which {noun} has the largest value?", max(by, key=by.__getitem__), "label"
        elif kind == "min":
            q, answer, akind = f"Which {noun} has the smallest value?", min(by, key=by.__getitem__), "label"
        elif kind == "value":
            a = rng.choice(labels)
            q, answer, akind = f"What is the value of {a}?", str(by[a]), "number"
        elif kind == "diff":
            a, b = sorted(rng.sample(labels, 2), key=by.__getitem__, reverse=True)
            q, answer, akind = (
                f"By how much does the value of {a} exceed the value of {b}?",
                str(by[a] - by[b]),
                "number",
            )
        else:
            q, answer, akind = "What is the total of all the values in the chart?", str(sum(values)), "number"
        shortcuts = (
            {"first": labels[0], "last": labels[-1]}
            if akind == "label"
            else {"largest": str(max(values)), "first": str(values[0])}
        )
        if kind == "diff":
            shortcuts["sum"] = str(by[a] + by[b])
        return Scene(spec, q, answer, akind, shortcuts=shortcuts, ask=kind)

    def render(self, spec: Mapping[str, Any]) -> Any:
        w, h = self.size
        img, d = canvas(w, h)
        text_centred(d, (w / 2, 14), spec["title"], 15)
        labels, values = spec["labels"], spec["values"]
        if spec["chart"] == "pie":
            self._pie(d, labels, values)
            return img
        left, right, top, bottom = plot_area(w, h)
        top_v = max(values) * 1.15
        d.line([(left, top - 6), (left, bottom), (right, bottom)], fill=(0, 0, 0), width=1)
        for k in range(5):  # unlabelled gridlines: the printed values are the data
            y = bottom - (bottom - top) * k / 4
            d.line([(left + 1, y), (right, y)], fill=(225, 225, 225))
        slot = (right - left) / len(values)
        points = []
        for i, (label, v) in enumerate(zip(labels, values)):
            cx = left + slot * (i + 0.5)
            y = bottom - (bottom - top) * v / top_v
            text_centred(d, (cx, bottom + 12), label, 11)
            if spec["chart"] == "bar":
                d.rectangle([cx - slot * 0.32, y, cx + slot * 0.32, bottom - 1], fill=COLOURS[0])
            points.append((cx, y))
        if spec["chart"] == "line":
            d.line(points, fill=COLOURS[1], width=2)
            for x, y in points:
                d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=COLOURS[1])
        for (x, y), v in zip(points, values):
            if spec["chart"] == "line":  # the value on white, over the line it may cross
                d.rectangle(d.textbbox((x, y - 10), str(v), font=font(12), anchor="mm"), fill=(255, 255, 255))
            text_centred(d, (x, y - 10), str(v), 12)
        return img

    def regions(self, spec: Mapping[str, Any]) -> dict[str, tuple[int, int, int, int]]:
        """Each category's box (x0, y0, x1, y1, inclusive, in the pixels of `render`) holding what
        is printed for it: a bar's or point's whole column (the plot's full height, so the box
        says nothing of the value) with its value and name, a pie's legend row (swatch, name and
        value). From the layout `render` draws with."""
        w, h = self.size
        if spec["chart"] == "pie":
            x0 = LEGEND_X - 2
            return {label: (x0, _legend_y(i) - 9, w - 1, _legend_y(i) + 9) for i, label in enumerate(spec["labels"])}
        left, right, top, bottom = plot_area(w, h)
        slot = (right - left) / len(spec["labels"])
        out = {}
        for i, label in enumerate(spec["labels"]):
            cx = left + slot * (i + 0.5)
            out[label] = (int(cx - slot / 2), top - 20, min(w - 1, int(cx + slot / 2)), min(h - 1, bottom + 20))
        return out

    def _pie(self, d: Any, labels: list[str], values: list[int]) -> None:
        cx, cy, r = 95, 130, 82
        total, angle = sum(values), -90.0
        for i, v in enumerate(values):
            sweep = 360.0 * v / total
            d.pieslice([cx - r, cy - r, cx + r, cy + r], angle, angle + sweep, fill=COLOURS[i], outline=(255, 255, 255))
            angle += sweep
        for i, (label, v) in enumerate(zip(labels, values)):
            y = _legend_y(i)
            d.rectangle([LEGEND_X, y - 6, LEGEND_X + 12, y + 6], fill=COLOURS[i])
            d.text((LEGEND_X + 18, y), f"{label} {v}", fill=(0, 0, 0), font=font(12), anchor="lm")


def plot_area(w: int, h: int) -> tuple[int, int, int, int]:
    """(left, right, top, bottom) of a bar or line chart's axes in a `w` x `h` render."""
    return 36, w - 12, 40, h - 30


LEGEND_X = 196
"""The left edge of a pie legend's colour swatch (its name and value follow at +18)."""


def _legend_y(i: int) -> int:
    """The centre line of a pie legend's row `i`."""
    return 42 + i * 24


CHART = Chart()
register(CHART)
