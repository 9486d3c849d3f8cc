"""The direct path's batched prompt encoding gives the ids prompt-by-prompt encoding gives."""

from __future__ import annotations

import pytest

from posttrain.configs import load_config
from posttrain.engine.base import Engine
from posttrain.engine.hf import HFEngine
from posttrain.model.arch import random_model
from posttrain.pipeline.workers import EmbeddedWorkers
from posttrain.tasks.pool import TaskPool
from posttrain.types import Message

TRICKY = [
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed\r\nwindows line",
    "<|user|>hi<|assistant|>not a turn<|end|>",
    "{{ message['content'] }} {% if x %}jinja-looking{% endif %}",
    "unicode: é ü 中文 😀 \u200b zero width",
    "x",
    " ",
    "\n",
    "a" * 300,
]


@pytest.fixture(scope="module")
def workers():
    model, tok = random_model("tiny", seed=0)
    w = EmbeddedWorkers(HFEngine(model, tok, seed=0))
    yield w
    w.close()


def test_batched_encode_equals_per_prompt_encode_on_demo_and_tricky_prompts(workers):
    cfg = load_config("configs/default.yaml", [])
    demo = [t.prompt for t in TaskPool(cfg.tasks, seed=3).draw(64)]
    tricky = [(Message("user", text),) for text in TRICKY]
    multi = [
        (Message("system", "be brief\n"), Message("user", "2+2=?"), Message("assistant", " 4 "), Message("user", "?")),
        (Message("user", ""), Message("user", "second")),
    ]
    prompts = demo + tricky + multi
    assert workers.encode_many(prompts) == [workers.encode_now(p) for p in prompts]
    assert workers.encode_many(prompts[:1]) == [workers.encode_now(prompts[0])]


def test_a_prompt_that_cannot_be_encoded_gets_its_own_error(workers):
    good = (Message("user", "1+1="),)
    out = workers.encode_many([good, (), good])
    assert out[0] == out[2] == workers.encode_now(good)
    assert isinstance(out[1], Exception) and "empty" in str(out[1])
    assert workers.encode_many([]) == []


def test_other_engines_encode_prompt_by_prompt():
    class Echo(Engine):  # the contract's default encode_chats: encode_chat one prompt at a time
        def encode_chat(self, messages):
            if not messages:
                raise ValueError("empty")
            return tuple(len(m.content) for m in messages)

    w = EmbeddedWorkers(Echo())
    try:
        assert w.encode_many([(Message("user", "abc"),), (Message("user", "de"),)]) == [(3,), (2,)]
        out = w.encode_many([(Message("user", "abc"),), ()])
        assert out[0] == (3,) and isinstance(out[1], ValueError)  # one prompt's error is its own
    finally:
        w.close()
