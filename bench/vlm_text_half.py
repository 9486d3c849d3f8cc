"""The VLM's text half alone (issue 40): can its language model answer the image families'
questions when what the image prints is in its prompt as text?

`bench/vlm_reading.py`'s `transcribe` run showed the build failing on both sides of the answer:
it reads the image out poorly, and handed the true transcript it still answers 2 of 30. This
script measures the second half on its own: the VLM's language model (the `tiny` Qwen2 preset,
the VLM tokenizer and chat template, no image), its prompt the transcript then the task's
question, trained on the gold answers (`fit_masked_lm`, the builds' loop) on an unseen train task
every row (`families` in turn, all three by default; `levels` in turn, 1-3), and scored greedy
on `n_eval` held-out level-1 tasks of every family at the `evals` step counts, by question kind.

`order` is the transcript's (vlm_reading's `transcript`): "render", every string the render
prints in its order (a bar or line chart: its title, every label, then every value, so a
category's value is as far from its name as there are categories); "paired", a bar or line
chart's each value right after its own label.

`layout` is where the transcript sits: "transcript_first", the user message is the transcript then
the question; "question_first", the question is the user message and the transcript is put in the
assistant's mouth before the answer (vlm_reading's `transcribe` route, where the model reads the
image out after the question: its `NAME_given` figure, here without the image). `tokenizer`
"chars" is the VLM's (one character a token); "words" (`word_tokenizer`) adds every word the
families print and every number 10-999 as one token each, after the char ids, so a by-name lookup
is one token matched instead of a run of characters.

`recall_steps` (0 by default) is a warm-up before the question stage: multi-query associative recall
(`recall_row`: labels with numbers, then the same labels asked again, every answer scored), the
dense form of the chart's by-name lookup; its held-out share of numbers right is `recall`.

The ui family's level-1 questions (the highlighted button, where to click) are not in any
transcript: its row says what the text alone gets there. `lm_from` starts the language model from
a text base folder (`~/.cache/posttrain/base-*`, as vlm_reading's option) instead of random
weights; `out` saves the trained one (vlm_reading's `lm_from` loads it into a VLM; a "words"
model's rows do not fit the VLM's char tokenizer, so not that one).

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/vlm_text_half.py \\
      '{"steps": 3000, "order": "paired", "out": "runs/text-half"}'
    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/vlm_text_half.py \\
      '{"steps": 8000, "families": ["chart"], "levels": [1], "layout": "question_first", "tokenizer": "words"}'
"""

from __future__ import annotations

import json
import re
import resource
import sys
import time
from typing import Any

import torch
from vlm_reading import load_language_model, transcript

from posttrain.domains._vision import judge
from posttrain.domains.base import extract_answer
from posttrain.domains.registry import get
from posttrain.model import vision as V
from posttrain.model.arch import make_config
from posttrain.model.pretrain import fit_masked_lm, padded
from posttrain.types import Message


