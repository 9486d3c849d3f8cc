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


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-to-character table (what a ByteLevel pre-tokenizer maps each byte to)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Qwen2's pre-tokenizer pattern (transformers' Qwen2Tokenizer builds the same one).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def is_char_level(data: dict) -> bool:
    """Whether a tokenizer.json is this module's one-character-per-token tokenizer as first built."""
    pre = data.get("pre_tokenizer") or {}
    return (data.get("model") or {}).get("type") == "WordLevel" and pre.get("type") == "Split"


def portable_json(data: dict) -> dict:
    """The char-level tokenizer.json rewritten in the byte-level form Qwen2Tokenizer rebuilds.

    Plain transformers loads a folder whose config.json says `qwen2` with its own
    Qwen2Tokenizer, whatever tokenizer_config.json names: that class keeps only the
    vocabulary and merges and puts Qwen2's pipeline around them (NFC, Qwen2's split
    pattern, ByteLevel), under which a space is the character 'Ġ' and a newline 'Ċ'.
    The char-level vocabulary had ' ' and '\\n', so both vanished from every prompt.
    Here each character's vocabulary entry is its ByteLevel form, under the same id,
    as a merge-free BPE inside the same pipeline: the file read as it is
    (PreTrainedTokenizerFast) and Qwen2Tokenizer's rebuild encode every ASCII text to
    the ids the char-level tokenizer gave. A non-ASCII character was one <|unk|>
    before; now each of its bytes is unknown (no such entries), which Qwen2Tokenizer drops.
    """
    table = _byte_chars()
    vocab = {}
    for token, i in data["model"]["vocab"].items():
        single = len(token) == 1 and ord(token) < 128
        vocab[table[ord(token)] if single else token] = i
    out = dict(data)
    out["normalizer"] = {"type": "NFC"}
    out["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }
    out["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    out["model"] = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": "",
        "end_of_word_suffix": "",
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": vocab,
        "merges": [],
    }
    return out


def make_portable(folder) -> bool:
    """Rewrite a saved model folder's char-level tokenizer.json in portable form (see
    `portable_json`); True when it did. Any other tokenizer (a real model's) is left alone."""
    import json
    from pathlib import Path

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    if not is_char_level(data):
        return False
    path.write_text(json.dumps(portable_json(data), ensure_ascii=False, indent=2))
    return True


def save_tokenizer(tok, folder) -> None:
    """`tok.save_pretrained(folder)`, its char-level tokenizer.json made portable: what every
    model folder posttrain writes (bases, checkpoints, merges, exports) goes through."""
    tok.save_pretrained(folder)
    make_portable(folder)
