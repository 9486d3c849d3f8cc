"""Demonstrations for `posttrain sft`: the loss mask is on assistant tokens only, rendering is the
rollouts' chat template, every bad row is reported with its line and costs no good row, batches
by length hold every demonstration once."""

from __future__ import annotations

import json

import pytest

from posttrain.configs import load_config
from posttrain.configs.sft import SftSection
from posttrain.engine.base import chat_ids
from posttrain.errors import ConfigError
from posttrain.model.tokenizer import build_tokenizer
from posttrain.sft.data import Demo, length_batches, load_demos, render
from posttrain.types import Message

CHAT = [
    Message("system", "be terse"),
    Message("user", "rev ab="),
    Message("assistant", "ba"),
    Message("user", "again: xyz"),
    Message("assistant", "zyx"),
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_mask_is_on_assistant_tokens_only(tok):
    demo = render(tok, CHAT, line=1, max_length=512)
    masked = tok.decode([t for t, m in zip(demo.ids, demo.mask) if m])
    unmasked = tok.decode([t for t, m in zip(demo.ids, demo.mask) if not m])
    # each assistant turn is its content and the <|end|> the template closes it with; nothing else
    assert masked == "ba<|end|>zyx<|end|>"
    assert unmasked == "<|system|>be terse<|user|>rev ab=<|assistant|><|user|>again: xyz<|assistant|>"
    # the tokens before each assistant turn are exactly a rollout's prompt (chat_ids: the turn opened)
    first = chat_ids(tok, CHAT[:2])
    assert demo.ids[: len(first)] == first and not any(demo.mask[: len(first)])
    assert demo.mask[len(first)] and demo.loss_tokens == len("ba") + len("zyx") + 2


def _write(tmp_path, lines):
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _row(*messages):
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in messages]})


GOOD = _row(("user", "rev ab="), ("assistant", "ba"))


def test_bad_rows_are_reported_with_their_lines_and_lose_nothing_else(tmp_path, tok):
    path = _write(
        tmp_path,
        [
            GOOD,  # 1
            '{"messages": [{"role": "user", "content": "x"}',  # 2 malformed JSON
            _row(("user", "no answer here")),  # 3 no assistant turn
            "",  # 4 blank: skipped, not an error
            _row(("wizard", "hi"), ("assistant", "x")),  # 5 unknown role
            _row(("user", "long " * 40), ("assistant", "y")),  # 6 over sft.max_length
            json.dumps({"prompt": "x"}),  # 7 no messages column
            _row(("user", "sort 21="), ("assistant", "12")),  # 8
            json.dumps({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]}),  # 9
            _row(("assistant", "first"), ("user", "x")),  # 10 assistant before any prompt
        ],
    )
    got = load_demos(SftSection(data=path, max_length=64), tok)
    assert [d.line for d in got.demos] == [1, 8]
    reasons = {b.line: b.reason for b in got.bad}
    assert sorted(reasons) == [2, 3, 5, 6, 7, 9, 10]
    assert "not valid JSON" in reasons[2]
    assert "no assistant turn" in reasons[3]
    assert "'wizard'" in reasons[5]
    assert "too long" in reasons[6] and "sft.max_length" in reasons[6]
    assert "no 'messages' column" in reasons[7]
    assert "content must be a string" in reasons[9]
    assert "no prompt before it" in reasons[10]
    with pytest.raises(ConfigError, match=r"7 bad lines \(sft.strict\).*line 2: .*line 10: "):
        load_demos(SftSection(data=path, max_length=64, strict=True), tok)


def test_files_that_cannot_train_are_clear_errors(tmp_path, tok):
    missing = str(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="sft.data: .*does not exist") as err:
        load_demos(SftSection(data=missing), tok)
    assert f"scripts/sft_demos.py DOMAIN --n 1000 --out {missing}" in str(err.value)  # the step that makes it
    with pytest.raises(ConfigError, match=r"no demonstration can train: line 1: no assistant turn"):
        load_demos(SftSection(data=_write(tmp_path, [_row(("user", "x"))])), tok)
    with pytest.raises(ConfigError, match="sft.data: give the demonstrations file"):
        load_demos(SftSection(), tok)
    with pytest.raises(ConfigError, match="sft.data"):
        load_config(None, ["sft.data=' '"])
    with pytest.raises(ConfigError, match="sft.epoch: unknown field"):
        load_config(None, ["sft.epoch=2"])


