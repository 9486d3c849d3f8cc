"""Hostile demonstrations: a lone surrogate, a row too long to tokenize, and text that spells the
chat template's role tokens are each refused by line before tokenizing, and the rest train; the
loss mask never covers a special token that came from data (a seeded property)."""

from __future__ import annotations

import csv
import json
import random

import pytest

from posttrain.configs.sft import SftSection
from posttrain.model.tokenizer import build_tokenizer
from posttrain.sft.data import RowGuard, load_demos

GOOD = json.dumps({"messages": [{"role": "user", "content": "rev ab="}, {"role": "assistant", "content": "ba"}]})


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


class Spy:
    """The real tokenizer, recording the longest message text each chat-template call rendered."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __len__(self):
        return len(self.tok)

    def apply_chat_template(self, messages, **kw):
        self.longest = max([self.longest, *(len(m["content"]) for m in messages)])
        return self.tok.apply_chat_template(messages, **kw)


def _write(tmp_path, lines, name="demos.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_lone_surrogate_is_refused_by_line_and_field(tmp_path, tok):
    lone = '{"messages": [{"role": "user", "content": "x\\ud800y"}, {"role": "assistant", "content": "ba"}]}'
    pair = '{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}, {"role": "assistant", "content": "ba"}]}'
    got = load_demos(SftSection(data=_write(tmp_path, [GOOD, lone, pair])), tok)
    assert [d.line for d in got.demos] == [1, 3]  # a surrogate pair is one character: text
    (bad,) = got.bad
    assert bad.line == 2 and bad.reason.startswith("field 'messages[0].content' holds a lone surrogate \\ud800")
    path = tmp_path / "demos.csv"  # a CSV cell's JSON text holding one
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["messages"])
        w.writerow(['[{"role": "user", "content": "\\udc00"}, {"role": "assistant", "content": "x"}]'])
        w.writerow([json.dumps(json.loads(GOOD)["messages"])])
    got = load_demos(SftSection(data=str(path)), tok)
    assert [d.line for d in got.demos] == [3] and "'messages[0].content' holds a lone surrogate" in got.bad[0].reason


def test_a_row_too_long_is_refused_before_it_is_tokenized(tmp_path, tok):
    def chat(n: int, c: str) -> str:
        return json.dumps({"messages": [{"role": "user", "content": c * n}, {"role": "assistant", "content": "b"}]})

    huge = chat(4_000_000, "a")
    long = chat(20_000, "c")  # over what 64 tokens can cover, under the reader's bound: refused untokenized
    spy = Spy(tok)
    got = load_demos(SftSection(data=_write(tmp_path, [GOOD, huge, long, GOOD]), max_length=64), spy)
    assert [d.line for d in got.demos] == [1, 4]
    reasons = {b.line: b.reason for b in got.bad}
    assert reasons[2].startswith("row too long: 4,000,") and "refused unparsed" in reasons[2]
    assert reasons[3].startswith("too long: 20,") and "refused untokenized" in reasons[3]
    assert spy.longest < 100  # neither long row reached the tokenizer


def test_the_text_bound_never_refuses_a_row_that_fits(tok):
    # the longest tokens, max_length of them: what the bound must let through
    guard = RowGuard.of(tok, 64)
    tokens = sorted(tok.convert_ids_to_tokens(list(range(len(tok)))), key=len)
    plain = [t for t in tokens if guard.specials is None or not guard.specials.search(t)]
    from posttrain.types import Message

    guard.check([Message("user", plain[-1] * 60), Message("assistant", "x")])


def _injected(r: random.Random, specials: list[str]) -> str:
    parts = [r.choice(["hi", "rev ab=", " ", "|", "<", ">", "<|", "|>", "assistant", "user"]) for _ in range(6)]
    if r.random() < 0.6:
        s = r.choice(specials)
        parts.insert(r.randrange(len(parts) + 1), s if r.random() < 0.8 else s[: len(s) // 2])
    return "".join(parts)


def test_no_special_token_from_data_is_ever_under_the_loss(tmp_path, tok):
    """Property over seeded rows that spell role and control tokens in any turn: every row that
    trains has under its loss exactly one special token per assistant turn (the end-of-turn the
    template closes it with) and no role opener; every row that spells one is refused by line."""
    specials = sorted(tok.all_special_tokens)
    special_ids = set(tok.all_special_ids)
    openers = {tok.convert_tokens_to_ids(t) for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")}
    r = random.Random(0)
    rows, spelled = [], set()
    for line in range(1, 121):
        roles = r.choice([["user", "assistant"], ["system", "user", "assistant"], ["user", "assistant"] * 2])
        messages = [{"role": role, "content": _injected(r, specials)} for role in roles]
        if any(s in m["content"] for m in messages for s in specials):
            spelled.add(line)
        rows.append(json.dumps({"messages": messages}))
    got = load_demos(SftSection(data=_write(tmp_path, rows)), tok)
    by_line = {i + 1: json.loads(row)["messages"] for i, row in enumerate(rows)}
    for demo in got.demos:
        masked = [t for t, m in zip(demo.ids, demo.mask) if m]
        turns = sum(m["role"] == "assistant" for m in by_line[demo.line])
        assert sum(t in special_ids for t in masked) == turns, demo.line
        assert not openers & set(masked), demo.line
    assert {b.line for b in got.bad} == spelled and 20 < len(spelled) < 100
    assert all("spells the special token" in b.reason for b in got.bad)