def word_tokenizer() -> Any:
    """`tokenizer` "words": the VLM's tokenizer with every word the families print (fruits, months,
    titles, ui labels) and every number 10-999 as one token each (0-9 are char ids already), after
    the char-level ids (which keep their ids, so any text still round-trips and a char-level base's
    rows still load)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from posttrain.domains import chart, ui
    from posttrain.model.tokenizer import CHARS, ROLES, SPECIAL

    words = {w for s in (*chart.FRUITS, *chart.MONTHS, *chart.TITLES, *ui.APPS, *ui.FIELDS, *ui.CHECKS, *ui.BUTTONS)
             for w in s.split() if len(w) > 1}  # fmt: skip
    words = sorted(words, key=lambda w: (-len(w), w))
    specials = [SPECIAL["pad"], SPECIAL["unk"], SPECIAL["eos"]] + [f"<|{r}|>" for r in ROLES]
    vocab = {t: i for i, t in enumerate(specials + CHARS + words + [str(n) for n in range(10, 1000)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL["unk"]))
    pattern = "|".join(re.escape(w) for w in words) + "|[1-9][0-9]{1,2}|[\\s\\S]"
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=SPECIAL["pad"], unk_token=SPECIAL["unk"], eos_token=SPECIAL["eos"],
        additional_special_tokens=[f"<|{r}|>" for r in ROLES],
    )  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": [f"<|{r}|>" for r in ROLES] + [V.IMAGE_TOKEN]})
    tok.chat_template = V.CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


LAYOUTS = ("transcript_first", "question_first")


def prompt(tok: Any, task: Any, order: str, layout: str = "transcript_first") -> tuple[int, ...]:
    """The ids the answer follows. "transcript_first": one user message, the transcript on its
    first line, then the question. "question_first": the question as the user message and the
    transcript put in the assistant's mouth, then a space (vlm_reading's `transcribe` route, where
    the model writes the transcript after the question: its `NAME_given` figure, without the image)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} unknown; allowed: {', '.join(LAYOUTS)}")
    if layout == "question_first":
        ids = V.prompt_ids(tok, V.chat([Message("user", task.prompt[0].content)]), 0)
        return (*ids, *tok.encode(transcript(task, order) + " ", add_special_tokens=False))
    msg = Message("user", f"{transcript(task, order)}\n{task.prompt[0].content}")
    return V.prompt_ids(tok, V.chat([msg]), 0)


def heldout(model: Any, tok: Any, order: str, n: int, layout: str = "transcript_first") -> dict[str, Any]:
    """Greedy on `n` held-out level-1 tasks a family: the share right, and right of asked by kind."""
    res: dict[str, Any] = {}
    with torch.no_grad():
        for name in V.FAMILIES:
            right, by_ask = 0, {}
            for i in range(n):
                t = get(name).sample(i, "eval", 1)
                ids = torch.tensor([prompt(tok, t, order, layout)])
                out = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                )  # fmt: skip
                ok = judge(t.reference, extract_answer(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)))[1]
                right += ok
                tally = by_ask.setdefault(t.reference["ask"], [0, 0])
                tally[0], tally[1] = tally[0] + ok, tally[1] + 1
            res[name] = round(right / n, 3)
            res[f"{name}_by_ask"] = {a: f"{r}/{c}" for a, (r, c) in sorted(by_ask.items())}
    return res


def recall_row(tok: Any, rng: Any) -> tuple[list[int], list[int]]:
    """One `recall_steps` row (multi-query associative recall, dense): 4-8 distinct labels (fruits
    and months) each with a number 1-199, printed as a paired transcript ("Pears 6 | Limes 31"), a
    newline, then the same pairs again in another order; the loss is on the second half's numbers
    (each a lookup by name of the first half), so one row carries 4-8 lookups."""
    from posttrain.domains import chart

    labels = rng.sample([*chart.FRUITS, *chart.MONTHS], rng.randint(4, 8))
    pairs = [(lab, str(rng.randint(1, 199))) for lab in labels]
    ids = tok.encode(" | ".join(f"{a} {b}" for a, b in pairs) + "\n", add_special_tokens=False)
    mask = [0] * len(ids)
    for k, (a, b) in enumerate(rng.sample(pairs, len(pairs))):
        head = tok.encode(("" if k == 0 else " | ") + a + " ", add_special_tokens=False)
        tail = tok.encode(b, add_special_tokens=False)
        ids, mask = ids + head + tail, mask + [0] * len(head) + [1] * len(tail)
    return ids + [tok.eos_token_id], mask + [0]


def batched(tok: Any, rows: list[tuple[list[int], list[int]]]) -> tuple[dict[str, Any], Any]:
    """(ids, loss mask) rows as `fit_masked_lm`'s batch: `padded`'s ids and attention mask, its mask."""
    ids, attn, mask = padded(tok, [r for r, _ in rows], [m for _, m in rows])
    return {"input_ids": ids, "attention_mask": attn}, mask


