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

from posttrain.configs.base import BaseConfig
from posttrain.errors import ModelLoadError

Preset = Literal["micro", "tiny", "small", "medium"]

# hidden, layers, heads, kv heads, mlp: about 0.1M / 0.8M / 4.8M / 19M parameters
PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "micro": (32, 2, 4, 2, 64),
    "tiny": (128, 4, 4, 2, 384),
    "small": (256, 6, 8, 4, 768),
    "medium": (512, 6, 8, 4, 1536),
}


def make_config(
    preset: str, vocab_size: int, pad_id: int, eos_id: int, max_positions: int = 512, rope: dict | None = None
) -> Any:
    """The Qwen2 config of a preset; `rope` (transformers' `rope_parameters`, with
    `max_positions` its `max_position_embeddings`: `rope_settings`) when not the plain default."""
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
        **({"rope_parameters": dict(rope)} if rope else {}),
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        use_cache=True,
    )


def rope_settings(cfg: BaseConfig) -> tuple[int, dict]:
    """(max_position_embeddings, rope_parameters) of the model `cfg` builds, as transformers
    and vLLM read them: without scaling, `base.max_positions` and the plain rotation at
    `base.rope_theta`; with linear or dynamic scaling the learned positions
    (`cfg.learned_positions()`, what transformers' dynamic scaling starts past) and the factor;
    with yarn `base.max_positions`, the factor and the learned positions as
    `original_max_position_embeddings`. `position_limit` of that config is `base.max_positions`."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    scaling = cfg.rope_scaling
    if scaling is None:
        return cfg.max_positions, rope
    rope.update(rope_type=scaling.type, factor=scaling.factor)
    if scaling.type == "yarn":
        rope["original_max_position_embeddings"] = cfg.learned_positions()
        return cfg.max_positions, rope
    return cfg.learned_positions(), rope


def position_limit(config: Any) -> int | None:
    """The longest sequence a model config is meant for (None when it names none), by vLLM's
    rule: `max_position_embeddings`, times the factor under linear or dynamic RoPE scaling, or
    yarn's `original_max_position_embeddings` times its factor. The older `rope_scaling` (with
    `type`) of a config.json read as it is counts too; a config whose RoPE differs by layer type
    (a nested `rope_parameters`) is read as unscaled."""
    value = getattr(config, "max_position_embeddings", None)
    if not isinstance(value, int):
        return None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind, factor = rope.get("rope_type", rope.get("type")), rope.get("factor")
    if kind not in ("linear", "dynamic", "yarn") or not isinstance(factor, int | float):
        return value
    if kind == "yarn":
        value = rope.get("original_max_position_embeddings") or value
    return int(value * factor)


def is_peft(model: Any) -> bool:
    """True for a peft PeftModel (it carries `peft_config`): a module whose adapters peft injected."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def random_model(
    preset: str = "micro", seed: int = 0, max_positions: int = 512, rope: dict | None = None
) -> tuple[Any, Any]:
    """A randomly initialised model of a preset with the embedded tokenizer (`rope`: `make_config`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = make_config(preset, len(tok), tok.pad_token_id, tok.eos_token_id, max_positions, rope)
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
