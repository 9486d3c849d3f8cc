"""geo_fix: the 3D family's learnable feedback tier, with an honest stop.

The prompt states a part's size as a compact spec, `box:W,D,H;fit_slot` (mm along
x, y, z), and asks for a part that fits a slot. The slot's real extents are hidden
in the task's reference: on about 1/3 of the tasks they equal the spec ("exact"),
on about 5/12 they differ from it in one dimension ("stale"), and on about 1/4 the
slot is below the part's minimum wall in one dimension ("infeasible": no box meets
both). An action is one line: `box:W,D,H` (a build) or `stop`. A build is turned
into the family's script (a fixed template, `geo3d.script`), its mesh measured by
the family's `geo3d.measure` and checked by `geo3d.check` (watertight, volume,
bounding box, parts, genus, shape match) plus two oriented checks of this tier:
`slot` (each axis extent equals the slot's, 0.1 mm) and `min_wall` (each axis at
least the part's minimum). The constraint report the model reads is compact: `ok`,
or one item per failing axis, `d:31>25` (measured 31 mm, slot 25), with `,min:28`
when the slot is below the part's minimum wall in that axis, or `d:25<min:28`.
So the first attempt (the spec) is right on the exact tasks only; the report names
the deviation and the gold revision uses it (`box:W,25,H`), or stops when the report
says the slot is below the minimum.

Where builds run: the spec is three parsed integers, never model code, so the
environment builds the template's solid on the host (`host_run`: the Manifold the
template script builds, measured by the family's `measure`), about 1.5 ms a step
against about 100 ms for the sandbox's start-up, and the verifier checks the mesh
the episode's last turn measured. So the pretraining corpus plays tens of thousands
of transcripts, and an RL step of 256 episodes does not spend half a minute in the
sandbox. `SandboxedGeoFixVerifier` is the family's way (the execute step runs the
template script in the sandbox, `geo3d.run_script`); a test checks both measure the
same and score the same.

Reward contract (every score carries parts `stopped` and `infeasible`, 0/1):
- a final build that meets every check: value 0.8 + 0.2 x efficiency (turns the task
  needs / turns used), passed;
- anything else on a feasible task: 0 (reason); `stop` there: 0, parts stopped=1,
  infeasible=0, reason "stopped on a feasible task";
- on an infeasible task, `stop` after at least one build: value 0.5, passed, parts
  stopped=1, infeasible=1; anything else: 0 (reason). `stop` before any build scores
  0 on every task ("stopped before any build"): infeasibility is revealed by the
  report only, so stopping at turn 1 is a losing strategy.
A malformed action is observed (`error:say_box:w,d,h_or_stop`) and the episode goes
on to the turn budget. One completion holding the actions one per line is replayed
the same way (the replay ends at the first build that meets every check, or at a stop).

Invariant: the verdict is decided from the task's reference, the model's own actions
and the measured mesh only, never from an observation's text.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from posttrain.domains.base import Budget, ProceduralDomain, actions_of
from posttrain.domains.geo3d import GeoRun, _cube, build, check, measure, run_script, script, solid_code
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, StepResult, Task

AXES = "wdh"
"""The spec's dimensions, along x, y and z."""
DIMS = {1: (10, 99), 2: (100, 999)}
"""Range of every dimension (mm) at each level."""
SHIFT = {1: (2, 9), 2: (5, 60)}
"""How far a stale or infeasible slot is from the spec in its one dimension (mm)."""
KINDS = (("exact", 4), ("stale", 5), ("infeasible", 3))
"""Task kinds and their weights out of 12: 1/3 exact, 5/12 stale, 1/4 infeasible."""
TOL = 0.1
"""Absolute tolerance (mm) of the oriented slot and min-wall checks and of the report."""
MAX_DIM = 999
STOP_VALUE = 0.5
BAD_ACTION = "error:say_box:w,d,h_or_stop"
HOST_NOTE = "host build of the template"
_BOX = re.compile(r"box:(\d{1,3}),(\d{1,3}),(\d{1,3})")


