"""A run's lineage: resumed with changed fields (extended), or branched from another run's checkpoint.

Invariant: every change a run's config went through is written down before it acts, in three
places: `config.yaml` holds the config the run goes on with (so a later plain `--resume` keeps
it), `config_history.jsonl` one line per change (never rolled back), and the run's metrics and
trace one `config_change` row and event each at the step it applies from (re-written after a
resume that rolled them back). A branch (`model.path` a checkpoint folder of another run) is a
new run, step 0, fresh optimizer, whose first history line, row and event (change "branch")
name its source. A run's end is FINISHED, written last, so a plain resume of it does nothing.
Torch-free: checkpoints are read here from their JSON files only.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.configs import Config, apply_override, dump_config, read_yaml, validate
from posttrain.configs.resume import Change, check_resume
from posttrain.errors import ConfigError, TrainerError
from posttrain.rundir import RunDir

Verify = Callable[[Path], object]
"""Raises TrainerError naming the damage of a checkpoint folder (trainer/checkpoint.py
`verify_checkpoint`, passed in by the caller: this module imports no torch)."""

HISTORY = "config_history.jsonl"
_STEP = re.compile(r"^step_(\d+)$")
FINISHED = "finished.json"
"""In a run folder: {"step": S, "steps": N}, written last by a run's end (`loop._finish`, after
eval.json): the run ended at step S under run.steps N (S < N: a stop ended it early)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint folder says of itself (meta.json, loop_state.json), read without torch."""

    path: Path
    step: int
    lora: bool

    @classmethod
    def read(cls, path: str | Path) -> CheckpointInfo:
        p = Path(path)
        try:
            meta = json.loads((p / "meta.json").read_text())
            state = json.loads((p / "loop_state.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{str(p)!r} is not a readable checkpoint folder ({exc})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or not isinstance(state, dict):
            raise ConfigError(f"{str(p)!r}: meta.json or loop_state.json is not a checkpoint record")
        return cls(p, meta["step"], meta.get("weights") == "lora")


def newest_checkpoint(run_dir: str | Path) -> CheckpointInfo | None:
    """The newest checkpoint of `run_dir` (a folder under its final name is complete), or None.
    Its files are checked against its manifest only when the trainer loads it (trainer/checkpoint.py)."""
    folder = Path(run_dir) / "checkpoints"
    found = []
    for p in folder.iterdir() if folder.is_dir() else ():
        m = _STEP.match(p.name)
        if m and (p / "meta.json").is_file():
            found.append((int(m.group(1)), p))
    return CheckpointInfo.read(max(found)[1]) if found else None


# ---------------------------------------------------------------- resume and extend


def resume_config(run_dir: str | Path, cfg: Config | None) -> tuple[RunDir, Config, list[Change]]:
    """The run at `run_dir`, the config it goes on with and what changed: its own config.yaml
    when `cfg` is None, else `cfg` once every field that differs is one a resume may change
    (configs/resume.py; one ConfigError naming the others)."""
    rundir, own = RunDir.open(run_dir)
    if cfg is None:
        return rundir, own, []
    return rundir, cfg, check_resume(own, cfg, str(run_dir))


def resume_overrides(run_dir: str | Path, config: str | None, overrides: list[str]) -> Config | None:
    """The config a `--resume` command line asks for: `config` (a YAML file, as the run was
    started) with `overrides`, or the run's own config.yaml with `overrides`; None when the
    command line gives neither (the run goes on as it is)."""
    if config:
        tree = read_yaml(config)
    elif overrides:
        rundir, _ = RunDir.open(run_dir)
        tree = read_yaml(rundir.config_path)
    else:
        return None
    for item in overrides:
        apply_override(tree, item)
    return validate(tree, str(config or f"{run_dir}/config.yaml"))


def finished(run_dir: str | Path, cfg: Config, changed: list[Change], verify: Verify) -> str:
    """Why resuming the run does nothing ('' when it trains on). The run finished (its FINISHED
    record names its newest checkpoint's step, and `verify` finds that checkpoint intact) and
    run.steps is not above the run.steps it finished under: with nothing changed, the run is
    left as it is; a run that reached its run.steps, asked for other changes alone, is a
    ConfigError saying that these train nothing. A run a stop ended early trains on with any
    change. A run killed after its final checkpoint but before its end was recorded, or whose
    final checkpoint is damaged, is not finished: its resume goes on as a resume does (the final
    evaluation again; the previous intact checkpoint, said in one line)."""
    end, ckpt = _finished(run_dir), _readable_newest(run_dir)
    if ckpt is None or end is None or end[0] != ckpt.step or cfg.run.steps > end[1] or not _intact(ckpt, verify):
        return ""
    more = f"give run.steps=N with N above {end[1]} to train more"
    if not changed:
        return f"{run_dir} finished at step {ckpt.step}: nothing to do ({more}; the run is left as it is)"
    if ckpt.step >= end[1]:
        fields = ", ".join(c.field for c in changed)
        raise ConfigError(
            f"run.steps: {run_dir} finished at step {ckpt.step}; changing {fields} alone trains nothing: {more}"
        )
    return ""


def mark_finished(rundir: RunDir, step: int, steps: int) -> None:
    """Record that the run ended at `step` under run.steps `steps` (FINISHED, written atomically)."""
    tmp = rundir.path / (FINISHED + ".tmp")
    tmp.write_text(json.dumps({"step": step, "steps": steps}))
    tmp.replace(rundir.path / FINISHED)


def _finished(run_dir: str | Path) -> tuple[int, int] | None:
    """(step, steps) of the run's FINISHED record, or None without a readable one."""
    try:
        end = json.loads((Path(run_dir) / FINISHED).read_text())
        return int(end["step"]), int(end["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def finished_resume(run_dir: str | Path, cfg: Config | None, verify: Verify) -> str:
    """`finished` for a resume of `run_dir` with `cfg` (None: its own config), after the changes
    are checked and run.steps against the newest checkpoint when that one is intact (else the
    loop checks it against the checkpoint it loads: `check_length`)."""
    _, cfg, changed = resume_config(run_dir, cfg)
    ckpt = _readable_newest(run_dir)
    if ckpt is not None and cfg.run.steps < ckpt.step and _intact(ckpt, verify):
        check_length(cfg, ckpt.step, run_dir)
    return finished(run_dir, cfg, changed, verify)


def _readable_newest(run_dir: str | Path) -> CheckpointInfo | None:
    """`newest_checkpoint`, or None when its meta.json or loop_state.json is unreadable (damaged)."""
    try:
        return newest_checkpoint(run_dir)
    except (ConfigError, RecursionError):
        return None


def _intact(ckpt: CheckpointInfo, verify: Verify) -> bool:
    try:
        verify(ckpt.path)
    except TrainerError:
        return False
    return True


def check_length(cfg: Config, step: int, run: str | Path) -> None:
    """A resumed run's run.steps may not fall below the step its checkpoint holds."""
    if cfg.run.steps < step:
        raise ConfigError(
            f"run.steps: {cfg.run.steps} is below step {step}, which {run}'s newest checkpoint holds "
            "(a run is not shortened)"
        )


def record_resume(
    rundir: RunDir, cfg: Config, changed: list[Change], step: int, events: Any, metrics: Any, log: Any
) -> None:
    """After a resume from the checkpoint of `step` (its trace and metrics rolled back): each
    history line from that step on gets its `config_change` row and event again (the rollback
    cut them), then `changed`, when any, is written down (config.yaml, a history line, a row and
    an event, and one line to `log`). `events`: the run's trace store; `metrics`: its metrics log."""
    for entry in read_history(rundir.path):
        if entry.get("kind") == "resume" and entry.get("step", -1) >= step:
            _emit(entry, events, metrics)
    if not changed:
        return
    entry = {"kind": "resume", "step": step, "time": time.time(), "changes": [c.to_json() for c in changed]}
    rundir.config_path.write_text(dump_config(cfg))
    _append(rundir.path, entry)
    _emit(entry, events, metrics)
    log(f"{rundir.path}: {describe(entry)}")


def describe(entry: dict[str, Any]) -> str:
    """One line for a history entry: `resumed at step 4 with run.steps 4 -> 8, trainer.lr ...`."""
    if entry.get("kind") == "branch":
        return f"branched from {entry['from']} (step {entry['source_step']} of {entry['source_run']})"
    moves = ", ".join(f"{c['field']} {c['from']!r} -> {c['to']!r}" for c in entry.get("changes", []))
    return f"resumed at step {entry['step']} with {moves}"


def _emit(entry: dict[str, Any], events: Any, metrics: Any) -> None:
    data = {("change" if k == "kind" else k): v for k, v in entry.items() if k not in ("time", "step")}
    metrics.write("config_change", entry["step"], **data)
    events.add_event("config_change", describe(entry), step=entry["step"], data=data)


def _append(run_dir: Path, entry: dict[str, Any]) -> None:
    with open(run_dir / HISTORY, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's history lines, oldest first ([] when it has none; an unreadable line is skipped)."""
    path = Path(run_dir) / HISTORY
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


# ---------------------------------------------------------------- branch


def source_checkpoint(path: str | Path) -> CheckpointInfo:
    """The checkpoint `--from` names: a checkpoint folder, or a run folder's newest checkpoint;
    a ConfigError when it is neither, or holds only a LoRA adapter."""
    p = Path(path)
    if (p / "meta.json").is_file():
        ckpt = CheckpointInfo.read(p)
    elif (p / "config.yaml").is_file():
        found = newest_checkpoint(p)
        if found is None:
            raise ConfigError(f"--from {path}: the run has no complete checkpoint")
        ckpt = found
    else:
        raise ConfigError(
            f"--from {path}: neither a checkpoint folder (RUN/checkpoints/step_N) nor a run folder{_held_beside(p)}"
        )
    if ckpt.lora:
        raise ConfigError(
            f"--from {ckpt.path}: the checkpoint holds only a LoRA adapter; export merged weights first "
            "(posttrain export RUN --out DIR) and start from them with model.path=DIR"
        )
    return ckpt


def _held_beside(p: Path) -> str:
    """For a path inside a run's checkpoints folder that is no checkpoint (one pruned, or a step
    never saved): the checkpoints that folder holds, as a clause of the error; else ""."""
    folder = p.parent
    if folder.name != "checkpoints" or not folder.is_dir():
        return ""
    held = sorted(c.name for c in folder.iterdir() if (c / "meta.json").is_file())
    return (
        f"; {folder} holds {', '.join(held) or 'no checkpoint'} (every run.checkpoint_every steps, "
        "the newest trainer.keep_checkpoints kept)"
    )


def branch_config(source: str | Path, config: str | None, overrides: list[str]) -> Config:
    """The config of a run started from the checkpoint `source` names: `config` with `overrides`,
    or, without `config`, the source run's config.yaml with a fresh run.name, no
    eval.before_from (it named the source's start) and `overrides`; its model.path is the
    checkpoint (absolute). model.path set by the command line as well is a
    ConfigError (two starting points)."""
    ckpt = source_checkpoint(source)
    if config:
        tree = read_yaml(config)
    else:
        tree = read_yaml(ckpt.path.parent.parent / "config.yaml")
        tree.get("model", {}).pop("path", None)  # where the source run started: the checkpoint replaces it
        tree.get("run", {}).pop("name", None)
        tree.get("eval", {}).pop("before_from", None)  # the source's start's table, not this checkpoint's
    for item in overrides:
        apply_override(tree, item)
    if tree.get("model", {}).get("path"):
        raise ConfigError(f"model.path and --from both name a starting model; give one (--from {source})")
    tree.setdefault("model", {})["path"] = str(ckpt.path.resolve())
    return validate(tree, str(config or f"--from {source}"))


def record_branch(rundir: RunDir, cfg: Config, events: Any, metrics: Any, log: Any) -> None:
    """A fresh run whose model.path is a checkpoint folder of a run (`train` or `sft`): its first
    history line, a `config_change` row and event of kind branch, at step 0. Nothing for any
    other model.path."""
    if not cfg.model.path or not (Path(cfg.model.path) / "meta.json").is_file():
        return
    try:
        ckpt = CheckpointInfo.read(cfg.model.path)
    except (ConfigError, RecursionError):  # not a checkpoint record after all: the model loaded, no lineage
        return
    entry = {
        "kind": "branch",
        "step": 0,
        "time": time.time(),
        "from": str(ckpt.path),
        "source_run": str(ckpt.path.parent.parent),
        "source_step": ckpt.step,
    }
    _append(rundir.path, entry)
    _emit(entry, events, metrics)
    log(f"{rundir.path}: {describe(entry)}")
