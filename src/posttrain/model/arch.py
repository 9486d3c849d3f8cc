"""Model presets and loading of any Hugging Face-format model directory.

Invariant: every model, embedded or user-supplied, is loaded through
AutoModelForCausalLM from a local directory, with no hub access, and its
tokenizer exactly as it was saved (`load_tokenizer`); a registered real model's name
(`posttrain models list`) stands for its checked cached folder (model/real.py): text round-trips through
encode and decode as it did before saving; a directory without weights raises
ModelLoadError naming what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from posttrain.errors import ModelLoadError

Preset = Literal["micro", "tiny", "small", "medium"]

# hidden, layers, heads, kv heads, mlp: about 0.1M / 0.8M / 4.8M / 19M parameters
PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "micro": (32, 2, 4, 2, 64),
    "tiny": (128, 4, 4, 2, 384),
    "small": (256, 6, 8, 4, 768),
    "medium": (512, 6, 8, 4, 1536),
}


def make_config(preset: str, vocab_size: int, pad_id: int, eos_id: int, max_positions: int = 512) -> Any:
    from transformers import Qwen2Config

    if preset not in PRESETS:
        raise ModelLoadError(f"model preset {preset!r} unknown; allowed: {', '.join(PRESETS)}")
    hidden, layers, heads, kv, mlp = PRESETS[preset]
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        use_cache=True,
    )


def random_model(preset: str = "micro", seed: int = 0, max_positions: int = 512) -> tuple[Any, Any]:
    """A randomly initialised model of a preset with the embedded tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = make_config(preset, len(tok), tok.pad_token_id, tok.eos_token_id, max_positions)
    model = AutoModelForCausalLM.from_config(cfg)
    return model, tok


def _what_loads(path: str) -> str:
    """What a model path may name, with a near registered name when there is one."""
    import difflib

    from posttrain.model.real import MODELS

    text = (
        "a model path is a local Hugging Face model folder or a packaged model's name "
        f"(`posttrain models list`: {', '.join(sorted(MODELS)) or 'none registered'}); nothing is downloaded"
    )
    parts = path.split("/")
    if len(parts) == 2 and all(parts) and not path.startswith((".", "~")):
        text += f" from the Hugging Face Hub: {path!r} looks like a hub id (download it and give its folder)"
    near = difflib.get_close_matches(path.rsplit("/", 1)[-1].lower(), sorted(MODELS), n=1, cutoff=0.6)
    return text + (f"; did you mean {near[0]!r}?" if near else "")


def check_model_dir(path: str | Path) -> Path:
    """The model folder `path` names (a registered real model's name resolves to its checked
    cache, model/real.py), checked to hold a config and weights."""
    from posttrain.model.real import resolve

    p = Path(resolve(path))
    if not p.is_dir():
        raise ModelLoadError(f"model directory {str(p)!r} does not exist; {_what_loads(str(path))}")
    if not (p / "config.json").is_file():
        raise ModelLoadError(f"model directory {str(p)!r} has no config.json (not a Hugging Face model directory)")
    weights = list(p.glob("*.safetensors")) + list(p.glob("pytorch_model*.bin"))
    if not weights:
        raise ModelLoadError(f"model directory {str(p)!r} has no weights (*.safetensors or pytorch_model*.bin)")
    return p


def load_model(path: str | Path, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Model and tokenizer from a local HF directory, or a registered real model's name (no hub)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = check_model_dir(path)
    try:
        tok = load_tokenizer(p)
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model from {str(p)!r}: {exc}") from exc
    return model.to(device).eval(), tok


GENERIC_TOKENIZERS = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved in a local model directory, as it was saved.

    AutoTokenizer picks the tokenizer class from config.json's model type, even
    when tokenizer_config.json names the generic fast tokenizer: the embedded
    base (a Qwen2 with a one-character-per-token tokenizer) came back as a
    Qwen2Tokenizer whose ByteLevel pre-tokenizer maps a space to a symbol the
    vocabulary lacks, so spaces and newlines vanished from every prompt. A
    directory whose tokenizer_config.json names the generic class is therefore
    loaded with that class, from its tokenizer.json; any other through AutoTokenizer.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from posttrain.model.real import resolve

    p = Path(resolve(path))
    config = p / "tokenizer_config.json"
    named = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if named in GENERIC_TOKENIZERS and (p / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(p), local_files_only=True)
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