@dataclass(frozen=True)
class Action:
    """One parsed action: `box` (with dims), `stop`, or `bad`."""

    kind: str
    dims: tuple[int, int, int] = (0, 0, 0)


def parse_action(text: str) -> Action:
    """The first non-empty line: `box:W,D,H` (1..999 each) or `stop`; anything else is `bad`."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if line == "stop":
        return Action("stop")
    if m := _BOX.fullmatch(line):
        dims = tuple(int(g) for g in m.groups())
        if all(1 <= d <= MAX_DIM for d in dims):
            return Action("box", dims)  # type: ignore[arg-type]
    return Action("bad")


def spec_text(dims: tuple[int, ...] | list[int]) -> str:
    return "box:" + ",".join(str(d) for d in dims)


def box_script(dims: tuple[int, ...] | list[int]) -> str:
    """The family's script for a box of `dims` (the fixed template)."""
    return script("shape = " + solid_code(_cube(*dims)))


def _checks(ref: dict[str, Any]) -> dict[str, Any]:
    """The family's checks for the slot's box: volume, extents, one part, no hole, its shape."""
    t = ref["slot"]
    return {"volume": t[0] * t[1] * t[2], "vol_tol": 0.01, "bbox": list(t), "parts": 1, "genus": 0, "solid": _cube(*t)}


def host_run(dims: tuple[int, ...] | list[int], solid: list[Any] | None) -> GeoRun:
    """The template's solid built on the host from the parsed dims and measured by the family's
    `measure` (what `run_script(box_script(dims))` measures, without the sandbox's start-up)."""
    import numpy as np

    mesh = build(_cube(*dims)).to_mesh()
    v = np.asarray(mesh.vert_properties, dtype=np.float64)[:, :3]
    f = np.asarray(mesh.tri_verts, dtype=np.int64)
    return GeoRun(
        status="ok",
        exit_code=0,
        measures=measure(v, f, solid),
        note=HOST_NOTE,
        program=spec_text(dims),
    )


def results_of(ref: dict[str, Any], m: dict[str, Any]) -> dict[str, float]:
    """The family's checks of the mesh plus the tier's oriented `slot` and `min_wall` checks."""
    out = check(_checks(ref), m)
    e, t, lo = m["extents"], ref["slot"], ref["min"]
    out["slot"] = float(all(abs(a - b) <= TOL for a, b in zip(e, t)))
    out["min_wall"] = float(all(a >= b - TOL for a, b in zip(e, lo)))
    return out


def _num(x: float) -> str:
    return f"{round(x, 1):g}"


def report(ref: dict[str, Any], m: dict[str, Any], results: dict[str, float]) -> str:
    """The compact constraint report: `ok`, or per failing axis `d:31>25` (measured > slot),
    with `,min:28` when the slot is below the part's minimum wall there, or `d:25<min:28`;
    other failed checks by name."""
    if all(results.values()):
        return "ok"
    items = []
    for axis, e, t, lo in zip(AXES, m["extents"], ref["slot"], ref["min"]):
        if abs(e - t) > TOL:
            items.append(f"{axis}:{_num(e)}{'>' if e > t else '<'}{t}" + (f",min:{lo}" if t < lo else ""))
        elif e < lo - TOL:
            items.append(f"{axis}:{_num(e)}<min:{lo}")
    failed = [k for k, v in results.items() if not v and k not in ("slot", "min_wall", "volume", "bbox", "shape")]
    return ";".join(items + failed) or "fail:" + ",".join(k for k, v in results.items() if not v)


class GeoFixEnv:
    """Build, read the compact report, revise or stop. `step` answers a StepResult: a build's
    report (done when every check holds; exec_result the host GeoRun), `stop` (done), or the
    malformed-action observation (not done)."""

    def reset(self, task: Task) -> str:
        self.ref = task.reference
        return ""  # the spec is in the prompt

    def step(self, action: str) -> StepResult:
        act = parse_action(action)
        if act.kind == "bad":
            return StepResult(BAD_ACTION, False, {"process": 0.0})
        if act.kind == "stop":
            return StepResult("", True, {"process": 1.0})
        run = host_run(act.dims, _checks(self.ref)["solid"])
        results = results_of(self.ref, run.measures or {})
        ok = all(results.values())
        return StepResult(report(self.ref, run.measures or {}, results), ok, {"process": float(ok)}, run)

    def close(self) -> None:
        pass


