"""The loop's engine choice (`make_engine`: hf in process or openai over HTTP), weight sync
between the trainer and its inference engine, and the staleness bound.

Invariant: after `push()` returns, the engine samples with the trainer's
current weights and `engine.version` is the version it acknowledged: in
process (hf) the shared module is already updated; remote (openai) the
weights (the adapter alone for a LoRA model) are written to a fresh folder
under sync_dir, renamed into place complete, and loaded by the server
through /v1/update_weights. `fresh` keeps only groups whose every rollout
was produced within `max_staleness` versions of the engine's acknowledged
version, as the server reported it, so a lagging or restarted server in
another process never feeds the trainer stale samples.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.configs.engine import EngineConfig
from posttrain.rollout import too_stale

_LEFTOVER = re.compile(r"^\.tmp-v\d{8}-[0-9a-f]{8}$")
"""A folder `_write` left when it was interrupted before its rename."""


def make_engine(cfg: EngineConfig, model: Any, tokenizer: Any, seed: int) -> Any:
    """The loop's engine: HFEngine over the trained module, or OpenAIEngine over cfg.url."""
    if cfg.type == "openai":
        from posttrain.configs.serve import admin_token
        from posttrain.engine.openai import OpenAIEngine

        return OpenAIEngine(
            cfg.url or "",
            cfg.served_model,
            tokenizer,
            api_key=cfg.api_key,
            admin_token=admin_token(cfg.admin_token_file),
            timeout_s=cfg.timeout_s,
            concurrency=cfg.concurrency,
        )
    from posttrain.engine.hf import HFEngine

    return HFEngine(model, tokenizer, seed=seed)


class WeightSync:
    """Pushes the trainer's weights to the engine after each optimizer step."""

    def __init__(self, cfg: EngineConfig, engine: Any, trainer: Any, run_dir: str | Path) -> None:
        self.cfg, self.engine, self.trainer = cfg, engine, trainer
        self.dir = Path(cfg.sync_dir) if cfg.sync_dir else Path(run_dir) / "weights"
        self.pushed = 0
        self.dropped_stale = 0

    @property
    def remote(self) -> bool:
        return self.cfg.type == "openai"

    def push(self) -> int:
        """Make the engine sample with the current weights; returns its new version."""
        self.pushed += 1
        if not self.remote:
            return self.engine.update_weights(None)
        path = self._write(self.pushed)
        version = self.engine.update_weights(str(path))
        self._prune(path)
        return version

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint carries: the pushes made, the stale groups dropped, the engine's version."""
        return {"pushed": self.pushed, "dropped_stale": self.dropped_stale, "version": int(self.engine.version)}

    def resume(self, state: Mapping[str, int] | None) -> int:
        """Push the weights a resume restored, as the version they had at the checkpoint (`state`, a
        `state_dict`; None for a checkpoint without one: counting starts again). An in-process engine
        takes up its numbering where the checkpoint left it, so a resumed run's model versions equal
        the uninterrupted run's; a remote engine's version is the server's to report."""
        if state:
            self.pushed, self.dropped_stale = int(state["pushed"]) - 1, int(state["dropped_stale"])
            if not self.remote:
                self.engine.version = int(state["version"]) - 1
        return self.push()

    def clean_leftovers(self, log: Callable[[str], object]) -> None:
        """Remove the `.tmp-v*` folders an interrupted `_write` left in the sync folder, one line
        each (a resume calls it; finished `v*` versions are left to `_prune`)."""
        if not self.dir.is_dir():
            return
        for path in sorted(self.dir.iterdir()):
            if _LEFTOVER.match(path.name) and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
                log(f"resume: removed {path} (left by an interrupted weight sync)")

    def _write(self, n: int) -> Path:
        """Save weights (adapter only for LoRA) to sync_dir/v<n>, complete before it has that name."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / f"v{n:08d}"
        tmp = self.dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            self.trainer.save_weights(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _prune(self, current: Path) -> None:
        versions = sorted(p for p in self.dir.glob("v*") if p.is_dir())
        for old in versions[: max(0, len(versions) - self.cfg.keep_versions)]:
            if old != current:
                shutil.rmtree(old, ignore_errors=True)

    def fresh(self, groups: Sequence[Sequence[Any]], max_staleness: int) -> list[Sequence[Any]]:
        """Groups whose rollouts are all within max_staleness of the engine's version; the rest are counted."""
        version = int(self.engine.version)
        kept = [g for g in groups if not any(too_stale(version, r.completion.model_version, max_staleness) for r in g)]
        self.dropped_stale += len(groups) - len(kept)
        return kept

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if self.remote and callable(close):
            close()
