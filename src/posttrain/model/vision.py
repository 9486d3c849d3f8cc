"""The embedded vision-language model: a tiny LLaVA (a SigLIP vision tower, a two-layer projector
and a Qwen2 language model) that posttrain builds and pretrains on the image families' train tasks.

Invariant: the build is a pure function of its `VisionSpec` (seed included) and of the image
families' code; it sees only train-split tasks (chart, ui, drawing), so their held-out split
stays unseen. A share `buggy_fraction` of the answers it learns are the family's planted wrong
answer (`ImageDomain.wrong`), as the text base learns buggy solvers: partly right, wrong in ways
RL can fix. The folder it writes is a plain Hugging Face one: `AutoModelForImageTextToText` and
`AutoProcessor` load it offline (a `LlavaForConditionalGeneration`, a `LlavaProcessor`), and
the processor's pixel values (`pixel_values`) are the only way an image reaches the model here:
the engine, the trainer and plain transformers all read the same tensors.

The prompt form: a user message with images renders as `<|user|>`, one `<|image|>` run of
`image_tokens` per image, then its text (`chat`); the processor's own expansion of one
`<|image|>` gives the same ids (tested).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import ModelLoadError
from posttrain.types import Image, Message

NAME = "posttrain-vlm"
"""What `model.path` (and any model path) may say for the default build (`VisionSpec()`)."""
IMAGE_TOKEN = "<|image|>"
FAMILIES = ("chart", "drawing", "ui")
INFO = "posttrain_vlm.json"
"""Beside the weights: the spec, the weights digest, the build's seconds and peak RSS."""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}<|image|>{%- else -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
"""The embedded tokenizer's template, with OpenAI-style content parts: an image part renders as
one `<|image|>` (the processor expands it to `image_tokens`)."""