def replay(task: Task, actions: list[str]) -> list[str]:
    """The actions an episode of `actions` would have played: up to a stop, or up to the first
    build that meets every check (host build), within the turn budget."""
    env = GeoFixEnv()
    env.reset(task)
    played = []
    for text in actions[: GeoFix.budget.turns]:
        played.append(text)
        if env.step(text).done:
            break
    return played


class GeoFixVerifier:
    """The reward contract of the module docstring. The final build's mesh is the one its
    episode's last turn measured (the environment's GeoRun: the template's solid, built on the
    host from the parsed dims and measured by the family's `measure`); one completion is
    replayed through the environment the same way. `score` checks that mesh with the family's
    `check` plus `slot` and `min_wall`. `SandboxedGeoFixVerifier` runs the template script in
    the sandbox instead (the family's execute step)."""

    name = "geo_fix_constraints"
    version = "1"

    def final_run(self, task: Task, episode: Episode, last: Action) -> GeoRun:
        """The measured run of the final build `last`: the episode's own when it has one."""
        got = episode.exec_result
        if isinstance(got, GeoRun) and got.measures is not None and got.program == spec_text(last.dims):
            return got
        return host_run(last.dims, _checks(task.reference)["solid"])

    def score(self, task: Task, episode: Episode) -> Score:
        ref = task.reference
        infeasible = float(ref["kind"] == "infeasible")
        played = list(actions_of(episode)) if episode.turns else replay(task, actions_of(episode))
        acts = [parse_action(a) for a in played]
        base = {"stopped": 0.0, "infeasible": infeasible, "outcome": 0.0}
        if not acts:
            return Score(0.0, {**base, "efficiency": 0.0}, False, "no action")
        used = len(acts)
        efficiency = min(1.0, ref["turns"] / used)
        base["efficiency"] = efficiency
        last = acts[-1]
        if last.kind == "stop":
            base["stopped"] = 1.0
            if not any(a.kind == "box" for a in acts[:-1]):
                return Score(0.0, base, False, "stopped before any build")
            if not infeasible:
                return Score(0.0, base, False, "stopped on a feasible task")
            return Score(STOP_VALUE, {**base, "outcome": 1.0}, True)
        if last.kind != "box":
            return Score(0.0, base, False, "no build at the end" if any(a.kind == "box" for a in acts) else "no build")
        got = self.final_run(task, episode, last)
        if got.measures is None:
            return Score(0.0, base, False, got.note or "no mesh")
        results = results_of(ref, got.measures)
        parts = {**base, **results}
        if not all(results.values()):
            failed = ", ".join(k for k, v in results.items() if not v)
            return Score(0.0, parts, False, "infeasible task, not stopped" if infeasible else f"failed: {failed}")
        parts["outcome"] = 1.0
        return Score(0.8 + 0.2 * efficiency, parts, True)


class SandboxedGeoFixVerifier(GeoFixVerifier):
    """The same contract with the family's execute step: `execute` runs the final build's
    template script in the sandbox (the pipeline runs it on the episode's last action) and
    `score` checks that mesh (a direct `score` without one runs it itself). About 100 ms a
    run against about 1.5 ms on the host; the measures are the same (tested)."""

    name = "geo_fix_constraints_sandboxed"

    def execute(self, task: Task, completion: str, run: Any = None) -> GeoRun | None:
        played = replay(task, actions_of(Episode(completion)))
        act = parse_action(played[-1]) if played else Action("bad")
        if act.kind != "box":
            return None
        return run_script(box_script(act.dims), run, _checks(task.reference)["solid"])

    def final_run(self, task: Task, episode: Episode, last: Action) -> GeoRun:
        got = episode.exec_result
        if isinstance(got, GeoRun) and got.note != HOST_NOTE:
            return got  # the execute step's sandbox run
        return run_script(box_script(last.dims), None, _checks(task.reference)["solid"])


