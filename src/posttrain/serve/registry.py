"""The model registry: released versions on disk and which one is stable or canary.

Invariant: `registry.json` is replaced atomically (write then rename), so a
reader sees the old state or the new one, never half of either; a version's
directory is complete (weights copied, `release.json` written) before the
version is named in the state; the stable version is never removed by a
rollback, only the canary is.

Layout: ROOT/registry.json, ROOT/versions/vN/{config.json, *.safetensors,
tokenizer files, release.json}.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from posttrain.configs import read_json
from posttrain.errors import ConfigError
from posttrain.model.arch import check_model_dir

FastMode = Literal["lossless", "int8"]


@dataclass(frozen=True)
class VersionInfo:
    """One released version."""

    name: str
    path: str
    source: str
    created: float
    fast_mode: FastMode = "lossless"
    gate: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RegistryState:
    """Which version serves: `stable` takes all traffic but `canary_share`."""

    stable: str | None = None
    canary: str | None = None
    canary_share: float = 0.1
    events: tuple[Mapping[str, Any], ...] = ()


class ModelRegistry:
    """Versions under `root`, promoted and rolled back through `registry.json`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "versions").mkdir(parents=True, exist_ok=True)

    @property
    def state_path(self) -> Path:
        return self.root / "registry.json"

    def state(self) -> RegistryState:
        if not self.state_path.is_file():
            return RegistryState()
        data = read_json(self.state_path)
        try:
            return RegistryState(
                data.get("stable"),
                data.get("canary"),
                float(data.get("canary_share", 0.1)),
                tuple(data.get("events", ())),
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise ConfigError(f"{self.state_path}: not a registry state: {exc}") from None

    def mtime(self) -> float:
        return self.state_path.stat().st_mtime_ns if self.state_path.is_file() else 0.0

    def version(self, name: str) -> VersionInfo:
        meta = self.root / "versions" / name / "release.json"
        if not meta.is_file():
            known = ", ".join(v.name for v in self.versions()) or "none"
            raise ConfigError(f"version {name!r} is not in the registry at {str(self.root)!r} (known: {known})")
        data = read_json(meta)
        try:
            return VersionInfo(**data)
        except TypeError as exc:
            raise ConfigError(f"{meta}: not a release record: {exc}") from None

    def versions(self) -> list[VersionInfo]:
        names = sorted(
            (p.name for p in (self.root / "versions").iterdir() if (p / "release.json").is_file()),
            key=lambda n: int(n[1:]) if n[1:].isdigit() else -1,
        )
        return [self.version(n) for n in names]

    def add(
        self,
        model_dir: str | Path,
        source: str = "",
        fast_mode: FastMode = "lossless",
        gate: Mapping[str, Any] | None = None,
    ) -> VersionInfo:
        """Copy a model directory in as the next version vN (not yet serving)."""
        src = check_model_dir(model_dir)
        n = 1 + max((int(v.name[1:]) for v in self.versions() if v.name[1:].isdigit()), default=0)
        name = f"v{n}"
        final = self.root / "versions" / name
        tmp = self.root / "versions" / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=_trainer_state)
        info = VersionInfo(name, str(final), source or str(src), time.time(), fast_mode, dict(gate or {}))
        (tmp / "release.json").write_text(json.dumps(info.__dict__ | {"gate": dict(info.gate)}, indent=2))
        os.replace(tmp, final)
        return info

    def release(self, info: VersionInfo, canary_share: float | None = None) -> RegistryState:
        """Make `info` the stable version if there is none, else the canary."""
        st = self.state()
        if st.stable is None:
            return self._write(replace(st, stable=info.name), "release", info.name, "first version: stable")
        share = st.canary_share if canary_share is None else canary_share
        return self._write(replace(st, canary=info.name, canary_share=share), "canary", info.name, f"share {share}")

    def promote(self, reason: str = "manual") -> RegistryState:
        st = self.state()
        if st.canary is None:
            raise ConfigError("promote: there is no canary version to promote")
        return self._write(replace(st, stable=st.canary, canary=None), "promote", st.canary, reason)

    def rollback(self, reason: str = "manual") -> RegistryState:
        st = self.state()
        if st.canary is None:
            raise ConfigError("rollback: there is no canary version to roll back")
        return self._write(replace(st, canary=None), "rollback", st.canary, reason)

    def set_share(self, share: float) -> RegistryState:
        if not 0.0 <= share <= 1.0:
            raise ConfigError(f"canary_share must be in [0, 1], got {share}")
        return self._write(replace(self.state(), canary_share=share), "share", "", str(share))

    def _write(self, st: RegistryState, action: str, version: str, reason: str) -> RegistryState:
        event = {"time": time.time(), "action": action, "version": version, "reason": reason}
        st = replace(st, events=(st.events + (event,))[-200:])
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(
            json.dumps(
                {"stable": st.stable, "canary": st.canary, "canary_share": st.canary_share, "events": list(st.events)},
                indent=2,
            )
        )
        os.replace(tmp, self.state_path)
        return st


_TRAINER_STATE = shutil.ignore_patterns("optimizer*", "*.pt", "loop_state*", "rng*")


def _trainer_state(folder: str, names: list[str]) -> set[str]:
    """What a release leaves out of a model folder: the trainer's state (optimizer, RNG, loop
    state, draft_head_optimizer.pt), but not the draft head the fast tier drafts with."""
    return set(_TRAINER_STATE(folder, names)) - {"draft_head.pt"}
