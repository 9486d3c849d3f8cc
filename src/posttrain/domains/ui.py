"""ui: a rendered application screen (a title bar, labelled text fields, checkboxes, a row of
buttons) and a question about one element: its label, or where to click it (issue 40).

Levels: 1, one or two fields and two or three buttons, asked the highlighted (blue) button's label
or where to press a named button; 2, two or three fields, one or two checkboxes and two or three
buttons, also where to type into a named field (its input box, not its label) and the label of the
row (a field or a checkbox) directly below a named field; 3, three or four fields, two or three
checkboxes, three or four buttons, also which checkbox is ticked and where to click to tick a named
checkbox (its square). Positions, widths and
the buttons' alignment vary with the seed. A click answer is `x,y` in the image's pixels (x from
the left edge, y from the top); it scores when it falls inside the element's box, edges included.
Shortcuts declared as cheats: the image centre, the first button's centre, the named field's
label instead of its box, the pixel just outside the box's corner, 0,0; the first and the last
button's label, the named field's own label, the first and the last row's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from posttrain.domains._vision import ImageDomain, Scene, canvas, font, text_centred
from posttrain.domains.registry import register

APPS = ("Account settings", "New contact", "Sign up", "Shipping details", "Profile", "Billing", "Preferences")
FIELDS = "Email Name Phone City Street Company Password Username Country Website Surname Postcode".split()
CHECKS = ("Remember me", "Newsletter", "Dark mode", "Auto save", "Notifications", "Public profile", "Two factor")
BUTTONS = "Save Cancel Submit Delete Apply Reset Next Back Export Print Send Close Retry Upload".split()
# level -> (field counts, checkbox counts, button counts, question kinds)
LEVELS: dict[int, tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[str, ...]]] = {
    1: ((1, 2), (0, 0), (2, 3), ("primary", "click_button")),
    2: ((2, 3), (1, 2), (2, 3), ("primary", "click_button", "click_field", "below")),
    3: ((3, 4), (2, 3), (3, 4), ("click_button", "click_field", "below", "checked", "click_check")),
}
ROW, BUTTON_Y = 26, 204
BLUE, GREY = (37, 99, 235), (229, 231, 235)


def _centre(box: list[int]) -> str:
    return f"{(box[0] + box[2]) // 2},{(box[1] + box[3]) // 2}"


class UI(ImageDomain):
    name = "ui"
    description = "rendered screens of fields, checkboxes and buttons: an element's label, or a click point inside it"

    def scene(self, rng: random.Random, difficulty: int) -> Scene:
        nf, nc, nb, kinds = LEVELS[difficulty]
        fields = rng.sample(FIELDS, rng.randint(*nf))
        checks = rng.sample(CHECKS, rng.randint(*nc))
        buttons = rng.sample(BUTTONS, rng.randint(*nb))
        box_x, box_w, top = rng.randint(92, 124), rng.randint(120, 180), rng.randint(34, 60)
        spec: dict[str, Any] = {"title": rng.choice(APPS), "fields": [], "checks": [], "buttons": []}
        for i, label in enumerate(fields):
            y = top + i * ROW
            spec["fields"].append({"label": label, "at": [14, y + 10], "box": [box_x, y, box_x + box_w, y + 20]})
        ticked = rng.randrange(len(checks)) if checks else -1
        for j, label in enumerate(checks):
            y, x = top + (len(fields) + j) * ROW, rng.randint(14, 40)
            spec["checks"].append({"label": label, "box": [x, y + 3, x + 14, y + 17], "ticked": j == ticked})
        widths = [int(font(12).getlength(b)) + 2 * rng.randint(8, 14) for b in buttons]
        gap = rng.randint(4, 12)
        while (span := sum(widths) + gap * (len(buttons) - 1)) > self.size[0] - 24:
            widths = [bw - 2 for bw in widths]  # a narrow screen: the buttons lose padding
        x = rng.choice((12, self.size[0] - 12 - span, rng.randint(12, self.size[0] - 12 - span)))
        primary = rng.randrange(len(buttons))
        for k, (label, bw) in enumerate(zip(buttons, widths)):
            spec["buttons"].append(
                {"label": label, "box": [x, BUTTON_Y, x + bw, BUTTON_Y + 24], "primary": k == primary}
            )
            x += bw + gap
        return self._ask(rng, rng.choice(kinds), spec)

    def _ask(self, rng: random.Random, kind: str, spec: dict[str, Any]) -> Scene:
        fields, checks, buttons = spec["fields"], spec["checks"], spec["buttons"]
        firsts = {"first": buttons[0]["label"], "last": buttons[-1]["label"]}
        if kind == "primary":
            q = "What is the label of the highlighted (blue) button?"
            return Scene(
                spec, q, next(b["label"] for b in buttons if b["primary"]), "label", shortcuts=firsts, ask=kind
            )
        if kind == "below":
            rows = [r["label"] for r in fields + checks]  # a field, then the row under it: a field or a checkbox
            i = rng.randrange(min(len(fields), len(rows) - 1))
            q = f"What is the label of the row directly below the {rows[i]} field?"
            named = {"named": rows[i], "first": rows[0], "last_field": fields[-1]["label"], "last": rows[-1]}
            return Scene(spec, q, rows[i + 1], "label", shortcuts=named, ask=kind)
        if kind == "checked":
            q = "What is the label of the checkbox that is ticked?"
            named = {"first": checks[0]["label"], "last": checks[-1]["label"]}
            return Scene(spec, q, next(c["label"] for c in checks if c["ticked"]), "label", shortcuts=named, ask=kind)
        if kind == "click_button":
            target = rng.choice(buttons)
            q = f"Where would you click to press the {target['label']} button?"
        elif kind == "click_field":
            target = rng.choice(fields)
            q = f"Where would you click to type into the {target['label']} field?"
        else:
            target = rng.choice(checks)
            q = f"Where would you click to tick the {target['label']} checkbox?"
        q += " Answer with the point as x,y in pixels of the image, x from the left edge and y from the top."
        box = target["box"]
        w, h = self.size
        shortcuts = {
            "centre": f"{w // 2},{h // 2}",
            "first_button": _centre(buttons[0]["box"]),
            "outside_corner": f"{box[0] - 1},{box[1] - 1}",
            "origin": "0,0",
        }
        if "at" in target:
            shortcuts["label"] = f"{target['at'][0] + 10},{target['at'][1]}"
        return Scene(spec, q, _centre(box), "point", tuple(box), shortcuts, ask=kind)

    def render(self, spec: Mapping[str, Any]) -> Any:
        w, h = self.size
        img, d = canvas(w, h)
        d.rectangle([0, 0, w - 1, 25], fill=(31, 41, 55))
        d.text((10, 13), spec["title"], fill=(255, 255, 255), font=font(13), anchor="lm")
        for f in spec["fields"]:
            d.text(tuple(f["at"]), f["label"], fill=(17, 24, 39), font=font(12), anchor="lm")
            d.rectangle(f["box"], fill=(255, 255, 255), outline=(156, 163, 175))
        for c in spec["checks"]:
            x0, y0, x1, y1 = c["box"]
            d.rectangle(c["box"], fill=BLUE if c["ticked"] else (255, 255, 255), outline=(107, 114, 128))
            if c["ticked"]:
                d.line([(x0 + 3, y0 + 7), (x0 + 6, y1 - 3), (x1 - 3, y0 + 3)], fill=(255, 255, 255), width=2)
            d.text((x1 + 8, (y0 + y1) / 2), c["label"], fill=(17, 24, 39), font=font(12), anchor="lm")
        for b in spec["buttons"]:
            x0, y0, x1, y1 = b["box"]
            fill, ink = (BLUE, (255, 255, 255)) if b["primary"] else (GREY, (17, 24, 39))
            d.rounded_rectangle(b["box"], radius=5, fill=fill, outline=(107, 114, 128) if not b["primary"] else None)
            text_centred(d, ((x0 + x1) / 2, (y0 + y1) / 2), b["label"], 12, ink)
        return img


register(UI())
