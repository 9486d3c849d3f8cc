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
    (image, question, answer) triples drawn from a pool of `pool` train tasks per family."""

    seed: int = 0
    steps: int = 200
    batch_size: int = 16
    lr: float = 2e-3
    pool: int = 128
    buggy_fraction: float = 0.3
    image_size: int = 96
    patch_size: int = 12
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "pool", "image_size", "patch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"VisionSpec.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0.0 <= self.buggy_fraction <= 1.0:
            raise ValueError(f"VisionSpec.buggy_fraction must be in [0, 1], got {self.buggy_fraction!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"VisionSpec.image_size {self.image_size} is not a multiple of patch_size")

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


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
    """LlavaConfig: SigLIP tower (hidden 64, 2 layers), the `tiny` Qwen2 preset as language model."""
    from transformers import LlavaConfig, SiglipVisionConfig

    from posttrain.model.arch import make_config as text_config

    vision = SiglipVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
    )
    text = text_config("tiny", len(tok), tok.pad_token_id, tok.eos_token_id, max_positions=512)
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
    """`spec.pool` train tasks of each family, each level in turn, answered right or (a share
    `buggy_fraction`, drawn by `rng`) by the family's planted wrong answer."""
    from posttrain.domains.registry import get

    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    out = []
    for name in FAMILIES:
        domain = get(name)
        for index in range(spec.pool):
            task = domain.sample(index, "train", 1 + index % domain.levels)
            answer = domain.wrong(task) if rng.random() < spec.buggy_fraction else domain.gold(task)
            ids = tok.apply_chat_template(chat(task.prompt), add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            prompt = expand_ids(ids, image_id, spec.image_tokens)
            images = [i for m in task.prompt for i in m.images]
            out.append(
                _Example(prompt, tuple(tok.encode(answer, add_special_tokens=False)), pixel_values(proc, images))
            )
    return out


def _batch(tok: Any, examples: Sequence[_Example]) -> tuple[Any, Any, Any, Any]:
    """Right-padded ids, attention mask, loss mask (answer tokens and <|end|>) and pixels."""
    import torch

    from posttrain.model.pretrain import padded

    rows = [list(e.prompt) + list(e.answer) + [tok.eos_token_id] for e in examples]
    masks = [[0] * len(e.prompt) + [1] * (len(e.answer) + 1) for e in examples]
    ids, attn, loss = padded(tok, rows, masks)
    return ids, attn, loss, torch.cat([e.pixels for e in examples])


def build_vlm(spec: VisionSpec, out_dir: Path | None = None, progress: bool = True) -> Path:
    """Pretrain and save the VLM; returns its folder. Its spec, weights digest, build seconds and
    peak RSS are stored beside it (`INFO`)."""
    import resource

    import torch
    from transformers import LlavaForConditionalGeneration

    from posttrain.model.pretrain import fit_masked_lm
    from posttrain.model.tokenizer import save_tokenizer

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

    def next_batch() -> tuple[dict[str, Any], Any]:
        ids, attn, mask, pixels = _batch(tok, [rng.choice(pool) for _ in range(spec.batch_size)])
        return {"input_ids": ids, "attention_mask": attn, "pixel_values": pixels}, mask

    loss = fit_masked_lm(model, next_batch, spec.steps, spec.lr, "pretrain vlm", progress)
    model.eval()
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    save_tokenizer(tok, tmp)
    proc.save_pretrained(tmp)
    save_tokenizer(tok, tmp)  # the processor wrote the tokenizer again, in its plain form
    info = {
        "spec": asdict(spec),
        "weights_digest": weights_digest(model),
        "build_seconds": round(time.perf_counter() - began, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final_loss": round(loss, 4),
    }
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
