"""An evaluation sample's images, drawn again for the report's sample table.

Invariant: an image is shown only when the task drawn again from its id has exactly the images
the evaluation recorded (their sha256, in order); otherwise the sample says why none is shown,
and never shows another image in its place.

eval_samples.jsonl names an image task's images by sha256 only (`images`), not by their bytes:
a run's evaluations write every held-out item each time (a chart, UI or drawing PNG is 3-7 KB,
its digest 64 characters), and the image families draw a task's image as a pure function of its
id (`domain:split:level:index`, domains/_vision.py), so the report draws the few it shows (best,
worst, most common failure per domain) again, in about 10 ms each.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.errors import TaskError
from posttrain.types import Image

WIDTH = 160
"""Pixels wide an image is shown at in the sample table (its height in proportion)."""


@dataclass(frozen=True)
class Drawn:
    """A sample's images drawn again (empty when they could not be: `problem` says why) and the
    task's gold answer ("" when the task could not be drawn)."""

    images: tuple[Image, ...]
    gold: str
    problem: str = ""


@functools.lru_cache(maxsize=256)
def _draw(task_id: str, digests: tuple[str, ...]) -> Drawn:
    from posttrain.domains.registry import get

    parts = task_id.split(":")
    if len(parts) != 4 or not (parts[2].isdigit() and parts[3].isdigit()):
        return Drawn((), "", f"task id {task_id!r} is not domain:split:level:index, so its image cannot be drawn")
    name, split, level, index = parts
    try:
        domain = get(name)
        task = domain.sample(int(index), split, int(level))  # type: ignore[arg-type]
    except (TaskError, ValueError, RuntimeError) as exc:  # unknown domain, bad split or level, none drawn
        return Drawn((), "", f"task {task_id} cannot be drawn again: {exc}")
    images = tuple(i for m in task.prompt for i in m.images)
    gold = domain.gold(task)
    if tuple(i.sha256 for i in images) != digests:
        drawn = ", ".join(i.sha256[:12] for i in images) or "none"
        recorded = ", ".join(d[:12] for d in digests)
        why = f"the {name} family now draws other images for {task_id} (recorded {recorded}; drawn {drawn})"
        return Drawn((), gold, why)
    return Drawn(images, gold)


def draw(task_id: str, digests: Sequence[str]) -> Drawn:
    """The images of task `task_id` whose sha256 the evaluation recorded (`digests`, in order),
    drawn again from the id, and the task's gold answer."""
    return _draw(str(task_id), tuple(str(d) for d in digests))


def data_url(image: Image) -> str:
    """The image as an inline `data:image/png;base64,...` URL."""
    return "data:image/png;base64," + base64.b64encode(image.png).decode("ascii")