@dataclass(frozen=True)
class VisionSpec:
    """What a VLM build is a function of. `steps` of AdamW at `lr` on batches of `batch_size`
    (image, question, answer) triples drawn from a pool of `pool` train tasks per family, or with
    `fresh` an unseen train task every row (the families in turn). Before them, `ocr_steps` of the
    reading stage (`read_stage`): the vision tower alone names every character the families'
    train images print, in `ocr_slots` sub-columns of each patch. The tower is `tower_width` wide
    and `tower_depth` deep."""

    seed: int = 0
    steps: int = 200
    batch_size: int = 16
    lr: float = 2e-3
    pool: int = 128
    buggy_fraction: float = 0.3
    image_size: int = 96
    patch_size: int = 12
    threads: int = 1
    tower_width: int = 64
    tower_depth: int = 2
    ocr_steps: int = 0
    ocr_slots: int = 8
    read_eval: int = 30
    """Held-out tasks a family the reading stage is measured on (`read_heldout` in `INFO`)."""
    fresh: bool = False

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "pool", "image_size", "patch_size", "threads")
        for name in (*positive, "tower_width", "tower_depth", "ocr_slots", "read_eval"):
            if getattr(self, name) < 1:
                raise ValueError(f"VisionSpec.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.tower_width % 4:
            raise ValueError(
                f"VisionSpec.tower_width must be a multiple of 4 (attention heads), got {self.tower_width}"
            )
        if self.ocr_steps < 0:
            raise ValueError(f"VisionSpec.ocr_steps must be >= 0, got {self.ocr_steps!r}")
        if not 0.0 <= self.buggy_fraction <= 1.0:
            raise ValueError(f"VisionSpec.buggy_fraction must be in [0, 1], got {self.buggy_fraction!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"VisionSpec.image_size {self.image_size} is not a multiple of patch_size")

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def fingerprint(self) -> str:
        """12 hex of the spec; a field at its default before the reading stage existed
        (`_LATER_DEFAULTS`) is left out, so builds made before keep their cache folders."""
        fields = {k: v for k, v in asdict(self).items() if _LATER_DEFAULTS.get(k, object()) != v}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


_LATER_DEFAULTS = {"tower_width": 64, "tower_depth": 2, "ocr_steps": 0, "ocr_slots": 8, "read_eval": 30, "fresh": False}


def default_dir(spec: VisionSpec) -> Path:
    """The cache folder of `spec`'s build (beside the text bases, model/pretrain.py)."""
    from posttrain.model import pretrain

    return pretrain.DEFAULT_CACHE / f"vlm-{spec.fingerprint()}"


def build_tokenizer() -> Any:
    """The embedded char-level tokenizer plus the `<|image|>` special token and `CHAT_TEMPLATE`."""
    from posttrain.model.tokenizer import ROLES
    from posttrain.model.tokenizer import build_tokenizer as text_tokenizer

    tok = text_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [f"<|{r}|>" for r in ROLES] + [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def image_processor(spec: VisionSpec) -> Any:
    """SigLIP's image processor at `spec.image_size` square (bicubic resize, rescale to [0, 1],
    normalise to [-1, 1]); the Pillow backend, which needs no torchvision."""
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    size = {"height": spec.image_size, "width": spec.image_size}
    return SiglipImageProcessorPil(size=size, image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3)


def processor(spec: VisionSpec, tok: Any) -> Any:
    from transformers import LlavaProcessor

    return LlavaProcessor(
        image_processor=image_processor(spec),
        tokenizer=tok,
        patch_size=spec.patch_size,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=0,
    )


def make_config(spec: VisionSpec, tok: Any) -> Any:
    """LlavaConfig: SigLIP tower (`tower_width` hidden, twice that in its MLP, `tower_depth`
    layers, 4 heads), the `tiny` Qwen2 preset as language model, its positions enough for the
    image tokens and a prompt (at least 512)."""
    from transformers import LlavaConfig, SiglipVisionConfig

    from posttrain.model.arch import make_config as text_config

    vision = SiglipVisionConfig(
        hidden_size=spec.tower_width,
        intermediate_size=2 * spec.tower_width,
        num_hidden_layers=spec.tower_depth,
        num_attention_heads=4,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
    )
    positions = max(512, spec.image_tokens + 256)
    text = text_config("tiny", len(tok), tok.pad_token_id, tok.eos_token_id, max_positions=positions)
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_seq_length=spec.image_tokens,
        tie_word_embeddings=True,
    )


def is_vision_model(model_config: Any) -> bool:
    """Whether a loaded model's config takes images (it names an image token)."""
    return getattr(model_config, "image_token_index", None) is not None


def is_vision_dir(path: str | Path) -> bool:
    """Whether a model folder (or a registered model's name) holds a vision model: its
    config.json names an image token. False when there is no readable config (the text loader
    then says what is missing)."""
    from posttrain.model.real import resolve

    try:
        data = json.loads((Path(resolve(path)) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("image_token_index") is not None


def chat(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """`messages` as chat-template dicts: a message with images as content parts, its images first."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.images:
            parts: list[dict[str, Any]] = [{"type": "image"} for _ in m.images]
            out.append({"role": m.role, "content": [*parts, {"type": "text", "text": m.content}]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def expand_ids(ids: Sequence[int], image_id: int, image_tokens: int) -> tuple[int, ...]:
    """`ids` with each `image_id` repeated `image_tokens` times (what the processor does to text)."""
    out: list[int] = []
    for t in ids:
        out.extend([t] * image_tokens if t == image_id else [t])
    return tuple(out)


def prompt_ids(tok: Any, messages: Sequence[dict[str, Any]], image_tokens: int) -> tuple[int, ...]:
    """The ids of chat-template `messages` (`chat`'s form) with the generation prompt, each
    `<|image|>` expanded to `image_tokens` (what the build trains on)."""
    ids = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return expand_ids(ids, tok.convert_tokens_to_ids(IMAGE_TOKEN), image_tokens)


def pixel_values(proc: Any, images: Sequence[Image]) -> Any:
    """The model's input tensor (images x 3 x H x W, float32) for `images`, decoded from their PNG
    bytes and preprocessed by `proc` (a processor or an image processor): a pure function of the
    bytes, so the generator and the trainer that call it on one Image get equal tensors."""
    import io

    import torch
    from PIL import Image as PILImage

    if not images:
        raise ValueError("pixel_values: no images")
    pics = [PILImage.open(io.BytesIO(i.png)).convert("RGB") for i in images]
    ip = getattr(proc, "image_processor", proc)
    out = ip(images=pics, return_tensors="pt")["pixel_values"]
    return out.to(torch.float32).contiguous()


def pixel_digest(pixels: Any) -> str:
    """sha256 (hex) of a pixel tensor's shape and float32 bytes: what the generator saw, in a line."""
    import torch

    t = pixels.detach().to("cpu", torch.float32).contiguous()
    h = hashlib.sha256(json.dumps(list(t.shape)).encode())
    h.update(t.numpy().tobytes())
    return h.hexdigest()


def weights_digest(model: Any) -> str:
    """sha256 (16 hex) over every parameter's name, shape and bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        t = p.detach().cpu().contiguous()
        h.update(f"{name}{list(t.shape)}{t.dtype}".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class _Example:
    """One pretraining example: its prompt ids (images expanded), answer ids, and pixels."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    pixels: Any


def _pool(spec: VisionSpec, tok: Any, proc: Any, rng: random.Random) -> list[_Example]:
    """`spec.pool` train tasks of each family (`_example`); none when the build is `fresh`."""
    if spec.fresh:
        return []
    return [_example(name, index, spec, tok, proc, rng) for name in FAMILIES for index in range(spec.pool)]


def _example(name: str, index: int, spec: VisionSpec, tok: Any, proc: Any, rng: random.Random) -> _Example:
    """Train task `index` of family `name` (its level `1 + index % levels`), answered right or (a
    share `buggy_fraction`, drawn by `rng`) by the family's planted wrong answer."""
    from posttrain.domains.registry import get

    domain = get(name)
    task = domain.sample(index, "train", 1 + index % domain.levels)
    answer = domain.wrong(task) if rng.random() < spec.buggy_fraction else domain.gold(task)
    prompt = prompt_ids(tok, chat(task.prompt), spec.image_tokens)
    images = [i for m in task.prompt for i in m.images]
    return _Example(prompt, tuple(tok.encode(answer, add_special_tokens=False)), pixel_values(proc, images))


CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
"""What the reading stage names (class 1 + index; 0 is no character); others printed are skipped."""


def ocr_targets(printed: Sequence[Any], size: tuple[int, int], spec: VisionSpec) -> Any:
    """The reading stage's target of one image of canvas `size` (width, height): a (patches x
    `ocr_slots`) long tensor, each character it prints (`printed`: `ImageDomain.printed`), at its
    centre mapped to the model's `image_size` grid (the processor's resize: x and y scaled apart),
    in the sub-column of the patch it falls in (1 + its index in `CHARS`; 0 where none). Two in
    one sub-column: the later."""
    import torch

    w, h = size
    g, patch, slots = spec.image_size // spec.patch_size, spec.patch_size, spec.ocr_slots
    tgt = torch.zeros(g, g, slots, dtype=torch.long)
    for p in printed:
        for ch, (cx, cy) in zip(p.text, p.centres):
            if ch not in CHARS:
                continue
            px, py = cx * spec.image_size / w, cy * spec.image_size / h
            gx, gy = int(px // patch), int(py // patch)
            if 0 <= gx < g and 0 <= gy < g:
                tgt[gy, gx, min(slots - 1, int((px - gx * patch) * slots / patch))] = 1 + CHARS.index(ch)
    return tgt.view(g * g, slots)


def patch_logits(tower: Any, head: Any, pixels: Any, shape: Any) -> Any:
    """`head` on the tower's last hidden states (the ones LLaVA's projector reads), viewed as
    `shape` (a per-patch target's) plus the classes."""
    return head(tower(pixels, output_hidden_states=True).hidden_states[-1]).view(*shape, -1)


def dense_step(
    tower: Any, head: Any, pixels: Any, targets: Any, params: list[Any], opt: Any, sched: Any
) -> tuple[Any, float]:
    """One step of a vision tower trained alone on a per-patch target: `patch_logits`,
    cross-entropy against `targets` (class 0:
    nothing there, weighted 0.2, the rest 1), gradients clipped at 1.0, then `opt` and `sched`
    step. Returns the logits (targets' shape plus classes), detached, and the loss."""
    import torch

    logits = patch_logits(tower, head, pixels, targets.shape)
    weight = torch.where(targets > 0, 1.0, 0.2).reshape(-1)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    loss = (nll * weight).sum() / weight.sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    return logits.detach(), float(loss.item())


def read_stage(model: Any, proc: Any, spec: VisionSpec, progress: bool = True) -> dict[str, float]:
    """`spec.ocr_steps` of the vision tower alone learning to read: a linear head on its last
    hidden states names, at every patch sub-column, the character the families' image prints
    there (`ocr_targets`), on batches of 32 unseen train tasks (row k: family k mod 3, task k // 3,
    its levels in turn); AdamW at `spec.lr`, warm-up then cosine (`pretrain_optimizer`); the head
    is dropped after. A dense target teaches the tower a glyph wherever it falls, which the
    questions' one answer an image did not (bench/RESULTS.md, "Can the embedded VLM learn to see
    at all?"). Returns the share of printed characters named right on `spec.read_eval` held-out
    tasks a family at the end of the stage (measured, never trained on; the question stage after
    it trains the tower too)."""
    import torch

    from posttrain.domains.registry import get
    from posttrain.model.pretrain import pretrain_optimizer
    from posttrain.progress import progress as progress_bar

    tower = model.model.vision_tower
    torch.manual_seed(spec.seed + 17)
    head = torch.nn.Linear(tower.config.hidden_size, spec.ocr_slots * (1 + len(CHARS)))
    params = list(tower.parameters()) + list(head.parameters())
    opt, sched = pretrain_optimizer(params, spec.lr, spec.ocr_steps)

    def row(name: str, split: str, index: int) -> tuple[Any, Any]:
        domain = get(name)
        scene = domain.draw(split, index, 1 + index % domain.levels)  # type: ignore[attr-defined]
        image, printed = domain.image_and_printed(scene.spec)  # type: ignore[attr-defined]
        return pixel_values(proc, [image]), ocr_targets(printed, domain.size, spec)  # type: ignore[attr-defined]

    bar = progress_bar(spec.ocr_steps, "read", disable=not progress)
    k = 0
    for step in range(spec.ocr_steps):
        rows = [row(FAMILIES[j % len(FAMILIES)], "train", j // len(FAMILIES)) for j in range(k, k + 32)]
        k += 32
        targets = torch.stack([t for _, t in rows])
        logits, loss = dense_step(tower, head, torch.cat([p for p, _ in rows]), targets, params, opt, sched)
        if step % 20 == 0:
            marked = targets > 0
            right = (logits.argmax(-1)[marked] == targets[marked]).float().mean().item()
            bar.set_postfix(loss=f"{loss:.3f}", chars=f"{right:.2f}")
        bar.update(1)
    bar.close()
    out: dict[str, float] = {}
    with torch.no_grad():
        for name in FAMILIES:
            right = total = 0
            for index in range(spec.read_eval):
                pixels, t = row(name, "eval", index)
                got = patch_logits(tower, head, pixels, t.shape).argmax(-1)
                right += int((got[t > 0] == t[t > 0]).sum())
                total += int((t > 0).sum())
            out[name] = round(right / max(1, total), 4)
    return out


def _batch(tok: Any, examples: Sequence[_Example]) -> tuple[Any, Any, Any, Any]:
    """Right-padded ids, attention mask, loss mask (answer tokens and <|end|>) and pixels."""
    import torch

    from posttrain.model.pretrain import padded

    rows = [list(e.prompt) + list(e.answer) + [tok.eos_token_id] for e in examples]
    masks = [[0] * len(e.prompt) + [1] * (len(e.answer) + 1) for e in examples]
    ids, attn, loss = padded(tok, rows, masks)
    return ids, attn, loss, torch.cat([e.pixels for e in examples])


def save_vlm(model: Any, tok: Any, proc: Any, folder: Path | str) -> None:
    """The weights, the tokenizer and the processor into `folder`: what `load_vlm` reads (the
    caller writes `INFO` beside them)."""
    from posttrain.model.tokenizer import save_tokenizer

    model.save_pretrained(folder)
    save_tokenizer(tok, folder)
    proc.save_pretrained(folder)
    save_tokenizer(tok, folder)  # the processor wrote the tokenizer again, in its plain form


def build_vlm(spec: VisionSpec, out_dir: Path | None = None, progress: bool = True) -> Path:
    """Pretrain and save the VLM; returns its folder. Its spec, weights digest, build seconds and
    peak RSS are stored beside it (`INFO`)."""
    import resource

    import torch
    from transformers import LlavaForConditionalGeneration

    from posttrain.model.pretrain import fit_masked_lm

    began = time.perf_counter()
    out = Path(out_dir) if out_dir else default_dir(spec)
    torch.set_num_threads(spec.threads)
    tok = build_tokenizer()
    proc = processor(spec, tok)
    rng = random.Random(spec.seed)
    pool = _pool(spec, tok, proc, rng)
    torch.manual_seed(spec.seed)
    model = LlavaForConditionalGeneration(make_config(spec, tok))
    model.train()
    reads = read_stage(model, proc, spec, progress) if spec.ocr_steps else None
    drawn = [0]

    def pick() -> _Example:
        if not spec.fresh:
            return rng.choice(pool)
        k = drawn[0]
        drawn[0] += 1
        return _example(FAMILIES[k % len(FAMILIES)], k // len(FAMILIES), spec, tok, proc, rng)

    def next_batch() -> tuple[dict[str, Any], Any]:
        ids, attn, mask, pixels = _batch(tok, [pick() for _ in range(spec.batch_size)])
        return {"input_ids": ids, "attention_mask": attn, "pixel_values": pixels}, mask

    loss = fit_masked_lm(model, next_batch, spec.steps, spec.lr, "pretrain vlm", progress)
    model.eval()
    tmp = out.with_name(out.name + ".tmp")
    save_vlm(model, tok, proc, tmp)
    info = {
        "spec": asdict(spec),
        "weights_digest": weights_digest(model),
        "build_seconds": round(time.perf_counter() - began, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final_loss": round(loss, 4),
    }
    if reads is not None:
        info["read_heldout"] = reads  # the share of printed characters the tower names, held out
    (tmp / INFO).write_text(json.dumps(info, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def ensure_vlm(spec: VisionSpec, progress: bool = True) -> Path:
    """The cached VLM of `spec`, built first when missing (one process builds; others wait on a
    lock file beside it and then find it)."""
    import fcntl

    out = default_dir(spec)
    if (out / INFO).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / INFO).is_file():
            return out
        return build_vlm(spec, out, progress=progress)


def load_vlm(path: str | Path, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any, Any]:
    """(model, tokenizer, processor) of a VLM folder, through the Auto classes, offline."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from posttrain.model.arch import check_model_dir, load_tokenizer

    p = check_model_dir(path)
    try:
        model = AutoModelForImageTextToText.from_pretrained(p, local_files_only=True, dtype=dtype)
        proc = AutoProcessor.from_pretrained(p, local_files_only=True)
        tok = load_tokenizer(p)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load vision model from {str(p)!r}: {exc}") from exc
    return model.to(device).eval(), tok, proc
