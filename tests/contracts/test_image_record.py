"""The typed image of the task record (types.Image): built only from a valid PNG bounded in bytes
and pixels, pixels only (no metadata chunk), named by digest wherever a record is shown as JSON or
text, and a text message's record unchanged by the field."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zlib

import pytest
from PIL import Image as PILImage
from PIL import PngImagePlugin

from posttrain.domains.hygiene import prompt_key
from posttrain.errors import TaskError
from posttrain.rollout import Rollout
from posttrain.types import (
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    Completion,
    Image,
    Message,
    Task,
    TaskMeta,
    check_png,
    to_dict,
)


def _png(width: int = 8, height: int = 6, colour=(200, 10, 10), mode: str = "RGB", **save) -> bytes:
    buf = io.BytesIO()
    PILImage.new(mode, (width, height), colour if mode == "RGB" else 3).save(buf, "PNG", **save)
    return buf.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _raw_png(width: int, height: int, idat: bytes, interlace: int = 0) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, interlace)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def _task(*images: Image, question: str = "What is shown?") -> Task:
    meta = TaskMeta(split="train", difficulty=1, source="test", taskset_version="v")
    return Task("t:0", "t", (Message("user", question, images),), {"answer": "x"}, meta)


def test_a_valid_png_becomes_an_image_with_its_size_and_digest():
    data = _png(8, 6)
    img = Image.from_png(data)
    assert (img.width, img.height, img.png) == (8, 6, data) and len(img.sha256) == 64
    assert "png" not in repr(img) and img.sha256 in repr(img)  # no bytes in logs
    assert Image.from_png(_png(5, 4, mode="P")).width == 5  # a palette PNG (PLTE) is pixels too
    assert Image.from_png(_png(3, 3, mode="L")).height == 3


def test_declared_size_or_digest_not_the_pngs_is_refused():
    data = _png(8, 6)
    good = Image.from_png(data)
    with pytest.raises(TaskError, match="declared 9x6"):
        Image(data, 9, 6, good.sha256)
    with pytest.raises(TaskError, match="declared"):
        Image(data, 8, 6, "0" * 64)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (bytearray(_png()), "must be bytes"),
        (b"GIF89a" + b"\0" * 40, "PNG signature"),
        (_png()[:-5], "truncated|runs past"),
        (_png()[:40] + bytes([_png()[40] ^ 1]) + _png()[41:], "CRC"),
        (_png() + b"trailing", "IEND"),
        (_raw_png(4, 4, zlib.compress(b"\0" * (4 * 13)), interlace=1), "interlaced"),
        (_raw_png(4, 4, zlib.compress(b"\0" * (4 * 13 - 1))), "rows"),
        (_raw_png(4, 4, b"not zlib"), "does not inflate"),
        (_raw_png(4, 4, zlib.compress(bytes([9] + [0] * 12) * 4)), "filter byte"),
    ],
    ids=["bytearray", "gif", "truncated", "crc", "trailing", "interlaced", "short-rows", "not-zlib", "filter"],
)
def test_what_is_not_a_valid_png_is_refused_naming_why(data, why):
    with pytest.raises(TaskError, match=why):
        Image.from_png(data)


def test_metadata_chunks_are_refused():
    info = PngImagePlugin.PngInfo()
    info.add_text("answer", "42")
    with pytest.raises(TaskError, match="'tEXt' is not allowed"):
        Image.from_png(_png(pnginfo=info))
    with pytest.raises(TaskError, match="'pHYs' is not allowed"):
        Image.from_png(_png(dpi=(72, 72)))


def test_bounded_in_bytes_and_pixels_and_a_decompression_bomb_is_not_expanded():
    side = 2049  # one column over 2048 x 2048
    assert side * 2048 > MAX_IMAGE_PIXELS
    big = _raw_png(side, 2048, zlib.compress(b"\0" * ((side * 3 + 1) * 2048)))
    assert len(big) < MAX_IMAGE_BYTES
    with pytest.raises(TaskError, match="pixels"):
        Image.from_png(big)
    with pytest.raises(TaskError, match="at most"):
        Image.from_png(_png() + b"\0" * MAX_IMAGE_BYTES)
    # 4x4 declared, a 2 MB stream of zeros inside: inflated only as far as 4 rows and one byte
    bomb = _raw_png(4, 4, zlib.compress(b"\0" * 2_000_000))
    with pytest.raises(TaskError, match="rows"):
        check_png(bomb)


def test_a_text_message_record_is_as_before_and_an_image_is_shown_by_digest():
    assert to_dict(Message("user", "hi")) == {"role": "user", "content": "hi"}
    img = Image.from_png(_png())
    task = _task(img)
    shown = to_dict(task)
    assert shown["prompt"][0]["images"] == [{"width": 8, "height": 6, "sha256": img.sha256}]
    json.dumps(shown)  # JSON, no bytes
    assert task.images == (img,) and _task().images == ()


def test_round_trip_through_pickle_and_equality():
    img = Image.from_png(_png())
    task = _task(img)
    back = pickle.loads(pickle.dumps(task))
    assert back == task and back.prompt[0].images[0].png == img.png


def test_the_trace_and_the_task_keys_name_images_by_digest():
    a, b = Image.from_png(_png(colour=(1, 2, 3))), Image.from_png(_png(colour=(3, 2, 1)))
    c = Completion((1,), (2,), "x", (0.0,), "stop")
    text = Rollout(_task(a), c, "g", None, id="g/0").prompt_text
    assert text == f"What is shown?\n[image 8x6 sha256:{a.sha256}]"
    assert Rollout(_task(), c, "g", None, id="g/0").prompt_text == "What is shown?"
    # one question of two images: two tasks for dedupe and the held-out sets
    assert prompt_key(_task(a)) != prompt_key(_task(b))
    assert prompt_key(_task(a)) == prompt_key(_task(a))
