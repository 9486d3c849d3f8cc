"""Can the embedded VLM learn to see at all? A ladder of visual questions (issue 40).

`bench/vlm_reading.py` found that no build reads the families' images. This script asks the
question below that one: does the same architecture and pretraining loop (model/vision.py's
tokenizer, processor, LlavaConfig and `fit_masked_lm`) learn a question whose answer is in the
pixels, from the easiest up to the families' own text size? Every probe draws a fresh image each
training row (no pool to memorise) on the families' 400 x 300 canvas, resized by the processor to
`image_size`; held out: `n_eval` images from another seed, greedy, exact match, beside the score of
always answering the training set's most common answer (`chance`).

- `colour`: one filled box of 6 named colours among black outlines: "What colour is the box?"
- `count`: 1 to 5 black discs: "How many discs?"
- `word40` / `word20` / `word12`: one of the chart family's 16 fruit names at that font size,
  anywhere on the canvas (`centred`: at its centre; `spread` S: within S of the range around
  the centre, in training and held out; `widen` W: training placements widen from the centre to
  the whole canvas over the first W of the steps, held out anywhere): "What word is written?"
  (the families print labels at 11 to 15 pixels)

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/vlm_probe.py '{"probe": "colour", "steps": 300}'

`dense_steps` N (word probes): first N steps of the tower alone naming the word at every patch its
box overlaps (`dense_stage`): supervision at every place and offset, before the questions.

Prints one `RESULT` JSON line: the probe, held-out accuracy, chance, CPU seconds and peak RSS.
"""

from __future__ import annotations

import collections
import json
import random
import resource
import sys
import time
from typing import Any

import torch
from common import vlm_spec
from transformers import LlavaForConditionalGeneration

from posttrain.domains import chart
from posttrain.domains._vision import canvas, font
from posttrain.model import vision as V
from posttrain.model.pretrain import fit_masked_lm, padded, pretrain_optimizer

COLOURS = {
    "red": (219, 68, 55),
    "blue": (66, 133, 244),
    "green": (15, 157, 88),
    "yellow": (244, 180, 0),
    "purple": (171, 71, 188),
    "orange": (255, 112, 67),
}
W, H = 400, 300


def sample(probe: str, rng: random.Random, spread: float = 1.0) -> tuple[Any, str, str]:
    """(image, question, answer) of one draw of `probe`; a word lies within `spread` (0: at the
    canvas's centre, 1: anywhere) of the range its size allows, around the centre."""
    img, d = canvas(W, H)
    if probe == "colour":
        for _ in range(rng.randint(0, 3)):
            x, y = rng.randint(0, W - 40), rng.randint(0, H - 40)
            d.rectangle([x, y, x + rng.randint(10, 40), y + rng.randint(10, 40)], outline=(0, 0, 0), width=2)
        name = rng.choice(sorted(COLOURS))
        w, h = rng.randint(60, 150), rng.randint(60, 150)
        x, y = rng.randint(0, W - w), rng.randint(0, H - h)
        d.rectangle([x, y, x + w, y + h], fill=COLOURS[name])
        return img, "What colour is the box?", name
    if probe == "count":
        n = rng.randint(1, 5)
        placed: list[tuple[int, int, int]] = []
        while len(placed) < n:
            r = rng.randint(15, 25)
            x, y = rng.randint(r, W - r), rng.randint(r, H - r)
            if all((x - a) ** 2 + (y - b) ** 2 > (r + c + 6) ** 2 for a, b, c in placed):
                placed.append((x, y, r))
                d.ellipse([x - r, y - r, x + r, y + r], fill=(0, 0, 0))
        return img, "How many discs?", str(n)
    if probe.startswith("word"):
        size = int(probe[4:])
        word = rng.choice(chart.FRUITS)
        f = font(size)
        half_x, half_y = (W - f.getlength(word) - 4) / 2, H / 2 - size
        x = W / 2 + spread * rng.uniform(-half_x, half_x)
        y = H / 2 + spread * rng.uniform(-half_y, half_y)
        d.text((x, y), word, fill=(0, 0, 0), font=f, anchor="mm")
        img.info["box"] = d.textbbox((x, y), word, font=f, anchor="mm")  # for the dense stage
        return img, "What word is written?", word
    raise ValueError(f"unknown probe {probe!r}")


def placement(cfg: dict[str, Any]) -> float:
    """The spread a word is placed within (`sample`): 0 when `centred`, else `spread` (1: anywhere)."""
    return 0.0 if cfg.get("centred") else cfg.get("spread", 1.0)


