"""Typed frozen records that cross stage boundaries.

Invariant: every record here is immutable and JSON-serialisable through
`to_dict`; no stage passes dicts of string keys to another. An image enters a
record only as an `Image` (validated PNG bytes, bounded), and `to_dict` shows it
by digest, never its bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.errors import TaskError

Split = Literal["train", "eval"]
CostClass = Literal["short", "long"]
FinishReason = Literal["stop", "length", "error"]


MAX_IMAGE_BYTES = 4 * 2**20
"""The largest PNG file an `Image` holds (4 MiB)."""
MAX_IMAGE_PIXELS = 2048 * 2048
"""The most pixels (width x height) an `Image` may have."""
PNG_CHUNKS = (b"IHDR", b"PLTE", b"IDAT", b"IEND")
"""The only chunks an `Image`'s PNG may hold: pixels, no text, time or other metadata."""
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOUR = {0: ((1, 2, 4, 8, 16), 1), 2: ((8, 16), 3), 3: ((1, 2, 4, 8), 1), 4: ((8, 16), 2), 6: ((8, 16), 4)}
"""PNG colour type -> (its allowed bit depths, samples per pixel)."""


def check_png(data: bytes) -> tuple[int, int]:
    """The (width, height) of `data`, a PNG an `Image` may hold; TaskError naming what is wrong
    otherwise: not bytes, over MAX_IMAGE_BYTES, not a PNG (signature, a chunk's length or CRC),
    a chunk other than IHDR, PLTE, IDAT, IEND (metadata: text, time, physical size, ...), chunks
    out of order, bytes after IEND, over MAX_IMAGE_PIXELS, an unknown colour type or bit depth,
    interlaced, a palette image without its palette, or pixel data that does not inflate to
    exactly the rows IHDR declares (each with a filter byte 0-4). Inflating is bounded by that
    size, so a decompression bomb is refused before it is expanded."""
    if not isinstance(data, bytes):
        raise TaskError(f"image: PNG data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_IMAGE_BYTES:
        raise TaskError(f"image: {len(data):,} bytes; an image is at most {MAX_IMAGE_BYTES:,} bytes")
    if not data.startswith(_PNG_SIGNATURE):
        raise TaskError("image: not a PNG (the file does not start with the PNG signature)")
    pos, plte = len(_PNG_SIGNATURE), b""
    seen: list[bytes] = []
    idat: list[bytes] = []
    while pos < len(data):
        if len(data) - pos < 12:
            raise TaskError(f"image: not a PNG (a truncated chunk at byte {pos})")
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if len(body) != length or len(data) < pos + 12 + length:
            raise TaskError(f"image: not a PNG (chunk {kind!r} at byte {pos} runs past the end)")
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise TaskError(f"image: not a PNG (chunk {kind!r} at byte {pos} fails its CRC)")
        if kind not in PNG_CHUNKS:
            raise TaskError(
                f"image: PNG chunk {kind.decode('latin-1')!r} is not allowed: an image carries pixels only "
                "(IHDR, PLTE, IDAT, IEND); strip text, time and other metadata"
            )
        if (
            (kind == b"IHDR") != (not seen)
            or (kind == b"PLTE" and (plte or idat))
            or (kind == b"IDAT" and seen[-1] not in (b"IHDR", b"PLTE", b"IDAT"))
        ):
            raise TaskError(f"image: not a PNG (chunk {kind!r} out of order after {[k.decode() for k in seen]})")
        seen.append(kind)
        pos += 12 + length
        if kind == b"IDAT":
            idat.append(body)
        elif kind == b"PLTE":
            plte = body
        elif kind == b"IEND":
            break
    if not seen or seen[-1] != b"IEND" or pos != len(data):
        raise TaskError("image: not a PNG (no IEND chunk at the end of the data)")
    ihdr = data[16:29]
    if len(ihdr) != 13 or struct.unpack(">I", data[8:12])[0] != 13:
        raise TaskError("image: not a PNG (IHDR is not 13 bytes)")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", ihdr)
    if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
        raise TaskError(f"image: {width}x{height} pixels; an image has 1 to {MAX_IMAGE_PIXELS:,} pixels")
    if colour not in _PNG_COLOUR or depth not in _PNG_COLOUR[colour][0] or compression or filtering:
        raise TaskError(f"image: PNG colour type {colour} with bit depth {depth} is not a valid PNG format")
    if interlace:
        raise TaskError("image: interlaced PNGs are not accepted (save it without interlacing)")
    if colour == 3 and (not plte or len(plte) % 3 or len(plte) > 768):
        raise TaskError("image: a palette PNG needs one PLTE chunk of 1 to 256 RGB entries")
    if plte and colour != 3:
        raise TaskError(f"image: a PLTE chunk in a PNG of colour type {colour} (only palette images carry one)")
    if not idat:
        raise TaskError("image: not a PNG (no IDAT chunk: no pixel data)")
    row = (width * depth * _PNG_COLOUR[colour][1] + 7) // 8 + 1
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(b"".join(idat), row * height + 1)
    except zlib.error as exc:
        raise TaskError(f"image: the PNG's pixel data does not inflate ({exc})") from None
    if len(raw) != row * height or not inflate.eof or inflate.unused_data:
        raise TaskError(f"image: the PNG's pixel data is not the {height} rows of {row - 1} bytes its IHDR declares")
    if any(raw[i] > 4 for i in range(0, len(raw), row)):
        raise TaskError("image: the PNG's pixel data has a row filter byte outside 0-4")
    return width, height


def _png_size(data: bytes) -> tuple[int, int]:
    """IHDR's width and height, unchecked ((0, 0) when there is none): `Image.from_png` builds
    the record with them and its check then decides."""
    if isinstance(data, bytes) and len(data) >= 24 and data.startswith(_PNG_SIGNATURE):
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    return 0, 0


@dataclass(frozen=True)
class Image:
    """One image of a task, a PNG: its bytes, size and sha256 digest (hex). Every construction
    checks the bytes (`check_png`: bounded in bytes and pixels, pixels only, no metadata) and that
    the size and digest are theirs, so an Image in a record is always a valid, bounded PNG.
    Build one with `Image.from_png(data)`. `to_dict` shows it by digest and size, never its bytes
    (the trace names an image, it does not store it); repr leaves the bytes out too."""

    png: bytes = field(repr=False, metadata={"to_dict": False})
    width: int
    height: int
    sha256: str

    def __post_init__(self) -> None:
        size = check_png(self.png)
        digest = hashlib.sha256(self.png).hexdigest()
        if size != (self.width, self.height) or digest != self.sha256:
            raise TaskError(
                f"image: declared {self.width}x{self.height} sha256 {self.sha256[:16]}..., "
                f"but the PNG is {size[0]}x{size[1]} sha256 {digest[:16]}..."
            )

    @classmethod
    def from_png(cls, data: bytes) -> Image:
        """The Image of PNG bytes `data` (TaskError naming what is wrong, see `check_png`)."""
        width, height = _png_size(data)
        return cls(data, width, height, hashlib.sha256(data).hexdigest() if isinstance(data, bytes) else "")

    @property
    def marker(self) -> str:
        """How text views of a prompt (the trace's, the task-set keys') name this image."""
        return f"[image {self.width}x{self.height} sha256:{self.sha256}]"


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    images: tuple[Image, ...] = field(default=(), metadata={"omit_empty": True})
    """Images shown with this message (a vision task's screenshot, chart or drawing). Empty for
    text: `to_dict` then leaves the field out, so a text message's record is as before. Engines
    that read text only refuse a message with images (engine/base.py `text_chat`)."""

    def as_text(self) -> str:
        """The message as text: its content, then one line per image naming it by size and digest
        (`Image.marker`); a text message's content unchanged."""
        return "\n".join([self.content, *(i.marker for i in self.images)]) if self.images else self.content


@dataclass(frozen=True)
class TaskMeta:
    split: Split
    difficulty: int
    source: str
    taskset_version: str
    reward_weights: tuple[tuple[str, float], ...] = ()
    """(part, weight) pairs from `tasks.domains.<name>.reward_weights`, stamped by the
    task pool: `Domain.score` makes the reward their weighted mean. Empty: the
    verifier's own value."""
    priority: int | None = None
    """This task's admission priority (None: its domain's, `tasks.domains.<name>.priority`)."""
    branched: int = field(default=0, metadata={"omit_empty": True})
    """Turns of the model's own episode this task's prompt already holds: a task derived from a
    failed turn (`tasks.branch`, tasks/branch.py), whose turn budget is its domain's less these.
    0: a task as its domain samples it (`to_dict` then leaves the field out)."""
    baseline: float | None = field(default=None, metadata={"omit_none": True})
    """The reward this task's group is judged against instead of its own mean (the trainer's
    advantage is reward - baseline): a derived task's under `tasks.branch.baseline: fresh`, the
    reward a fresh first attempt of its root task earned in the group it was derived from. None:
    the group's own mean (every task a domain samples)."""


@dataclass(frozen=True)
class Task:
    """One task. `reference` is hidden from the model; verifiers read it."""

    id: str
    domain: str
    prompt: tuple[Message, ...]
    reference: Any
    meta: TaskMeta

    @property
    def images(self) -> tuple[Image, ...]:
        """Every image of the prompt, in order (empty for a text task)."""
        return tuple(i for m in self.prompt for i in m.images)


@dataclass(frozen=True)
class StepResult:
    """What one `Environment.step` (envs/base.py) returns: the observation, whether the episode is over,
    the turn's reward parts and the turn's sandbox result (traced)."""

    observation: str
    done: bool = False
    parts: Mapping[str, float] = field(default_factory=dict)
    exec_result: Any = None
    images: tuple[Image, ...] = ()
    """Images the environment shows with the observation (a zoomed crop, a re-render), in order:
    the driver puts them on the observation's tool message (`Message.images`), so every later
    turn's context holds them. Each is an `Image` (a checked, bounded PNG); TaskError otherwise."""

    def __post_init__(self) -> None:
        if not isinstance(self.images, tuple) or not all(isinstance(i, Image) for i in self.images):
            raise TaskError(
                f"StepResult.images must be a tuple of Image records (Image.from_png), got {type(self.images).__name__}"
                + ("" if not isinstance(self.images, tuple) else f" of {[type(i).__name__ for i in self.images]}")
            )


@dataclass(frozen=True)
class Turn:
    """One exchange of a multi-turn episode: the model's action, what came back,
    the sandbox result of the turn (traced), the turn's reward parts and the sha256 of each
    image the observation showed (by digest, never the bytes: the trace names them)."""

    action: str
    observation: str = ""
    exec_result: Any = None
    parts: Mapping[str, float] = field(default_factory=dict)
    images: tuple[str, ...] = field(default=(), metadata={"omit_empty": True})
    """sha256 (hex) of each image of the observation (`StepResult.images`), in order; empty for text."""


@dataclass(frozen=True)
class Episode:
    """What a verifier scores: the final completion text and, for multi-turn
    domains, every turn. `exec_result` holds a sandbox result when one ran."""

    completion: str
    turns: tuple[Turn, ...] = ()
    finish_reason: FinishReason = "stop"
    exec_result: Any = None


@dataclass(frozen=True)
class Score:
    """value in [0, 1]; named parts (outcome, protocol, efficiency, ...)."""

    value: float
    parts: Mapping[str, float] = field(default_factory=dict)
    passed: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        if not (0.0 <= self.value <= 1.0):
            raise ValueError(f"Score.value must be in [0, 1], got {self.value!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (already rendered to token ids) to sample `params.n` times."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    request_id: str = ""
    sessions: tuple[str, ...] = ()
    """Empty, or one key per sample: the episode each sample continues. An engine that keeps
    contexts (hf with context_reuse) keeps each sample's after the call under its key, and a
    later one-sample request of that key whose prompt starts with the kept tokens computes
    only the rest; `Engine.end_sessions` drops them. Other engines ignore it."""
    images: tuple[Image, ...] = field(default=(), metadata={"omit_empty": True})
    """The prompt's images in the order its image tokens run (a vision engine's `encode_chat`
    puts one run per image). Empty for text. An engine that reads text only refuses a request
    with images; a vision engine refuses one whose image-token runs do not match them."""


@dataclass(frozen=True)
class Completion:
    """One sampled continuation. `logprobs` are the behaviour policy's
    log-probabilities of `token_ids`, one per token."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    model_version: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine did not compute for this completion (the hf engine: a kept
    session's context, or a group-mate's shared prompt); 0 where the engine does not say."""
    fault: str = ""
    """Why the engine's answer for this sample was refused (engine/validate.py: impossible ids,
    log-probs, lengths or version); the completion is then empty and the pipeline masks the
    sample with kind "engine". Empty: a sample of the model."""
    pixel_digest: str = field(default="", metadata={"omit_empty": True})
    """sha256 of the pixel tensor the engine fed the model for the request's images
    (model/vision.py `pixel_digest`); empty for a prompt without images. The trainer recomputes
    the pixels from the images and refuses a row whose digest differs."""
    spec: tuple[int, ...] = field(default=(), metadata={"omit_empty": True})
    """Speculative decoding on this sample (the hf engine with `engine.speculation`): drafts
    verified, draft tokens proposed, draft tokens accepted, over its generation (every turn of an
    episode); empty where nothing was drafted or the engine does not say. Summed with `add_spec`."""


def add_spec(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """Two `Completion.spec` counts summed, field by field (an empty one adds nothing)."""
    if not a or not b:
        return tuple(a or b)
    return tuple(x + y for x, y in zip(a, b, strict=True))


def to_dict(record: Any) -> Any:
    """Plain-JSON view of a record (for traces and metrics). A field declared with metadata
    `to_dict: False` is left out (an Image's bytes), one with `omit_empty` while empty (a
    text message's images), and one with `omit_none` while None (a baseline of 0 is kept)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            omit = (f.metadata.get("omit_empty") and not value) or (f.metadata.get("omit_none") and value is None)
            if f.metadata.get("to_dict", True) and not omit:
                out[f.name] = to_dict(value)
        return out
    if isinstance(record, Mapping):
        return {str(k): to_dict(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    return record
