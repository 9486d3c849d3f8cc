"""A run's checkpoint as a plain Hugging Face model directory (`posttrain export`, and the
merged copy `posttrain eval --run` / `compare` evaluate for a LoRA run).

Invariant: the output is a complete, loadable model directory (config, weights, tokenizer)
or nothing: it is written to a temporary folder and renamed into place. A LoRA checkpoint
is merged into its base (W + (alpha/r) B A); a full checkpoint's model files are copied
without trainer state. Either way a co-trained draft head (draft_head.pt, draft_head.json) goes
with the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_TRAINER_FILES = {"optimizer.pt", "rng.pt", "loop_state.json", "meta.json", "draft_head_optimizer.pt"}
"""Checkpoint files an export leaves out (the draft head's own files, draft_head.pt
and draft_head.json, go with the model: the fast tier drafts with them)."""


def export(source: Any, out: Any, base: str | None = None) -> dict[str, str]:
    import json
    import os
    import shutil
    import uuid

    from posttrain.errors import ConfigError
    from posttrain.model.arch import check_model_dir
    from posttrain.model.tokenizer import make_portable
    from posttrain.trainer.checkpoint import _resolve
    from posttrain.trainer.lora import is_adapter_dir, merge_to_dir

    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out: {str(out)!r} exists and is not empty")
    ckpt = _resolve(source)
    kind = "lora" if is_adapter_dir(ckpt) else "full"
    tmp = out.parent / f".tmp-{out.name}-{uuid.uuid4().hex[:8]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "lora":
            merge_to_dir(base_for(ckpt, base), ckpt, tmp)
            from posttrain.model.draft_head import META, WEIGHTS

            for name in (WEIGHTS, META):  # the co-trained draft head goes with the merged model too
                if (ckpt / name).is_file():
                    shutil.copy2(ckpt / name, tmp / name)
        else:
            tmp.mkdir()
            for f in ckpt.iterdir():
                if f.is_file() and f.name not in _TRAINER_FILES:
                    shutil.copy2(f, tmp / f.name)
            make_portable(tmp)  # a checkpoint written before tokenizers were saved portable
        check_model_dir(tmp)
        (tmp / "export.json").write_text(json.dumps({"checkpoint": str(ckpt), "kind": kind}))
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"checkpoint": str(ckpt), "kind": kind, "out": str(out)}


def base_for(ckpt: Any, base: str | None) -> str:
    """--base, else the run's model.path, else the embedded base the run trained on."""
    if base:
        return base
    from posttrain.errors import ConfigError
    from posttrain.rundir import RunDir

    run_dir = ckpt.parent.parent
    try:
        _, cfg = RunDir.open(run_dir)
    except ConfigError:
        raise ConfigError(f"{ckpt} is a LoRA adapter outside a run directory: give --base MODEL_DIR") from None
    if cfg.model.path:
        return cfg.model.path
    from posttrain.model.pretrain import ensure_base

    return str(ensure_base(cfg.base, progress=False))


def servable(ckpt: Path) -> Path:
    """A model directory for checkpoint `ckpt` that any engine loads: `ckpt` itself when it
    holds full weights; for a LoRA adapter inside a run, its merge into the run's base, made
    once into `RUN/merged/<checkpoint>/` (atomically, by `export`) and reused after; when another
    process merged the same checkpoint first, its folder is used."""
    from posttrain.trainer.lora import is_adapter_dir

    if not is_adapter_dir(ckpt):
        return ckpt
    merged = ckpt.parent.parent / "merged" / ckpt.name
    if not (merged / "export.json").is_file():
        from posttrain.errors import ConfigError

        try:
            export(ckpt, merged)
        except (OSError, ConfigError):
            # two evaluations of one checkpoint at once: the other one's merge was renamed into
            # place while this one merged (OSError at the rename; its own copy is removed) or
            # before this one began (ConfigError: the folder is not empty); that folder is complete
            if not (merged / "export.json").is_file():
                raise
    return merged