class GeoFix(ProceduralDomain):
    name = "geo_fix"
    category = "geometry3d"
    description = "fit a box to a hidden slot from a stale spec: build, read the report, revise or stop"
    levels = 2
    cost_class = "short"
    budget = Budget(turns=3, tokens=16, seconds=30.0)
    partial_credit = True
    verifier = GeoFixVerifier()

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:  # type: ignore[override]
        lo, hi = DIMS[difficulty]
        s_lo, s_hi = SHIFT[difficulty]
        spec = [rng.randint(lo, hi) for _ in AXES]
        kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        slot, mins = list(spec), [1, 1, 1]
        k = rng.randrange(3)
        if kind == "stale":
            down = rng.random() < 0.5 and spec[k] - s_lo >= lo or spec[k] + s_lo > hi
            shift = rng.randint(s_lo, min(s_hi, spec[k] - lo if down else hi - spec[k]))
            slot[k] = spec[k] - shift if down else spec[k] + shift
        elif kind == "infeasible":
            if spec[k] - s_lo < lo:
                spec[k] = lo + s_lo
            slot[k] = spec[k] - rng.randint(s_lo, min(s_hi, spec[k] - lo))
            mins[k] = rng.randint(slot[k] + 1, spec[k])
        ref = {
            "spec": spec,
            "slot": slot,
            "min": mins,
            "kind": kind,
            "axis": AXES[k],
            "turns": 1 if kind == "exact" else 2,
        }
        return f"{spec_text(spec)};fit_slot", ref

    def environment(self) -> type[GeoFixEnv]:
        return GeoFixEnv

    def gold_value(self, task: Task) -> float:
        """What the gold scores: 1.0, or STOP_VALUE on an infeasible task (the honest stop)."""
        return STOP_VALUE if task.reference["kind"] == "infeasible" else 1.0

    def gold_turns(self, task: Task) -> list[str]:
        """Build the spec; on a stale task rebuild with the slot's size the report named; on an
        infeasible task stop."""
        ref = task.reference
        first = spec_text(ref["spec"])
        if ref["kind"] == "exact":
            return [first]
        return [first, "stop" if ref["kind"] == "infeasible" else spec_text(ref["slot"])]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        ref = task.reference
        if ref["kind"] == "exact":
            return spec_text([ref["spec"][0] + 1, *ref["spec"][1:]])
        if ref["kind"] == "infeasible":
            return f"{spec_text(ref['spec'])}\n{spec_text(ref['slot'])}"  # ignores the minimum wall
        return f"{spec_text(ref['spec'])}\n{spec_text(ref['spec'])}"  # ignores the report

    def cheats(self, task: Task) -> list[str]:
        """Completions that try for reward without the loop: stop at once, nothing, the first
        report copied, every dimension set to the one value the report showed, the slot's
        dims in another axis order (meets every family check but not the oriented slot),
        resubmitting the spec (a non-exact task), stopping after one failure (a stale task),
        building past the minimum wall (an infeasible task), and the family's script cheats."""
        ref = task.reference
        spec, slot = ref["spec"], ref["slot"]
        env = GeoFixEnv()
        env.reset(task)
        first_report = env.step(spec_text(spec)).observation
        k = AXES.index(ref["axis"])
        out = ["stop", "", first_report, "```python\nprint('done')\n```"]
        for dims in ([slot[k]] * 3, [slot[1], slot[0], slot[2]], [slot[0], slot[2], slot[1]]):
            if dims != slot:
                out.append(spec_text(dims))
        if ref["kind"] != "exact":
            out.append("\n".join([spec_text(spec)] * 3))
        if ref["kind"] == "stale":
            out.append(f"{spec_text(spec)}\nstop")
        if ref["kind"] == "infeasible":
            out.append(f"{spec_text(spec)}\n{spec_text(slot)}")
        return out


register(GeoFix())
