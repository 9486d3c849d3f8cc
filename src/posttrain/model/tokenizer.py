"""A character-level Hugging Face tokenizer with a compact chat template.

Invariant: every printable ASCII character, newline and tab is one token, so
any text round-trips through encode/decode unchanged; chat roles are special
tokens. Saved with `save_pretrained`, it loads back through AutoTokenizer.
"""

from __future__ import annotations

import string

SPECIAL = {"pad": "<|pad|>", "unk": "<|unk|>", "eos": "<|end|>"}
ROLES = ("system", "user", "assistant", "tool")
CHARS = [c for c in string.printable if c not in "\x0b\x0c\r"]

CHAT_TEMPLATE = (
    "{%- if tools -%}<|system|>Tools: {{ tools | tojson }}{%- endif -%}"
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>"
    "{%- if message.tool_calls -%}"
    "{%- if message['content'] -%}{{ message['content'] }}{%- endif -%}"
    "{%- if message.tool_calls | length > 1 -%}[{%- endif -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{ '{\"name\": ' }}{{ fn.name | tojson }}{{ ', \"arguments\": ' }}"
    "{%- if fn.arguments is string -%}{{ fn.arguments }}{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}"
    "{{ '}' }}{%- if not loop.last -%}{{ ', ' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if message.tool_calls | length > 1 -%}]{%- endif -%}"
    "{%- else -%}{{ message['content'] }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
"""Roles are special tokens; only an assistant turn ends with <|end|>. Tool use
(OpenAI style): `tools` (declarations) render as a leading system turn; an
assistant message's `tool_calls` render as the JSON text the model itself sends
in the tool world, {"name": ..., "arguments": {...}} (a list when there are
several), and a "tool" message is the call's result. Messages without
tool_calls, and calls without `tools`, render exactly as before tools existed."""


def build_tokenizer():
    """The tokenizer of the embedded model (a PreTrainedTokenizerFast)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [SPECIAL["pad"], SPECIAL["unk"], SPECIAL["eos"]] + [f"<|{r}|>" for r in ROLES]
    vocab = {tok: i for i, tok in enumerate(specials + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL["unk"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=SPECIAL["pad"],
        unk_token=SPECIAL["unk"],
        eos_token=SPECIAL["eos"],
        additional_special_tokens=[f"<|{r}|>" for r in ROLES],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok
