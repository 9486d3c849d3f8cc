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
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


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
