"""Does a VLM build read its images? (issue 40: experiments toward a base RL can improve.)

Builds a LLaVA as model/vision.py does (its tokenizer, processor, config and pretraining loop),
with the spec's fields overridden and three optional stages before the question stage:

- `ocr_steps`: the vision tower alone on synthetic text images in the families' font (their
  words and numbers at random places, sizes 11-15, some on a blue button, among shapes), each
  patch's target the character whose centre falls in each of its four sub-columns (a linear
  head on the tower's last hidden states, the ones LLaVA reads);
- `aux_steps`: the whole model on "Describe." with the scene transcribed (chart: kind, labels and
  values; ui: field labels, button labels, the primary marked, and button centres; drawing:
  width, height and hole count), train split only; `aux_mix` of the question stage's rows
  stay transcriptions;
- `levels`: the pool's levels in turn (model/vision.py cycles 1, 2, 3);
- `ocr_source` "families": the `ocr_steps` stage is the build's reading stage instead
  (model/vision.py `read_stage`: the families' own train images, an unseen task every row, the
  characters their renders print in `ocr_slots` sub-columns a patch), and the share of
  characters the tower names right on held-out tasks (`ocr_heldout_NAME`);
- `tower_from`: the vision tower's weights from a folder this script saved (`out`), instead of the
  reading stage (which is then skipped; its held-out figures are that folder's);
- `lm_from`: the language model's weights from a text base folder (`~/.cache/posttrain/base-*`: the
  same `tiny` preset, its tokenizer's ids the first of this one's) instead of random ones;
- `out`: the built model saved there (a folder `{"model": DIR}` evaluates);
- `fresh`: the question stage on an unseen train task every row instead of drawing from the pool;
- `freeze_tower`: the question stage trains the projector and the language model only (the tower
  keeps what the reading stage taught it);
- `transcribe`: every question row's answer is the image's transcript first (`transcript`: every
  string the render prints joined by " | ", in `transcript_order`: "render" or "paired"), then
  the answer: the model reads the image out, then answers from what it read. Held out, it is
  also scored on the transcript it writes (`NAME_read`: difflib's ratio to the true one) and on
  the answer it gives after the true transcript is put in its mouth (`NAME_given`: the text
  reasoning alone).

Then greedy on `n_eval` held-out level-1 tasks per family, each with its own image (`true`) and
with another task's image (`shuf`, the answer-kind baseline: what the model gets without reading);
prints one `RESULT` JSON line with the build's CPU seconds and peak RSS.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/vlm_reading.py '{"steps": 400, "image_size": 192, "patch_size": 16}'
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/vlm_reading.py '{"model": "DIR"}'   # a built folder, held out only
"""

from __future__ import annotations

import json
import random
import resource
import string
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import vlm_spec
from transformers import LlavaForConditionalGeneration

from posttrain.domains import chart, drawing, ui
from posttrain.domains._vision import canvas, font, judge
from posttrain.domains.base import extract_answer
from posttrain.domains.registry import get
from posttrain.model import vision as V
from posttrain.model.pretrain import fit_masked_lm, padded, pretrain_optimizer
from posttrain.types import Message

CHARS = string.digits + string.ascii_letters
WORDS = [
    *chart.FRUITS, *chart.MONTHS, *chart.TITLES, *ui.FIELDS, *ui.BUTTONS, *ui.CHECKS, *ui.APPS,
    "DIA", "MAIN VIEW", *drawing.LETTERS,
]  # fmt: skip
SLOTS = 4