def main(cfg: dict[str, Any]) -> dict[str, Any]:
    from transformers import Qwen2ForCausalLM

    steps, order, n = cfg.get("steps", 2500), cfg.get("order", "render"), cfg.get("n_eval", 30)
    evals = sorted(set(cfg.get("evals", [steps // 4, steps // 2, steps])))
    batch, levels, seed = cfg.get("batch_size", 16), cfg.get("levels", [1, 2, 3]), cfg.get("seed", 0)
    families, layout = cfg.get("families", list(V.FAMILIES)), cfg.get("layout", "transcript_first")
    torch.set_num_threads(1)
    t0 = time.process_time()
    if cfg.get("tokenizer", "chars") not in ("chars", "words"):
        raise ValueError(f"tokenizer {cfg['tokenizer']!r} unknown; allowed: chars, words")
    tok = word_tokenizer() if cfg.get("tokenizer") == "words" else V.build_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(
        make_config(cfg.get("preset", "tiny"), len(tok), tok.pad_token_id, tok.eos_token_id, max_positions=512)
    )
    if cfg.get("lm_from"):  # a text base's weights (its tokenizer's ids are the first of this one's)
        load_language_model(model.model, cfg["lm_from"])
    model.train()
    recall: dict[str, Any] = {}
    if cfg.get("recall_steps"):  # the associative-recall warm-up, then the question stage
        import random

        rng = random.Random(seed + 23)

        def recall_batch() -> tuple[dict[str, Any], Any]:
            return batched(tok, [recall_row(tok, rng) for _ in range(batch)])

        recall["loss"] = round(
            fit_masked_lm(model, recall_batch, cfg["recall_steps"], cfg.get("lr", 2e-3), "recall", True), 3
        )
        with torch.no_grad():  # held out: the share of second-half number tokens predicted right
            inputs, mask = recall_batch()
            pred = model(**inputs).logits[:, :-1].argmax(-1)
            hit = (pred == inputs["input_ids"][:, 1:]).float() * mask[:, 1:]
            recall["tokens_right"] = round(float(hit.sum() / mask[:, 1:].sum()), 3)
        print("RECALL", json.dumps(recall), flush=True)
    drawn, done, curve = [0], [0], []

    def row() -> tuple[list[int], list[int]]:
        k = drawn[0]
        drawn[0] += 1
        d = get(families[k % len(families)])
        index = k // len(families)
        task = d.sample(index + 10**6 * seed, "train", levels[index % len(levels)])  # seeds: disjoint tasks
        p, a = (
            list(prompt(tok, task, order, layout)),
            tok.encode(d.gold(task), add_special_tokens=False) + [tok.eos_token_id],
        )
        return p + a, [0] * len(p) + [1] * len(a)

    def next_batch() -> tuple[dict[str, Any], Any]:
        if done[0] in evals and done[0] < steps:  # held out at a milestone, before that step's batch
            curve.append({"step": done[0]} | heldout(model, tok, order, n, layout))
            print("EVAL", json.dumps(curve[-1]), flush=True)
        done[0] += 1
        return batched(tok, [row() for _ in range(batch)])

    loss = fit_masked_lm(model, next_batch, steps, cfg.get("lr", 2e-3), f"text half ({order})", True)
    model.eval()
    curve.append({"step": steps} | heldout(model, tok, order, n, layout))
    if cfg.get("out"):  # vlm_reading.py's `lm_from` takes this folder (the same tokenizer's rows)
        model.save_pretrained(cfg["out"])
    return {
        "cfg": cfg,
        "recall": recall,
        "cpu_s": round(time.process_time() - t0),
        "last_loss": round(loss, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "curve": curve,
    }


if __name__ == "__main__":
    print("RESULT", json.dumps(main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})), flush=True)