def dense_stage(model: Any, pixels: Any, cfg: dict[str, Any], spec: V.VisionSpec, probe: str) -> float:
    """`dense_steps` of the tower alone: a linear head on its last hidden states names, at every
    patch the word's box overlaps, which of the 16 words it is (0 elsewhere, weighted 0.2), on
    fresh images placed as the question stage's; AdamW, warm-up then cosine. Returns the share
    of word patches named right over the last 20 steps."""

    rng = random.Random(spec.seed + 17)
    tower = model.model.vision_tower
    head = torch.nn.Linear(tower.config.hidden_size, 1 + len(chart.FRUITS))
    params = list(tower.parameters()) + list(head.parameters())
    steps, batch, g = cfg["dense_steps"], 32, spec.image_size // spec.patch_size
    opt, sched = pretrain_optimizer(params, spec.lr, steps)
    sx, sy = W / g, H / g  # one patch, in canvas pixels
    right: list[float] = []
    for step in range(steps):
        pix, tgt = [], torch.zeros(batch, g * g, dtype=torch.long)
        for b in range(batch):
            img, _, word = sample(probe, rng, placement(cfg))
            x0, y0, x1, y1 = img.info["box"]
            for gy in range(int(y0 // sy), min(g, int(y1 // sy) + 1)):
                for gx in range(int(x0 // sx), min(g, int(x1 // sx) + 1)):
                    tgt[b, gy * g + gx] = 1 + chart.FRUITS.index(word)
            pix.append(pixels(img))
        logits, loss = V.dense_step(tower, head, torch.cat(pix), tgt, params, opt, sched)
        marked = tgt > 0
        right = [*right[-19:], (logits.argmax(-1)[marked] == tgt[marked]).float().mean().item()]
        if cfg.get("progress", True) and (step % 50 == 0 or step == steps - 1):
            print(f"dense {step} loss {loss:.3f} word patches right {right[-1]:.3f}", flush=True)
    return sum(right) / len(right)


def main(cfg: dict[str, Any]) -> dict[str, Any]:
    probe = cfg["probe"]
    spec = vlm_spec(cfg)
    torch.set_num_threads(1)
    t0 = time.process_time()
    tok = V.build_tokenizer()
    proc = V.processor(spec, tok)

    def prompt(question: str) -> list[int]:
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        return list(V.prompt_ids(tok, msgs, spec.image_tokens))

    def pixels(img: Any) -> Any:
        return proc.image_processor(images=[img], return_tensors="pt")["pixel_values"].float()

    rng = random.Random(spec.seed)
    seen: collections.Counter[str] = collections.Counter()

    step = [0]

    def next_batch() -> tuple[dict[str, Any], Any]:
        rows, masks, pix = [], [], []
        widen = cfg.get("widen", 0.0) * spec.steps  # the curriculum of placements, in steps
        spread = min(1.0, step[0] / widen) if widen and not cfg.get("centred") else placement(cfg)
        step[0] += 1
        for _ in range(spec.batch_size):
            img, q, a = sample(probe, rng, spread)
            seen[a] += 1
            p, ans = prompt(q), tok.encode(a, add_special_tokens=False)
            rows.append(p + ans + [tok.eos_token_id])
            masks.append([0] * len(p) + [1] * (len(ans) + 1))
            pix.append(pixels(img))
        ids, attn, mask = padded(tok, rows, masks)
        return {"input_ids": ids, "attention_mask": attn, "pixel_values": torch.cat(pix)}, mask

    torch.manual_seed(spec.seed)
    model = LlavaForConditionalGeneration(V.make_config(spec, tok))
    model.train()
    dense = dense_stage(model, pixels, cfg, spec, probe) if cfg.get("dense_steps") else None
    loss = fit_masked_lm(model, next_batch, spec.steps, spec.lr, probe, cfg.get("progress", True))
    model.eval()
    res: dict[str, Any] = {"cfg": cfg, "build_cpu_s": round(time.process_time() - t0), "last_loss": round(loss, 3)}
    if dense is not None:
        res["dense_word_patches_right"] = round(dense, 3)
    eval_rng = random.Random(10_000 + spec.seed)
    right, answers = 0, []
    n = cfg.get("n_eval", 60)
    with torch.no_grad():
        for _ in range(n):
            img, q, a = sample(probe, eval_rng, placement(cfg))
            ids = torch.tensor([prompt(q)])
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels(img), max_new_tokens=16,
                do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
            got = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
            right += got == a
            answers.append(got)
    res["accuracy"] = round(right / n, 3)
    res["chance"] = round(seen.most_common(1)[0][1] / sum(seen.values()), 3)
    res["distinct_answers"] = len(set(answers))
    res["examples"] = answers[:8]
    res["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return res


if __name__ == "__main__":
    print("RESULT", json.dumps(main(json.loads(sys.argv[1]))), flush=True)
