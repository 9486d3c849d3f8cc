"""The loop's engine choice (`make_engine`: hf in process, vllm through a vLLM server, or
openai over HTTP), weight sync between the trainer and its inference engine, and the
staleness bound.

Invariant: after `push()` returns, the engine samples with the trainer's
current weights and `engine.version` is the version it acknowledged: in
process (hf) the shared module is already updated; remote (openai, vllm) the
weights (the adapter alone for a LoRA model) are written to a fresh folder
under sync_dir, renamed into place complete, and loaded by the server
(openai: /v1/update_weights; vllm: pause, in-place reload or adapter load,
prefix-cache reset, resume; see engine/vllm.py); a push the engine does not
acknowledge raises (WeightSyncError), it never returns. With engine.verify_sync
on (auto: a remote engine) the engine's log-probs of a fixed probe equal the
trainer's own within the tolerance, checked before push returns
(engine/probe.py), or the run stops with SyncVerificationError. `fresh` keeps
only groups whose every rollout
was produced within `max_staleness` versions of the engine's acknowledged
version, as the server reported it, so a lagging or restarted server in
another process never feeds the trainer stale samples.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrain.configs.engine import EngineConfig
from posttrain.configs.trainer import MismatchConfig
from posttrain.contracts.engine import Engine
from posttrain.engine.guard import EngineGuard
from posttrain.engine.probe import SyncProbe
from posttrain.engine.speculate import CollapseProbe, acceptance_row
from posttrain.errors import GenerationError
from posttrain.rollout import too_stale

if TYPE_CHECKING:
    from posttrain.engine.hf import HFEngineConfig

_LEFTOVER = re.compile(r"^\.tmp-v\d{8}-[0-9a-f]{8}$")
"""A folder `_write` left when it was interrupted before its rename."""


def make_engine(
    cfg: EngineConfig,
    model: Any,
    tokenizer: Any,
    seed: int,
    run_dir: str | Path | None = None,
    draft_head: Any = None,
    processor: Any = None,
) -> Engine:
    """The loop's engine: HFEngine over the trained module (and the trainer's `draft_head`, which
    `engine.speculation.kind: head` drafts with; a vision model's with its `processor`),
    VLLMEngine (a server started for the module's model directory, its files under
    `run_dir`/vllm, or attached at cfg.url), or OpenAIEngine over cfg.url (these two read text
    only and refuse a request with images)."""
    if cfg.kind == "vllm":
        return _vllm_engine(cfg, model, tokenizer, seed, run_dir)
    if cfg.kind == "openai":
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

    return HFEngine(model, tokenizer, config=hf_config(cfg), seed=seed, draft_head=draft_head, processor=processor)


def hf_config(cfg: EngineConfig, evaluation: bool = False) -> HFEngineConfig:
    """The hf engine's settings from the run's `engine` section (the loop's engine, `posttrain
    eval`'s). `evaluation`: generate with the model itself whatever `generate_dtype` says (what
    evaluation measures is the policy's own weights: `evaluation_engine`)."""
    from posttrain.engine.hf import HFEngineConfig

    return HFEngineConfig.model_validate(
        {
            "context_reuse": cfg.context_reuse,
            "context_budget_tokens": cfg.context_budget_tokens,
            "max_batch_tokens": cfg.max_batch_tokens,
            "prefill_chunk_tokens": cfg.prefill_chunk_tokens,
            "kv_dtype": cfg.kv_dtype,
            "speculation": cfg.speculation,
            "generate_dtype": "model" if evaluation else cfg.generate_dtype,
        }
    )


def evaluation_engine(engine: Engine) -> Engine:
    """The engine held-out evaluation generates with: the loop's own, except an hf engine generating
    with an inference copy (`engine.generate_dtype`), whose twin over the trained module is used
    instead (`HFEngine.for_evaluation`): before and after are the policy's own weights, as saved
    and served, whatever dtype the rollouts were sampled in."""
    from posttrain.engine.hf import HFEngine

    return engine.for_evaluation() if isinstance(engine, HFEngine) else engine


def _vllm_engine(cfg: EngineConfig, model: Any, tokenizer: Any, seed: int, run_dir: str | Path | None) -> Engine:
    from posttrain.engine.vllm import VLLMEngine

    v = cfg.vllm
    kw: dict[str, Any] = {
        "timeout_s": cfg.timeout_s,
        "concurrency": cfg.concurrency,
        "seed": seed,
        "push_timeout_s": v.push_timeout_s,
        "push_retries": v.push_retries,
        "max_restarts": v.max_restarts,
    }
    if cfg.url:
        return VLLMEngine(tokenizer, url=cfg.url, **kw)
    if run_dir is None:
        raise ValueError("make_engine: the vllm engine starts a server and needs run_dir for its files")
    peft = getattr(model, "peft_config", None)  # peft injects the adapters into the module it wraps
    lora_rank = int(next(iter(peft.values())).r) if peft else None
    model_dir = str(getattr(model, "name_or_path", "") or "")  # load_model's directory (the base under LoRA)
    if not model_dir:
        raise ValueError("make_engine: the vllm engine serves the model's directory, and this model has none")
    return VLLMEngine.start(model_dir, run_dir, tokenizer, v, lora_rank, speculation=cfg.speculation, **kw)


class WeightSync:
    """Pushes the trainer's weights to the engine after each optimizer step."""

    def __init__(
        self,
        cfg: EngineConfig,
        engine: Engine,
        trainer: Any,
        run_dir: str | Path,
        mismatch: MismatchConfig | None = None,
    ) -> None:
        self.cfg, self.engine, self.trainer = cfg, engine, trainer
        self.dir = Path(cfg.sync_dir) if cfg.sync_dir else Path(run_dir) / "weights"
        self.pushed = 0
        self.dropped_stale = 0
        self._last_counters: dict[str, int] = {}
        spec = cfg.speculation
        check = spec.collapse_check if spec.collapse_check is not None else spec.kind == "head"
        by_probe = spec.kind == "head" and callable(getattr(engine, "spec_probe", None))
        self._collapse = CollapseProbe(spec.collapse_drop) if spec.kind != "off" and check else None
        """The collapse check: of the push probe's figure (kind head, an hf engine), else of the rollouts'."""
        self._probed = by_probe
        self._probe_row: dict[str, float] = {}
        """The last push probe's figures, for the next metrics row (`engine_probe_spec_*`)."""
        self._spec_sinks: list[Callable[[str, dict[str, float]], object]] = []
        self.probe = SyncProbe(cfg, engine, trainer, self.remote)  # engine.verify_sync (engine/probe.py)
        self.guard = EngineGuard(
            cfg, mismatch or MismatchConfig.model_validate({}), self.probe
        )  # faults, mismatch (engine/guard.py)

    @property
    def remote(self) -> bool:
        """Whether the weights travel to another process (written to sync_dir, then loaded)."""
        return self.cfg.kind in ("openai", "vllm")

    def stats(self) -> dict[str, int | float]:
        """What the metrics row carries: the engine's own counters (`Engine.counters`; vllm: request
        retries, server restarts, pushes, failed push attempts, and with speculation the server's draft
        counters; hf with speculation: its draft
        counters), prefixed `engine_`, and with speculation the acceptance figures since the last
        call (`engine_spec_acceptance`, `engine_spec_accepted_len`, `engine_spec_step_len`:
        engine/speculate.py); with `engine.speculation.collapse_check`, a collapse of the last
        raises GenerationError (`CollapseProbe`)."""
        now = {f"engine_{k}": int(v) for k, v in self.engine.counters().items()}
        figures = acceptance_row(now, self._last_counters)
        self._last_counters = now
        if self._collapse is not None and not self._probed:  # collapse_check on the rollouts' figure
            self._collapse.observe(figures.get("engine_spec_step_len"), f" after push {self.pushed}")
        probe, self._probe_row = self._probe_row, {}
        return {**now, **figures, **probe}

    def attach_spec(self, sink: Callable[[str, dict[str, float]], object]) -> None:
        """Call `sink(message, figures)` after each push probe (`_spec_probe`): the figures of the
        metrics row, the push, the running level it was judged against and whether it stopped the
        run (the loop writes each as a `spec_probe` trace event). A push before the engine saw any
        prompt probes nothing and tells nothing."""
        self._spec_sinks.append(sink)

    def _spec_probe(self) -> None:
        """After a push, with the collapse check on a head: the fixed probe's figures and seconds
        (kept for the next metrics row as `engine_probe_spec_*`, `engine_probe_spec_s`, and given to
        each `attach_spec` sink), and GenerationError with both figures when its tokens per row per
        drafting step fell more than collapse_drop below their running level beyond counting noise
        (`CollapseProbe`)."""
        if self._collapse is None or not self._probed or self.probe.busy:  # busy: a re-push; its caller probes
            return
        started = time.perf_counter()
        got = self.engine.spec_probe()  # type: ignore[attr-defined]
        self._probe_row = {f"engine_probe_{k}": v for k, v in got.items()}
        if not got:  # no prompt seen yet (the first push): nothing probed, nothing to tell
            return
        self._probe_row["engine_probe_spec_s"] = round(time.perf_counter() - started, 4)  # what it cost this push
        rows = int(got.get("spec_drafting", 0))
        level = self._collapse.level
        try:
            self._collapse.observe(got.get("spec_step_len"), f" at the probe after push {self.pushed}", rows)
        except GenerationError as exc:
            self._spec_told(str(exc), level, stopped=True)
            raise
        self._spec_told(f"push probe after push {self.pushed}", level, stopped=False)

    def _spec_told(self, message: str, level: float | None, stopped: bool) -> None:
        figures = {**self._probe_row, "push": float(self.pushed), "stopped": float(stopped)}
        if level is not None:
            figures["level"] = round(level, 6)
        for sink in self._spec_sinks:
            sink(message, figures)

    def push(self) -> int:
        """Make the engine sample with the current weights; returns its new version."""
        self.probe.before_push()  # a remote engine still serves the last verified weights
        self.pushed += 1
        if not self.remote:
            version = self.engine.update_weights(None)
        else:
            path = self._write(self.pushed)
            version = self.engine.update_weights(str(path))
            self._prune(path)
        version = self.probe.after_push(version, self.push)  # verified, or one re-push, or SyncVerificationError
        self._spec_probe()  # a head that drafts: its accepted length on a fixed probe, or GenerationError
        return version

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint carries: the pushes made, the stale groups dropped, the engine's version."""
        return {"pushed": self.pushed, "dropped_stale": self.dropped_stale, "version": int(self.engine.version)}

    def resume(self, state: Mapping[str, int] | None) -> int:
        """Push the weights a resume restored, as the version they had at the checkpoint (`state`, a
        `state_dict`; None for a checkpoint without one: counting starts again). An in-process (or vllm) engine
        takes up its numbering where the checkpoint left it, so a resumed run's model versions equal
        the uninterrupted run's; a remote engine's version is the server's to report."""
        if state:
            self.pushed, self.dropped_stale = int(state["pushed"]) - 1, int(state["dropped_stale"])
            if self.cfg.kind != "openai":  # hf and vllm number their own versions
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
        """Close a remote engine (`Engine.close`: its server, its clients); an in-process one
        lives on with the trainer's module (the run's evaluation may still use it)."""
        if self.remote:
            self.engine.close()
