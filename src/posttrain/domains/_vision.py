"""What the image task families (chart.py, ui.py, drawing.py) share: the scene a seed draws,
its rendering to a metadata-free PNG, the answer verifier and the declared cheats.

Invariant: a task's image is a pure function of its scene, and its scene of (domain, version,
level, split, index, attempt); the PNG holds IHDR, IDAT and IEND only (8-bit RGB, one IDAT,
zlib level 6, every row filter 0), written here from the pixels and never by an image library's
encoder, so no text, time or software chunk can carry the answer and the bytes are the same in
every process. The split is decided by the scene and the question together (`split_of` on their
canonical JSON): one question asked of many images spreads over both splits.

Pillow is imported on the first render, never when the registry loads.
"""

from __future__ import annotations

import abc
import contextvars
import functools
import json
import random
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from posttrain.domains.base import Budget, Domain, extract_answer, split_of, stable_rng
from posttrain.types import Episode, Image, Message, Score, Split, Task, TaskMeta

INSTRUCTION = "Give only the answer inside <answer></answer> tags."
_MAX_ATTEMPTS = 10_000
_NUMBER = re.compile(r"-?\d+")
_POINT = re.compile(r"\(?\s*(\d+)\s*,\s*(\d+)\s*\)?")


@dataclass(frozen=True)
class Scene:
    """One drawn task before rendering: what to draw (`spec`, plain JSON), the question (`ask` names
    it), the answer and its kind ("label", "number", "letter" or "point": any x,y inside `box`, inclusive), and the
    shortcut answers a policy that does not read the image well would give (named; the cheats)."""

    spec: Mapping[str, Any]
    question: str
    answer: str
    kind: str
    box: tuple[int, int, int, int] | None = None
    shortcuts: Mapping[str, str] = field(default_factory=dict)
    ask: str = ""
    """Which of the family's questions this is ("max", "click_button", "holes", ...)."""

    def key(self) -> str:
        """The canonical text the split is decided by: the scene and the question."""
        return json.dumps([self.spec, self.question], sort_keys=True)


