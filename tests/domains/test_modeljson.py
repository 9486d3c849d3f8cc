"""Model output read as JSON: refused before parsing when over the size or depth bound
(a 100k-deep `[[[[` is a reason, never a RecursionError), NaN and Infinity refused, and
compared by type (True never equals 1); every parser of model JSON goes through it."""

from __future__ import annotations

import pytest

from posttrain.byo.verifiers import parse_json_object
from posttrain.domains import _modeljson as mj
from posttrain.domains._common import answer_json
from posttrain.domains.code import parse_outputs
from posttrain.domains.toolworld import parse_calls

HOSTILE = [
    "[" * 100_000,
    "[" * 100_000 + "]" * 100_000,
    '{"a": ' * 50_000 + "1" + "}" * 50_000,
    "[NaN]",
    '{"x": Infinity}',
    "[1e999]",
    "[" + "9" * 5000 + "]",  # an int over Python's 4300-digit conversion limit
    "[1" + "0" * 400 + "]",  # an int too large for a float (float() of it would raise OverflowError)
    '"' + "\\" * 200_001,  # an unterminated string of escapes: one linear pass
    "[" + "1," * (mj.MAX_JSON_CHARS // 2) + "1]",  # over the size bound
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_json_is_refused_with_a_reason(text):
    with pytest.raises(ValueError, match="not JSON"):
        mj.load_json(text)


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_every_model_json_parser_refuses_it_without_raising(text):
    assert answer_json(f"<answer>{text}</answer>") is None
    assert parse_json_object(text) is None
    with pytest.raises(ValueError):
        parse_calls(text)  # the tool world turns this into an `error: ...` observation
    assert [o.kind for o in parse_outputs(text.encode() + b"\n", 1)] == ["none"]


def test_within_the_bounds_json_parses():
    deep = "[" * mj.MAX_JSON_DEPTH + "]" * mj.MAX_JSON_DEPTH
    assert mj.load_json(deep) is not None
    with pytest.raises(ValueError, match="deeper"):
        mj.load_json("[" + deep + "]")
    assert mj.load_json('{"a": "[[[[", "b": [1, 2.5, true, null]}') == {"a": "[[[[", "b": [1, 2.5, True, None]}


@pytest.mark.parametrize(
    "a, b, equal",
    [
        (1, 1.0, True),
        (True, 1, False),
        (False, 0, False),
        (True, True, True),
        ("1", 1, False),
        (None, False, False),
        ([1, [True]], [1.0, [True]], True),
        ([True], [1], False),
        ({"a": 1}, {"a": True}, False),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        (10**400, 1e308, False),
    ],
)
def test_same_json_is_type_strict(a, b, equal):
    assert mj.same_json(a, b) is equal
    assert mj.same_json(b, a) is equal


def test_json_key_keeps_bools_apart_from_numbers_in_sets():
    assert len({True}) == 1  # the trap
    assert len({mj.json_key(True), mj.json_key(1)}) == 2
    assert mj.json_key(1) == mj.json_key(1.0)


def test_tolerance_applies_to_numbers_only():
    assert mj.same_json(1.0, 1.004, tol=0.01)
    assert not mj.same_json(True, 1.004, tol=0.01)
    assert not mj.same_json(10**400, 1.0, tol=0.5)


def test_a_field_too_large_for_a_float_is_a_wrong_answer_not_a_traceback():
    import json

    from posttrain.domains.registry import get
    from posttrain.types import Episode

    d = get("doc_invoice_fields_md")
    task = d.sample(0, "train", 1)
    fields = dict(task.reference["fields"])
    key = next(k for k, v in fields.items() if isinstance(v, (int, float)))
    text = json.dumps(fields).replace(json.dumps(fields[key]), "1" + "0" * 400, 1)
    s = d.score(task, Episode(f"<answer>{text}</answer>"))
    assert s.value == 0.0 and not s.passed


def test_extract_answer_pairs_tags_as_the_lazy_regex_did_in_one_pass():
    import random
    import re

    from posttrain.domains.base import extract_answer

    lazy = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    rng = random.Random(0)
    parts = ["<answer>", "</answer>", "a", " b ", "<ans", "wer>", "\n"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        found = lazy.findall(text)
        assert extract_answer(text) == (found[-1] if found else text).strip(), text
    # a million characters of unclosed openings (quadratic for the regex: hours) is read at once
    unclosed = "<answer>" * 125_000
    assert extract_answer(unclosed + "<answer>7</answer>") == unclosed[len("<answer>") :] + "<answer>7"
    assert extract_answer(unclosed) == unclosed