def test_the_model_positions_bound_the_length(tmp_path, tok):
    path = _write(tmp_path, [GOOD, _row(("user", "x" * 40), ("assistant", "y"))])
    got = load_demos(SftSection(data=path, max_length=512), tok, max_positions=32)
    assert [d.line for d in got.demos] == [1] and "the limit is 32" in got.bad[0].reason


def test_length_batches_hold_every_demo_once_within_the_token_bound():
    demos = [Demo(i, tuple(range(n)), (True,) * n) for i, n in enumerate([3, 9, 4, 12, 5, 30, 7, 7, 2, 11])]
    batches = length_batches(demos, batch_tokens=24, seed=1)
    assert sorted(d.line for b in batches for d in b) == list(range(len(demos)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(len(d.ids) for d in b) <= 24
    assert any(len(b) > 1 for b in batches)  # it batches, not one row per step
    assert [[d.line for d in b] for b in batches] == [[d.line for d in b] for b in length_batches(demos, 24, 1)]
    assert [[d.line for d in b] for b in batches] != [[d.line for d in b] for b in length_batches(demos, 24, 2)]


def test_a_csv_source_reads_like_jsonl(tmp_path, tok):
    import csv

    path = tmp_path / "demos.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["chat", "note"])
        w.writerow([json.dumps([{"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba"}]), "x"])
        w.writerow(["[not json", "y"])
    got = load_demos(SftSection(data=str(path), messages_field="chat"), tok)
    assert len(got.demos) == 1 and got.unit == "line"
    assert got.demos[0].ids == render(tok, CHAT[1:3], 0, 512).ids
    assert [b.line for b in got.bad] == [3] and "'chat' must be a non-empty list" in got.bad[0].reason


def test_an_assistant_turn_of_weight_0_is_context_without_loss(tmp_path, tok):
    """OpenAI's fine-tuning format: `"weight": 0` on an assistant message keeps it in the text the
    later turns are conditioned on, off the loss mask; a weight that is not 0 or 1, a weight on
    another role, or no assistant turn of weight 1 is a bad row with its reason."""

    def row(*messages):
        return json.dumps({"messages": [dict(m) for m in messages]})

    attempt = {"role": "assistant", "content": "ab", "weight": 0}
    rows = [
        row({"role": "user", "content": "rev ab="}, attempt, {"role": "tool", "content": "wrong"},
            {"role": "assistant", "content": "ba", "weight": 1}),  # 1
        row({"role": "user", "content": "rev ab="}, attempt),  # 2 nothing to learn
        row({"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba", "weight": 2}),  # 3
        row({"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba", "weight": "0"}),  # 4
        row({"role": "user", "content": "x", "weight": 0}, {"role": "assistant", "content": "ba"}),  # 5
        row({"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba", "weight": False}),  # 6
    ]  # fmt: skip
    got = load_demos(SftSection(data=_write(tmp_path, rows), max_length=64), tok)
    assert [d.line for d in got.demos] == [1]
    demo = got.demos[0]
    assert tok.decode([t for t, m in zip(demo.ids, demo.mask) if m]) == "ba<|end|>"
    assert "ab<|end|>" in tok.decode(list(demo.ids))  # the attempt is in the text the revision sees
    reasons = {b.line: b.reason for b in got.bad}
    assert sorted(reasons) == [2, 3, 4, 5, 6]
    assert "no assistant turn to learn from" in reasons[2]
    assert all("weight must be 0 or 1 and only on an assistant message" in reasons[i] for i in (3, 4, 5, 6))


def test_sft_demos_of_a_revision_family_learn_the_revision_not_the_planted_attempt(tmp_path, tok):
    """scripts/sft_demos.py on pyfunc_fix (the failing attempt is part of the task's prompt): the
    attempt is written with weight 0, so the loss covers the gold revision alone."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("sft_demos", Path(__file__).parents[2] / "scripts" / "sft_demos.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = str(tmp_path / "fix.jsonl")
    assert script.main(["pyfunc_fix", "--difficulty", "1", "--n", "3", "--out", path]) == 0
    rows = [json.loads(x) for x in open(path)]
    for row in rows:
        roles = [(m["role"], m.get("weight")) for m in row["messages"]]
        assert roles == [("user", None), ("assistant", 0), ("tool", None), ("assistant", None)]
    got = load_demos(SftSection(data=path, max_length=2048), tok)
    assert len(got.demos) == 3 and not got.bad
    for row, demo in zip(rows, got.demos):
        learned = tok.decode([t for t, m in zip(demo.ids, demo.mask) if m])
        assert learned == row["messages"][-1]["content"] + "<|end|>"
