"""bench/vlm_reading.py's `transcribe` rows: the transcript is what the task's image prints, in the
render's order, and it carries a read-off answer (so a model that reads it out can answer)."""

from __future__ import annotations

import pytest
from bench_loader import load

from posttrain.domains.registry import get

vr = load("vlm_reading")


def test_a_chart_transcript_is_its_title_then_what_each_category_prints():
    for index in range(12):
        task = get("chart").sample(index, "train", 1)
        scene = task.reference["scene"]
        pieces = vr.transcript(task).split(" | ")
        assert pieces[0] == scene["title"]
        printed = " ".join(pieces[1:])
        for label, value in zip(scene["labels"], scene["values"]):
            assert label in printed and str(value) in printed
        if task.reference["ask"] == "value":  # a read-off: the answer is one of the pieces
            assert any(str(task.reference["answer"]) in p.split() for p in pieces[1:])


def test_transcripts_follow_the_image_not_the_family():
    for name in ("chart", "drawing", "ui"):
        texts = {vr.transcript(get(name).sample(i, "train", 1)) for i in range(10)}
        assert len(texts) >= 8, name  # a constant transcript would teach nothing about the image


def test_lm_from_puts_a_text_base_into_the_language_model_and_leaves_the_rest(tmp_path):
    import torch
    from transformers import LlavaForConditionalGeneration, Qwen2ForCausalLM

    from posttrain.model import vision as V
    from posttrain.model.arch import make_config
    from posttrain.model.tokenizer import build_tokenizer

    text_tok, tok = build_tokenizer(), V.build_tokenizer()
    torch.manual_seed(1)
    text = Qwen2ForCausalLM(make_config("tiny", len(text_tok), text_tok.pad_token_id, text_tok.eos_token_id))
    text.save_pretrained(tmp_path)
    torch.manual_seed(2)
    vlm = LlavaForConditionalGeneration(V.make_config(V.VisionSpec(), tok))
    tower = {k: v.clone() for k, v in vlm.model.vision_tower.state_dict().items()}
    image_row = vlm.model.language_model.embed_tokens.weight[len(text_tok) :].clone()
    vr.load_language_model(vlm.model.language_model, str(tmp_path))
    got, want = vlm.model.language_model.state_dict(), text.model.state_dict()
    assert len(tok) == len(text_tok) + 1  # the image token is the one row the text base lacks
    for name, value in want.items():
        if name == "embed_tokens.weight":
            assert torch.equal(got[name][: len(text_tok)], value)
        else:
            assert torch.equal(got[name], value), name
    assert torch.equal(vlm.model.language_model.embed_tokens.weight[len(text_tok) :], image_row)
    assert torch.equal(vlm.lm_head.weight[: len(text_tok)], text.lm_head.weight)  # tied: the head follows
    assert all(torch.equal(v, tower[k]) for k, v in vlm.model.vision_tower.state_dict().items())


def test_the_paired_transcript_puts_each_chart_value_after_its_own_label():
    """`transcript(task, "paired")`: a bar or line chart's value right after its label (the render
    prints every label, then every value); a pie and the other families as printed."""
    kinds = set()
    for index in range(20):
        task = get("chart").sample(index, "train", 2)
        scene = task.reference["scene"]
        kinds.add(scene["chart"])
        paired = vr.transcript(task, "paired").split(" | ")
        if scene["chart"] == "pie":
            assert paired == vr.transcript(task).split(" | ")
            continue
        assert paired[0] == scene["title"]
        assert paired[1:] == [s for a, v in zip(scene["labels"], scene["values"]) for s in (a, str(v))]
    assert kinds == {"bar", "line", "pie"}
    for name in ("drawing", "ui"):
        task = get(name).sample(3, "train", 1)
        assert vr.transcript(task, "paired") == vr.transcript(task, "render")
    with pytest.raises(ValueError, match="render, paired"):
        vr.transcript(task, "sorted")


def test_the_text_half_prompt_is_the_transcript_then_the_question_in_the_chat_template():
    """bench/vlm_text_half.py: the language model alone, the transcript in its prompt, no image."""
    from posttrain.model import vision as V

    th = load("vlm_text_half")
    tok = V.build_tokenizer()
    task = get("chart").sample(5, "eval", 1)
    text = tok.decode(th.prompt(tok, task, "paired"))
    assert text == f"<|user|>{vr.transcript(task, 'paired')}\n{task.prompt[0].content}<|assistant|>"
    assert V.IMAGE_TOKEN not in text


def test_the_text_half_question_first_puts_the_transcript_in_the_assistants_mouth():
    """`layout` "question_first": vlm_reading's `transcribe` route without the image (its `given` figure)."""
    from posttrain.model import vision as V

    th = load("vlm_text_half")
    tok = V.build_tokenizer()
    task = get("chart").sample(5, "eval", 1)
    text = tok.decode(th.prompt(tok, task, "paired", "question_first"))
    assert text == f"<|user|>{task.prompt[0].content}<|assistant|>{vr.transcript(task, 'paired')} "
    with pytest.raises(ValueError, match="transcript_first, question_first"):
        th.prompt(tok, task, "paired", "answer_first")


def test_the_word_tokenizer_keeps_the_char_ids_and_makes_each_printed_word_one_token():
    """`tokenizer` "words": every text round-trips; a family's word or a number 10-999 is one token."""
    from posttrain.domains import chart, ui
    from posttrain.model import vision as V

    th = load("vlm_text_half")
    words, chars = th.word_tokenizer(), V.build_tokenizer()
    for text in ("What is the value of Pears? 1234 05 x\n\t{}", "Stock on hand | Jan | 7 | Feb | 199"):
        assert words.decode(words.encode(text)) == text
    for c in "abcXYZ09 |<>\n":  # a char-level base's rows still load into the first ids
        assert words.convert_tokens_to_ids(c) == chars.convert_tokens_to_ids(c)
    for w in (*chart.FRUITS, *chart.MONTHS, *ui.BUTTONS, "10", "57", "999"):
        assert len(words.encode(w, add_special_tokens=False)) == 1, w
    assert words.tokenize("Pears 6 Peaches") == ["Pears", " ", "6", " ", "Peaches"]
    assert words.convert_tokens_to_ids(V.IMAGE_TOKEN) == len(words) - 1


def test_a_recall_row_asks_each_label_of_its_first_half_once_and_scores_only_the_numbers():
    """`recall_steps` rows: the masked tokens are the numbers looked up, each its label's in the first half."""
    import random

    th = load("vlm_text_half")
    tok = th.word_tokenizer()
    for seed in range(20):
        ids, mask = th.recall_row(tok, random.Random(seed))
        assert len(ids) == len(mask) and ids[-1] == tok.eos_token_id
        first, second = tok.decode(ids[:-1]).split("\n")
        pairs = dict(p.split(" ") for p in first.split(" | "))
        asked = [p.split(" ") for p in second.split(" | ")]
        assert sorted(a for a, _ in asked) == sorted(pairs) and all(pairs[a] == b for a, b in asked)
        scored = [tok.decode([i]) for i, m in zip(ids, mask) if m]
        assert scored == [b for _, b in asked]  # one token a number, nothing else scored
