"""The embedded tokenizer's chat template with tool use: existing chats render
exactly as the pre-tools template did (the demo's prompts do not change), and an
OpenAI-style assistant `tool_calls` message renders as the same text the model
sends as a tool-world action, so a served conversation and a training episode
tokenise alike."""

from __future__ import annotations

import json

import pytest

from posttrain.domains.registry import get
from posttrain.domains.toolworld import parse_calls
from posttrain.model.tokenizer import build_tokenizer

PRE_TOOLS_TEMPLATE = (  # the template before tool calls existed, verbatim
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
CHATS = [
    [{"role": "user", "content": "12+30="}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"}],
    [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": '{"name": "x"}'},
        {"role": "tool", "content": "ok"},
        {"role": "user", "content": "again"},
    ],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("gen", [True, False])
def test_chats_without_tools_render_as_before(tok, chat, gen):
    now = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
    before = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen, chat_template=PRE_TOOLS_TEMPLATE)
    assert now == before


def test_tool_calls_render_as_the_tool_world_action(tok):
    d = get("tool_transfer")
    task = d.sample(0, "train", 2)
    first = d.gold_turns(task)[0]
    call = json.loads(first)
    openai = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
        ],
    }
    chat = [{"role": "user", "content": task.prompt[0].content}, openai, {"role": "tool", "content": "[]"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    plain = tok.apply_chat_template(
        [chat[0], {"role": "assistant", "content": first}, chat[2]], tokenize=False, add_generation_prompt=True
    )
    assert text == plain
    two = dict(openai, tool_calls=[{"function": c} for c in map(json.loads, d.gold_turns(task)[:2])])
    rendered = tok.apply_chat_template([two], tokenize=False).removeprefix("<|assistant|>").removesuffix("<|end|>")
    assert parse_calls(rendered) == [json.loads(a) for a in d.gold_turns(task)[:2]]


def test_tool_declarations_render_first_only_when_given(tok):
    tools = [{"type": "function", "function": {"name": "finish", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(CHATS[0], tokenize=False, tools=tools)
    assert text.startswith('<|system|>Tools: [{"type": "function"') and text.endswith("<|user|>12+30=")
