"""A saved base's tokenizer loads back exactly as it was built.

The fault this pins: AutoTokenizer turned the embedded base's character-level
tokenizer into a Qwen2Tokenizer (config.json says qwen2), whose ByteLevel
pre-tokenizer dropped every space, newline and tab from the prompts the engine,
the trainer and evaluation saw.
"""

from __future__ import annotations

import json
import string

import pytest

from posttrain.model.arch import load_model, load_tokenizer
from posttrain.model.tokenizer import build_tokenizer

TEXTS = [
    "def f(x):\n    return x + 1",
    "rev abc=",
    "a\tb  c\n\nd",
    string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", ""),
    "<|user|>hi there<|assistant|>yo<|end|>",
]
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "add 12 and 5\nthen stop"},
    {"role": "assistant", "content": "look: a b"},
    {"role": "tool", "content": "a b = 1\n"},
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_saved_base_tokenizer_round_trips_whitespace(micro_base, text):
    built, loaded = build_tokenizer(), load_tokenizer(micro_base)
    assert loaded.encode(text) == built.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert load_model(micro_base)[1].encode(text) == built.encode(text)  # the path train, eval and serve take


def test_the_chat_template_and_special_tokens_survive_the_reload(micro_base):
    built, loaded = build_tokenizer(), load_tokenizer(micro_base)
    for gen in (True, False):
        assert loaded.apply_chat_template(MESSAGES, add_generation_prompt=gen) == built.apply_chat_template(
            MESSAGES, add_generation_prompt=gen
        )
    assert sorted(loaded.all_special_ids) == sorted(built.all_special_ids)
    ids = (loaded.eos_token_id, loaded.pad_token_id, len(loaded))
    assert ids == (built.eos_token_id, built.pad_token_id, len(built))
    assert len(loaded.encode("<|tool|>")) == 1


def test_a_directory_naming_its_own_tokenizer_class_goes_through_autotokenizer(micro_base, tmp_path):
    """Only the generic fast tokenizer is loaded from tokenizer.json directly; a directory
    naming a model-specific class keeps AutoTokenizer's choice (a user's Qwen, Llama, ...)."""
    import shutil

    other = tmp_path / "named"
    shutil.copytree(micro_base, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert type(load_tokenizer(other)).__name__ == "Qwen2Tokenizer"
    assert type(load_tokenizer(micro_base)).__name__ != "Qwen2Tokenizer"
