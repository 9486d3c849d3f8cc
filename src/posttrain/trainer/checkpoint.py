"""Checkpoints: model and tokenizer in Hugging Face format, optimizer, loop state, RNG.

Invariant: a checkpoint directory exists under its final name only when it
is complete (written to a temporary directory, every file and the directory
fsynced, `manifest.json` written last, then renamed and the parent fsynced);
`intact_checkpoint` takes the newest checkpoint whose files match their
manifest (sizes and sha256), saying which newer ones it passed over and why,
and removes the leftovers of interrupted writes (a pruned checkpoint leaves
its name in one rename before it is deleted). Loading a checkpoint
restores model parameters (in place, so an engine sharing the module sees
them), optimizer state, loop state and every RNG (python, numpy, torch CPU
and CUDA) exactly: a resumed run continues as if never interrupted.

Layout: <run_dir>/checkpoints/step_00000012/
  config.json, generation_config.json, model.safetensors  (save_pretrained)
  tokenizer files                                        (save_pretrained)
  optimizer.pt    torch.save(optimizer.state_dict())
  rng.pt          python, numpy, torch CPU and CUDA generator states
  loop_state.json the caller's loop state (JSON)
  meta.json       {"format": 1, "step": 12, "weights": "full" | "lora"}
  manifest.json   {"format": 1, "files": {name: {"bytes": n, "sha256": hex}}}, written last
A LoRA model (peft) saves only its adapter (adapter_config.json,
adapter_model.safetensors) in place of the model files; an FSDP-sharded
model is gathered to full tensors and written by rank 0 alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import struct
import sys
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.errors import TrainerError

FORMAT = 1
CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^step_(\d+)$")
_LEFTOVER = re.compile(r"^\.(tmp|old)-(step_\d+)-[0-9a-f]+$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    loop_state: dict[str, Any]


# ---------------------------------------------------------------- RNG


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch_cpu"])
    if state["torch_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


# ---------------------------------------------------------------- save


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:08d}"


def save_checkpoint(
    run_dir: str | Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    loop_state: dict[str, Any],
    step: int,
    keep: int | None = None,
    full_state: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write a complete checkpoint atomically; keep only the newest `keep`.
    `tokenizer` is anything with save_pretrained, or None to skip it;
    `full_state` (model, optimizer) replaces the model's and optimizer's own
    state dicts (gathered from FSDP shards); `extra` writes more files into the
    folder (the draft head's), listed in the manifest with the rest."""
    if step < 0:
        raise TrainerError(f"checkpoint step must be >= 0, got {step}")
    try:
        loop_json = json.dumps(loop_state, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TrainerError(f"loop_state is not JSON-serialisable: {exc}") from exc
    final = checkpoint_path(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        _write_all(tmp, model, tokenizer, optimizer, loop_json, step, full_state, extra)
        _install(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if keep is not None:
        prune_checkpoints(run_dir, keep)
    return final


def _write_all(
    tmp: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    loop_json: str,
    step: int,
    full_state: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    extra: Callable[[Path], None] | None = None,
) -> None:
    from posttrain.model.arch import is_peft

    tmp.mkdir()
    if full_state is not None:
        model.save_pretrained(tmp, state_dict=full_state[0])
    else:
        model.save_pretrained(tmp)
    if not list(tmp.glob("*.safetensors")):
        raise TrainerError(f"save_pretrained wrote no safetensors file in {tmp}")
    if tokenizer is not None:
        from posttrain.model.tokenizer import save_tokenizer

        save_tokenizer(tokenizer, tmp)
    torch.save(full_state[1] if full_state is not None else optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(capture_rng(), tmp / "rng.pt")
    (tmp / "loop_state.json").write_text(loop_json)
    if extra is not None:
        extra(tmp)
    weights = "lora" if is_peft(model) else "full"
    (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "step": step, "weights": weights}))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))
    _fsync_tree(tmp)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in [*root.iterdir(), root]:
        _fsync(path)