def encode_png(pixels: bytes, width: int, height: int) -> bytes:
    """8-bit RGB `pixels` (row-major, 3 bytes a pixel) as a PNG of IHDR, one IDAT and IEND only."""
    if len(pixels) != width * height * 3:
        raise ValueError(f"encode_png: {len(pixels)} bytes for {width}x{height} RGB")
    stride = width * 3
    raw = b"".join(b"\x00" + pixels[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


@functools.lru_cache(maxsize=16)
def font(size: int) -> Any:
    """Pillow's bundled scalable font at `size` pixels (the same glyphs in every process)."""
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


@dataclass(frozen=True)
class Printed:
    """One string a render printed: its text, its box on the canvas (left, top, right, bottom) and
    each character's centre (x from the font's advances from the box's left edge, y the box's
    middle), in canvas pixels."""

    text: str
    box: tuple[float, float, float, float]
    centres: tuple[tuple[float, float], ...]


_PRINTED: contextvars.ContextVar[list[Printed] | None] = contextvars.ContextVar("printed", default=None)


@functools.lru_cache(maxsize=1)
def _draw_class() -> Any:
    """Pillow's drawing context, recording each string it prints while `ImageDomain.printed` asks
    (the pixels drawn are Pillow's own either way)."""
    from PIL import ImageDraw

    class Draw(ImageDraw.ImageDraw):  # type: ignore[misc, valid-type]
        def text(self, xy: Any, text: Any, fill: Any = None, font: Any = None, anchor: Any = None, *a: Any, **k: Any):
            seen = _PRINTED.get()
            if seen is not None and "\n" not in str(text):  # multi-line text comes back here a line at a time
                s = str(text)
                box = tuple(float(v) for v in self.textbbox(xy, s, font=font, anchor=anchor))
                mid = (box[1] + box[3]) / 2
                centres = tuple(
                    (box[0] + (font.getlength(s[:i]) + font.getlength(s[: i + 1])) / 2, mid) for i in range(len(s))
                )
                seen.append(Printed(s, box, centres))  # type: ignore[arg-type]
            return super().text(xy, text, fill, font, anchor, *a, **k)

    return Draw


def canvas(width: int, height: int) -> tuple[Any, Any]:
    """A white RGB image and its drawing context (Pillow's, which `ImageDomain.printed` can watch)."""
    from PIL import Image as PILImage

    img = PILImage.new("RGB", (width, height), (255, 255, 255))
    return img, _draw_class()(img)


def text_centred(draw: Any, xy: tuple[float, float], text: str, size: int, fill: Any = (0, 0, 0)) -> None:
    draw.text(xy, text, fill=fill, font=font(size), anchor="mm")


def normal_label(text: str) -> str:
    return " ".join(text.split()).casefold()


def inside(point: tuple[int, int], box: Sequence[int]) -> bool:
    x, y = point
    return box[0] <= x <= box[2] and box[1] <= y <= box[3]


def wrong_shortcuts(reference: Mapping[str, Any]) -> list[str]:
    """The scene's shortcut answers (the first label, the largest number, the image centre, ...)
    that are not also the right answer: what a model answering without reading would give."""
    return [s for s in reference["shortcuts"].values() if not judge(reference, s)[1]]


def wrong_answer(reference: Mapping[str, Any]) -> str:
    """A wrong answer of the reference's kind, bare (no answer tag): a number one off, a point
    just outside the box, else the first wrong shortcut ("none" when there is none)."""
    if reference["kind"] == "number":
        return str(int(reference["answer"]) + 1)
    if reference["kind"] == "point":
        return f"{reference['box'][2] + 3},{reference['box'][3] + 3}"
    others = wrong_shortcuts(reference)
    return others[0] if others else "none"


def judge(reference: Mapping[str, Any], got: str) -> tuple[bool, bool]:
    """(the answer has the kind's form, it is right) for the extracted answer `got`: a label
    equal to the reference up to case and spaces; an integer equal to it; one letter; a point
    `x,y` (optionally in parentheses) inside the reference's box."""
    kind, want = reference["kind"], str(reference["answer"])
    if kind == "label":
        return bool(got.strip()), normal_label(got) == normal_label(want)
    if kind == "number":
        ok = _NUMBER.fullmatch(got.strip()) is not None
        return ok, ok and int(got) == int(want)
    if kind == "letter":
        g = got.strip()
        return len(g) == 1 and g.isalpha(), g.upper() == want
    if kind == "point":
        m = _POINT.fullmatch(got.strip())
        return m is not None, m is not None and inside((int(m.group(1)), int(m.group(2))), reference["box"])
    raise ValueError(f"unknown answer kind {kind!r}")


class ImageAnswer:
    """1.0 when the extracted answer (`extract_answer`) is right for the image's question (`judge`);
    parts: format (the answer has the kind's form) and outcome."""

    name = "image_answer"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        fmt, ok = judge(task.reference, extract_answer(episode.completion))
        reason = (
            "" if ok else "truncated" if episode.finish_reason == "length" else "wrong answer" if fmt else "bad form"
        )
        return Score(1.0 if ok else 0.0, {"format": float(fmt), "outcome": float(ok)}, ok, reason)


class ImageDomain(Domain):
    """A family of single-turn questions about one rendered image. Subclasses draw a `Scene`
    (`scene`) and render its spec (`render`, an RGB Pillow image of `size`). Evaluation-only
    (`trains` False: no `tasks.domains` pattern picks it; a config names it): only a vision
    model's hf engine reads the image (model/vision.py); text engines refuse it (engine/base.py)."""

    category = "vision"
    levels = 3
    trains = False
    budget = Budget(turns=1, tokens=32, seconds=60.0)
    verifier = ImageAnswer()
    size: ClassVar[tuple[int, int]] = (320, 240)
    instruction: ClassVar[str] = INSTRUCTION
    """What follows the question in the prompt (how to answer)."""

    @abc.abstractmethod
    def scene(self, rng: random.Random, difficulty: int) -> Scene:
        """One scene, question and answer at `difficulty`."""

    @abc.abstractmethod
    def render(self, spec: Mapping[str, Any]) -> Any:
        """The scene's picture: an RGB Pillow image of `self.size`."""

    def draw(self, split: Split, index: int, difficulty: int) -> Scene:
        """The scene of task `index` of `split` (the first attempt whose scene hashes to `split`)."""
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        for attempt in range(_MAX_ATTEMPTS):
            sc = self.scene(stable_rng(self.name, self.version, difficulty, split, index, attempt), difficulty)
            if split_of(self.name, sc.key()) == split:
                return sc
        raise RuntimeError(f"{self.name}: no {split} task found at difficulty {difficulty}")

    def printed(self, spec: Mapping[str, Any]) -> tuple[Printed, ...]:
        """Every string the scene's render prints, in drawing order, with its place (`Printed`):
        what a reader of the image reads. The build's reading stage (model/vision.py) learns it
        from train tasks; it is no part of a task record, so a policy never sees it."""
        return self.image_and_printed(spec)[1]

    def image_and_printed(self, spec: Mapping[str, Any]) -> tuple[Image, tuple[Printed, ...]]:
        """The scene's image (`image`) and what it prints (`printed`), from one render."""
        seen: list[Printed] = []
        token = _PRINTED.set(seen)
        try:
            img = self.image(spec)
        finally:
            _PRINTED.reset(token)
        return img, tuple(seen)

    def image(self, spec: Mapping[str, Any]) -> Image:
        img = self.render(spec).convert("RGB")
        if img.size != self.size:
            raise ValueError(f"{self.name}: rendered {img.size}, expected {self.size}")
        return Image.from_png(encode_png(img.tobytes(), *self.size))

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        sc = self.draw(split, index, difficulty)
        reference = {"ask": sc.ask, "kind": sc.kind, "answer": sc.answer, "box": list(sc.box) if sc.box else None}
        reference |= {"shortcuts": dict(sc.shortcuts), "scene": sc.spec}
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", f"{sc.question} {self.instruction}", (self.image(sc.spec),)),),
            reference=reference,
            meta=TaskMeta(split=split, difficulty=difficulty, source="posttrain", taskset_version=self.taskset_version),
        )

    def gold(self, task: Task) -> str:
        return f"<answer>{task.reference['answer']}</answer>"

    def wrong(self, task: Task) -> str:
        return f"<answer>{wrong_answer(task.reference)}</answer>"

    def cheats(self, task: Task) -> Sequence[str]:
        """Empty, the prompt echoed, the answer hidden among wrong ones or outside the final tag,
        two answers, and each of the scene's shortcuts (the first label, the largest number, the
        image centre as click point, ...) where it is not also the right answer."""
        ref, gold = task.reference, str(task.reference["answer"])
        wrong = extract_answer(self.wrong(task))
        shortcuts = wrong_shortcuts(ref)
        return (
            "",
            " ",
            task.prompt[-1].content,
            f"<answer>{wrong} {gold}</answer>",
            f"<answer>{gold} {wrong}</answer>",
            f"<answer>{gold}\n{wrong}</answer>",
            f"{gold} <answer>{wrong}</answer>",
            f"<answer>{wrong}</answer> {gold}",
            *(f"<answer>{s}</answer>" for s in shortcuts),
        )