def ocr_sample(rng: random.Random, size: int, patch: int) -> tuple[Any, Any]:
    """A 320 x 240 synthetic text image and its (patches x SLOTS) character targets (0: none)."""
    w, h = 320, 240
    img, d = canvas(w, h)
    g = size // patch
    tgt = torch.zeros(g, g, SLOTS, dtype=torch.long)
    for _ in range(rng.randint(10, 22)):
        if rng.random() < 0.3:
            x0, y0 = rng.randint(0, w - 20), rng.randint(0, h - 20)
            if rng.random() < 0.5:
                colour = tuple(rng.randint(0, 255) for _ in range(3))
                d.rectangle([x0, y0, x0 + rng.randint(5, 80), y0 + rng.randint(5, 80)], fill=colour)
            else:
                r = rng.randint(3, 20)
                d.ellipse([x0, y0, x0 + r, y0 + r], outline=(0, 0, 0), width=2)
            continue
        s = rng.choice(WORDS) if rng.random() < 0.5 else str(rng.randint(1, 199))
        if rng.random() < 0.2:
            s = f"{s} {rng.randint(1, 99)}"
        f = font(rng.choice((11, 12, 13, 14, 15)))
        x, y = rng.uniform(2, max(3, w - f.getlength(s) - 2)), rng.uniform(8, h - 8)
        on_button = rng.random() < 0.15
        if on_button:
            bb = d.textbbox((x, y), s, font=f, anchor="lm")
            d.rectangle([bb[0] - 4, bb[1] - 4, bb[2] + 4, bb[3] + 4], fill=(37, 99, 235))
        d.text((x, y), s, fill=(255, 255, 255) if on_button else (0, 0, 0), font=f, anchor="lm")
        for i, ch in enumerate(s):
            if ch not in CHARS:
                continue
            px = (x + (f.getlength(s[:i]) + f.getlength(s[: i + 1])) / 2) * size / w
            py = y * size / h
            gx, gy = int(px // patch), int(py // patch)
            if 0 <= gx < g and 0 <= gy < g:
                tgt[gy, gx, min(SLOTS - 1, int((px - gx * patch) / (patch / SLOTS)))] = 1 + CHARS.index(ch)
    return img, tgt.view(g * g, SLOTS)


def pretrain_tower(model: Any, proc: Any, spec: V.VisionSpec, steps: int, lr: float, batch: int = 32) -> None:
    """The synthetic `ocr_steps` stage: AdamW on the tower and a per-patch head, warm-up then cosine."""
    rng = random.Random(spec.seed + 17)
    tower = model.model.vision_tower
    head = torch.nn.Linear(tower.config.hidden_size, SLOTS * (1 + len(CHARS)))
    pool = []
    for _ in range(2048):
        img, t = ocr_sample(rng, spec.image_size, spec.patch_size)
        pool.append((proc.image_processor(images=[img], return_tensors="pt")["pixel_values"].half(), t))
    params = list(tower.parameters()) + list(head.parameters())
    opt, sched = pretrain_optimizer(params, lr, steps)
    for step in range(steps):
        exs = [rng.choice(pool) for _ in range(batch)]
        tg = torch.stack([e[1] for e in exs])
        logits, loss = V.dense_step(tower, head, torch.cat([e[0] for e in exs]).float(), tg, params, opt, sched)
        if step % 50 == 0 or step == steps - 1:
            marked = tg > 0
            acc = (logits.argmax(-1)[marked] == tg[marked]).float().mean().item()
            print(f"ocr {step} loss {loss:.3f} char acc {acc:.3f}", flush=True)


def describe(task: Any) -> str:
    """The `aux_steps` target: the scene's readable content as one line."""
    s = task.reference["scene"]
    if task.domain == "chart":
        return s["chart"] + " " + " ".join(f"{lab} {v}" for lab, v in zip(s["labels"], s["values"]))
    if task.domain == "ui":
        buttons = []
        for b in s["buttons"]:
            x0, y0, x1, y1 = b["box"]
            buttons.append(f"{b['label']}{'*' if b['primary'] else ''} {(x0 + x1) // 2},{(y0 + y1) // 2}")
        return " ".join(f["label"] for f in s["fields"]) + "; " + " ".join(buttons)
    return f"w {s['w']} h {s['h']} holes {len(s['holes'])}"


ORDERS = ("render", "paired")


def transcript(task: Any, order: str = "render") -> str:
    """The `transcribe` prefix: every string the task's render prints, joined by " | ", in `order`:
    "render", the render's (a bar or line chart prints its title, then every label, then every
    value, so a category's value is as far from its name as there are categories); "paired", the
    same strings with a bar or line chart's each value moved to right after its own label (the
    column's two strings together, as a pie's legend prints them), the other families as printed."""
    if order not in ORDERS:
        raise ValueError(f"transcript order {order!r} unknown; allowed: {', '.join(ORDERS)}")
    scene = task.reference["scene"]
    strings = [p.text for p in get(task.domain).printed(scene)]
    if order == "paired" and task.domain == "chart" and scene["chart"] != "pie":
        n = len(scene["labels"])
        title, labels, values = strings[0], strings[1 : 1 + n], strings[1 + n : 1 + 2 * n]
        strings = [title, *(s for pair in zip(labels, values) for s in pair)]
    return " | ".join(strings)


def load_language_model(lm: Any, folder: str) -> None:
    """`lm_from`: a text base's weights into the decoder `lm` (a VLM's `model.model.language_model`,
    a text model's `model.model`); its embedding rows into the first rows of `lm`'s (a row the
    base lacks, as the VLM's image token, keeps its random start)."""
    from safetensors.torch import load_file

    weights = load_file(str(Path(folder) / "model.safetensors"))
    state = lm.state_dict()
    for k, v in weights.items():
        name = k.removeprefix("model.")
        if name == "embed_tokens.weight":
            state[name][: v.shape[0]] = v
        elif name in state:
            state[name] = v
    lm.load_state_dict(state)


def main(cfg: dict[str, Any]) -> dict[str, Any]:
    spec = vlm_spec(cfg)
    levels = cfg.get("levels", [1, 2, 3])
    torch.set_num_threads(1)
    t0 = time.process_time()
    tok = V.build_tokenizer()
    proc = V.processor(spec, tok)
    rng = random.Random(spec.seed)

    def prompt(task: Any, question: str | None = None) -> tuple[int, ...]:
        msgs = task.prompt if question is None else (Message("user", question, task.prompt[0].images),)
        return V.prompt_ids(tok, V.chat(msgs), spec.image_tokens)

    qa, aux = [], []

    def example(name: str, index: int, pooled: bool = True) -> Any:
        """Train task `index` of family `name` (levels in turn) as a question row, and, for the
        pool's tasks, its transcription row when there is an `aux` stage."""
        d = get(name)
        task = d.sample(index, "train", levels[index % len(levels)])
        pix = V.pixel_values(proc, [i for m in task.prompt for i in m.images]).half()
        answer = d.wrong(task) if rng.random() < spec.buggy_fraction else d.gold(task)
        if cfg.get("transcribe"):
            answer = f"{transcript(task, cfg.get('transcript_order', 'render'))} {answer}"
        row = (prompt(task), tok.encode(answer, add_special_tokens=False), pix)
        if pooled and cfg.get("aux_steps"):
            aux.append((prompt(task, "Describe."), tok.encode(describe(task), add_special_tokens=False), pix))
        return row

    for name in V.FAMILIES:
        qa.extend(example(name, index) for index in range(spec.pool))
    drawn = [0]

    def fresh() -> Any:
        """`fresh`: the next unseen train task (after the pool's), the families in turn."""
        k = drawn[0]
        drawn[0] += 1
        return example(V.FAMILIES[k % len(V.FAMILIES)], spec.pool + k // len(V.FAMILIES), pooled=False)

    def batch_of(exs: list[Any]) -> tuple[dict[str, Any], Any]:
        rows = [list(p) + list(a) + [tok.eos_token_id] for p, a, _ in exs]
        masks = [[0] * len(p) + [1] * (len(a) + 1) for p, a, _ in exs]
        ids, attn, loss = padded(tok, rows, masks)
        return {"input_ids": ids, "attention_mask": attn, "pixel_values": torch.cat([x for *_, x in exs]).float()}, loss

    torch.manual_seed(spec.seed)
    model = LlavaForConditionalGeneration(V.make_config(spec, tok))
    model.train()
    ocr: dict[str, float] = {}
    if cfg.get("lm_from"):
        load_language_model(model.model.language_model, cfg["lm_from"])
    if cfg.get("tower_from"):
        model.model.vision_tower.load_state_dict(V.load_vlm(cfg["tower_from"])[0].model.vision_tower.state_dict())
        saved = json.loads((Path(cfg["tower_from"]) / V.INFO).read_text())
        ocr = {k: v for k, v in saved.items() if k.startswith("ocr_heldout_")}
    elif spec.ocr_steps and cfg.get("ocr_source") == "families":
        ocr = {f"ocr_heldout_{k}": v for k, v in V.read_stage(model, proc, spec).items()}
    elif spec.ocr_steps:
        pretrain_tower(model, proc, spec, spec.ocr_steps, cfg.get("ocr_lr", 2e-3))
    if cfg.get("freeze_tower"):
        model.model.vision_tower.requires_grad_(False)  # AdamW leaves a parameter with no grad alone
    if cfg.get("aux_steps"):
        fit_masked_lm(
            model,
            lambda: batch_of([rng.choice(aux) for _ in range(spec.batch_size)]),
            cfg["aux_steps"],
            spec.lr,
            "describe",
            True,
        )
    mix = cfg.get("aux_mix", 0.0)

    def next_batch() -> tuple[dict[str, Any], Any]:
        pick = fresh if spec.fresh else lambda: rng.choice(qa)
        return batch_of([rng.choice(aux) if aux and rng.random() < mix else pick() for _ in range(spec.batch_size)])

    loss = fit_masked_lm(model, next_batch, spec.steps, spec.lr, "questions", True)
    model.eval()
    res: dict[str, Any] = {"cfg": cfg, "build_cpu_s": round(time.process_time() - t0), "last_loss": round(loss, 3)}
    res |= ocr
    res["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if cfg.get("out"):  # a folder `{"model": DIR}` (and `vision.load_vlm`) loads
        from dataclasses import asdict

        V.save_vlm(model, tok, proc, cfg["out"])
        (Path(cfg["out"]) / V.INFO).write_text(json.dumps({"spec": asdict(spec), "bench": cfg} | ocr, indent=2))
    order = cfg.get("transcript_order", "render")
    return res | heldout(model, tok, proc, spec, cfg.get("n_eval", 30), bool(cfg.get("transcribe")), order)


def heldout(
    model: Any, tok: Any, proc: Any, spec: V.VisionSpec, n: int, transcribe: bool = False, order: str = "render"
) -> dict[str, Any]:
    """Greedy on `n` held-out level-1 tasks a family, each with its own image (`NAME_true`, and
    by question `NAME_true_by_ask`: right of asked) and with another task's image (`NAME_shuf`).
    A `transcribe` build writes its transcript first: `NAME_read` is the mean difflib ratio of what
    it wrote before `<answer>` to the true transcript (own image), `NAME_given` the share right when
    the true transcript is given as the start of its reply."""
    import difflib

    res: dict[str, Any] = {}

    def reply(ids: Any, pixels: Any) -> str:
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
            max_new_tokens=256 if transcribe else 32, do_sample=False,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    with torch.no_grad():
        for name in V.FAMILIES:
            tasks = [get(name).sample(i, "eval", 1) for i in range(n)]
            pix = [V.pixel_values(proc, [i for m in t.prompt for i in m.images]) for t in tasks]
            reads: list[float] = []
            given = 0
            for mode in ("true", "shuf"):
                right, answers, by_ask = 0, [], {}
                for k, t in enumerate(tasks):
                    ids = torch.tensor([V.prompt_ids(tok, V.chat(t.prompt), spec.image_tokens)])
                    seen = pix[k if mode == "true" else (k + 7) % n]
                    text = reply(ids, seen)
                    got = extract_answer(text)
                    ok = judge(t.reference, got)[1]
                    if transcribe and mode == "true":
                        true = transcript(t, order)
                        wrote = text.split("<answer>")[0].strip()
                        reads.append(difflib.SequenceMatcher(None, wrote, true).ratio())
                        given_ids = torch.cat(
                            [ids, torch.tensor([tok.encode(true + " ", add_special_tokens=False)])], 1
                        )
                        given += judge(t.reference, extract_answer(reply(given_ids, seen)))[1]
                    right += ok
                    answers.append(got)
                    tally = by_ask.setdefault(t.reference["ask"], [0, 0])
                    tally[0], tally[1] = tally[0] + ok, tally[1] + 1
                res[f"{name}_{mode}"] = round(right / n, 3)
                if mode == "true":
                    res[f"{name}_distinct"], res[f"{name}_examples"] = len(set(answers)), answers[:5]
                    res[f"{name}_true_by_ask"] = {a: f"{r}/{c}" for a, (r, c) in sorted(by_ask.items())}
            if transcribe:
                res[f"{name}_read"], res[f"{name}_given"] = round(sum(reads) / n, 3), round(given / n, 3)
    return res


def evaluate_folder(folder: str, n: int) -> dict[str, Any]:
    """`heldout` of a built VLM folder (`posttrain base vlm --out DIR`), its spec from the folder."""
    info = json.loads((Path(folder) / V.INFO).read_text())
    model, tok, proc = V.load_vlm(folder)
    spec = V.VisionSpec(**info["spec"])
    bench = info.get("bench", {})
    held = heldout(model, tok, proc, spec, n, bool(bench.get("transcribe")), bench.get("transcript_order", "render"))
    return {"model": folder, "read_heldout": info.get("read_heldout")} | held


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    torch.set_num_threads(1)
    out = evaluate_folder(cfg["model"], cfg.get("n_eval", 30)) if "model" in cfg else main(cfg)
    print("RESULT", json.dumps(out), flush=True)