def _install(tmp: Path, final: Path) -> None:
    """Rename tmp to final and fsync the parent, so the rename itself is durable; an existing
    final is replaced, never half-overwritten (moved to .old-*, which `clean_leftovers` puts
    back if a crash comes between the two renames)."""
    trash = None
    if final.exists():
        trash = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        os.rename(final, trash)
    os.rename(tmp, final)
    _fsync(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and (path / "meta.json").is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def clean_leftovers(run_dir: str | Path, log: Callable[[str], object]) -> None:
    """Remove what interrupted writes left in the run's checkpoints folder (`.tmp-*` folders,
    `.old-*` copies of a replaced checkpoint), one line each. An `.old-*` whose checkpoint is
    missing (the crash came between the two renames of `_install`) is renamed back instead."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        match = _LEFTOVER.match(path.name)
        if match is None:
            continue
        final = root / match.group(2)
        if match.group(1) == "old" and not final.exists():
            os.rename(path, final)
            log(f"resume: restored {CHECKPOINTS}/{final.name} from {path.name} (a replacement interrupted)")
            continue
        shutil.rmtree(path, ignore_errors=True)
        log(f"resume: removed {CHECKPOINTS}/{path.name} (left by an interrupted checkpoint write)")


def verify_checkpoint(ckpt: Path) -> None:
    """Raise TrainerError saying what is damaged in checkpoint directory `ckpt`: meta.json missing
    or invalid, a file missing or whose size or sha256 differs from manifest.json. A checkpoint
    written before manifests existed is checked by structure instead: its JSON files parse, its
    safetensors files are as long as their headers say, its .pt archives pass their CRCs."""
    meta = _read_json(ckpt / "meta.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("step"), int):
        raise TrainerError(f"meta.json is not a format-{FORMAT} checkpoint record")
    _read_json(ckpt / "loop_state.json")
    if not (ckpt / MANIFEST).is_file():
        _verify_structure(ckpt)
        return
    manifest = _read_json(ckpt / MANIFEST)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise TrainerError(f"{MANIFEST} lists no files")
    for name, want in sorted(files.items()):
        if not isinstance(want, dict):
            raise TrainerError(f"{MANIFEST} entry {name!r} is not a record of bytes and sha256")
        path = ckpt / name
        if not path.is_file():
            raise TrainerError(f"{name} is missing")
        size = path.stat().st_size
        if size != want.get("bytes"):
            raise TrainerError(f"{name} has {size} bytes, the manifest says {want.get('bytes')}")
        if _sha256(path) != want.get("sha256"):
            raise TrainerError(f"{name} does not match its sha256 in the manifest")


def _verify_structure(ckpt: Path) -> None:
    weights = sorted(ckpt.glob("*.safetensors"))
    if not weights:
        raise TrainerError("no *.safetensors weights")
    for path in weights:
        size, want = path.stat().st_size, _safetensors_length(path)
        if size != want:
            raise TrainerError(f"{path.name} has {size} bytes, its header says {want}")
    for name in ("optimizer.pt", "rng.pt"):
        try:
            with zipfile.ZipFile(ckpt / name) as archive:
                bad = archive.testzip()
        except (OSError, zipfile.BadZipFile) as exc:
            raise TrainerError(f"{name} is unreadable: {exc}") from None
        if bad is not None:
            raise TrainerError(f"{name} fails its CRC check at {bad}")


def _safetensors_length(path: Path) -> int:
    """The file length a safetensors header declares: 8 bytes, the header, then the last tensor's end."""
    with path.open("rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        try:
            if not 0 <= n <= path.stat().st_size - 8:
                raise ValueError("header length out of range")
            header = json.loads(fh.read(n))
            return 8 + n + max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (AttributeError, KeyError, TypeError, IndexError, ValueError, RecursionError):
            raise TrainerError(f"{path.name} has no readable safetensors header") from None


def intact_checkpoint(run_dir: str | Path, log: Callable[[str], object]) -> Path:
    """The newest checkpoint of `run_dir` that passes `verify_checkpoint`, after `clean_leftovers`.
    Each newer damaged one is said in one line (`resume: checkpoints/step_40 is damaged (why);
    resuming from step_30`); with none intact, one TrainerError that names each and why."""
    clean_leftovers(run_dir, log)
    root = Path(run_dir) / CHECKPOINTS
    found = sorted(
        (int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ()) if (m := _NAME.match(p.name))
    )
    if not found:
        raise TrainerError(f"no checkpoint at {run_dir} (neither a checkpoint directory nor a run with checkpoints)")
    damaged: list[tuple[Path, str]] = []
    for _, path in reversed(found):
        try:
            verify_checkpoint(path)
        except TrainerError as exc:
            damaged.append((path, str(exc)))
            continue
        for bad, why in damaged:
            log(f"resume: {CHECKPOINTS}/{bad.name} is damaged ({why}); resuming from {path.name}")
        return path
    said = "; ".join(f"{p.name}: {why}" for p, why in damaged)
    raise TrainerError(f"no intact checkpoint in {root} ({said})")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Remove all but the newest `keep` checkpoints. Each leaves its final name in one rename
    (to a `.tmp-*` leftover, then deleted), so a crash while deleting never leaves a half-removed
    checkpoint under a checkpoint's name; `clean_leftovers` removes what a crash left."""
    if keep < 1:
        raise TrainerError(f"keep_checkpoints must be >= 1, got {keep}")
    for _, path in list_checkpoints(run_dir)[:-keep]:
        gone = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, gone)
        _fsync(path.parent)
        shutil.rmtree(gone)


# ---------------------------------------------------------------- load


def load_checkpoint(
    path: str | Path, model: Any, optimizer: torch.optim.Optimizer | None = None, restore_rngs: bool = True
) -> Checkpoint:
    """Restore a checkpoint into `model` (in place) and `optimizer`. `path` is a
    checkpoint directory or a run directory (its latest checkpoint is used)."""
    ckpt = _resolve(Path(path))
    meta = _read_json(ckpt / "meta.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else meta
        raise TrainerError(f"checkpoint {ckpt} has format {got!r}, expected {FORMAT}")
    from posttrain.trainer.fsdp import is_sharded, load_full_state

    if is_sharded(model):
        optim_state = _torch_load(ckpt / "optimizer.pt") if optimizer is not None else None
        load_full_state(model, optimizer, _read_weights(ckpt), optim_state)
    else:
        load_model_weights(ckpt, model)
        if optimizer is not None:
            optimizer.load_state_dict(_torch_load(ckpt / "optimizer.pt"))
    if restore_rngs:
        restore_rng(_torch_load(ckpt / "rng.pt"))
    return Checkpoint(path=ckpt, step=int(meta["step"]), loop_state=_read_json(ckpt / "loop_state.json"))


def _resolve(path: Path) -> Path:
    """`path` when it is a checkpoint directory, else the run's newest intact checkpoint (a
    fallback past damaged ones is said on stderr)."""
    if (path / "meta.json").is_file():
        return path
    return intact_checkpoint(path, lambda line: print(line, file=sys.stderr))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrainerError(f"cannot read {path}: {exc}") from None
    except RecursionError:  # a damaged file nested past the parser's stack
        raise TrainerError(f"cannot read {path}: nested too deeply") from None


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise TrainerError(f"cannot read {path}: {exc}") from None


def _read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise TrainerError(f"checkpoint {ckpt} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError for a bad file
            raise TrainerError(f"cannot read {file}: {exc}") from None
    return state


def load_model_weights(ckpt: Path, model: Any) -> None:
    """Copy the safetensors weights of `ckpt` into `model`'s existing tensors.
    Keys absent from the files are allowed only for tied parameters. A LoRA
    model loads its adapter; a LoRA checkpoint does not fit a plain model."""
    from posttrain.model.arch import is_peft
    from posttrain.trainer.lora import is_adapter_dir, load_adapter_state

    if is_peft(model) != is_adapter_dir(ckpt):
        kind = "a LoRA adapter" if is_adapter_dir(ckpt) else "full weights"
        raise TrainerError(
            f"checkpoint {ckpt} holds {kind}, which does not fit a "
            f"{'LoRA' if is_peft(model) else 'plain'} model (set trainer.lora alike)"
        )
    if is_peft(model):
        load_adapter_state(model, ckpt)
        return
    state = _read_weights(ckpt)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches raise even when strict=False
        raise TrainerError(f"checkpoint {ckpt} does not fit the model: {exc}") from exc
    untied = _untied(model, missing, state)
    if unexpected or untied:
        raise TrainerError(f"checkpoint {ckpt} does not fit the model: missing {untied}, unexpected {list(unexpected)}")


def _untied(model: Any, missing: list[str], loaded: dict[str, torch.Tensor]) -> list[str]:
    """Missing keys that are not the same Parameter as some loaded key."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ids = {id(params[k]) for k in loaded if k in params}
    return [k for k in missing if k not in params or id(params[k]) not in loaded_ids]
