"""geo_*: 3D modelling. The model writes a short Python script (manifold3d,
trimesh, numpy) that builds a solid and writes it to `out.stl`, `out.obj` or
`out.npz` (arrays `vertices` n x 3 and `faces` m x 3); the execute step
(`MeshVerifier.execute`, run by the pipeline's execute stage) runs the script
in the sandbox and measures the mesh it wrote (a GeoRun: the constraint
report), and the verifier checks that report against the task's
constraints with manifold3d and trimesh: watertight (a valid manifold),
volume, bounding box, number of parts, genus (through-holes) and the
clearance between parts. Never by string matching.

Invariant: model code runs only in `posttrain.sandbox` (no network, limits
enforced); this process only parses the returned mesh file as data (binary
or ASCII STL/OBJ through trimesh, npz with allow_pickle=False). A sandbox
infra_error raises SandboxError (never a score); a script that fails, times
out or writes no mesh scores 0. Value is the share of constraints met, gated
by watertightness (declared partial credit); `passed` needs all of them.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.domains._common import ANSWER_INSTRUCTION, run_summary
from posttrain.domains.base import Budget, ProceduralDomain, extract_answer
from posttrain.domains.registry import register
from posttrain.errors import SandboxError
from posttrain.types import Episode, Score, StepResult, Task

OUTPUTS = ("out.stl", "out.obj", "out.npz")
MAX_FACES = 500_000
WALL_S = 30.0
HEADER = (
    "Write a Python script that builds the solid described below and writes it to out.stl "
    "(or out.npz with arrays `vertices` and `faces`). manifold3d, trimesh and numpy are available; "
    "units are millimetres; there is no network. Give the script in a ```python block.\n\n"
)
FEEDBACK = (
    "Each script you send is run and you get its constraint report (watertight, volume, bounding box, "
    "parts, through-holes); adjust the script and send it again until every constraint holds."
)
SAVE_NPZ = (
    "mesh = shape.to_mesh()\n"
    "np.savez('out.npz', vertices=np.asarray(mesh.vert_properties)[:, :3], faces=np.asarray(mesh.tri_verts))\n"
)


def script(body: str) -> str:
    return "import numpy as np\nfrom manifold3d import Manifold\n\n" + body.strip() + "\n" + SAVE_NPZ


def extract_script(text: str) -> str:
    import re

    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else extract_answer(text)


# ---- shapes: (rng, difficulty) -> (description, gold body, checks) ------------------
# checks: volume (mm^3) with relative tolerance, bbox extents with absolute
# tolerance, parts, genus, clearance (min gap between parts).

Shape = Callable[[random.Random, int], tuple[str, str, dict[str, Any]]]
SEG = 64  # circle segments in gold scripts; volume tolerances allow coarser ones


def _dim(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def _cyl_vol(r: float, h: float) -> float:
    return math.pi * r * r * h


def box(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    x, y, z = _dim(rng, 5, 20 * d), _dim(rng, 5, 20 * d), _dim(rng, 2, 10 * d)
    return (
        f"A solid rectangular block {x} x {y} x {z} mm.",
        f"shape = Manifold.cube([{x}, {y}, {z}])",
        {"volume": x * y * z, "vol_tol": 0.01, "bbox": [x, y, z], "parts": 1, "genus": 0},
    )


def cylinder(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    r, h = _dim(rng, 2, 8 * d), _dim(rng, 3, 25 * d)
    return (
        f"A solid cylinder of radius {r} mm and height {h} mm, axis along z.",
        f"shape = Manifold.cylinder({h}, {r}, {r}, {SEG})",
        {"volume": _cyl_vol(r, h), "vol_tol": 0.03, "bbox": [2 * r, 2 * r, h], "parts": 1, "genus": 0},
    )


def sphere(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    r = _dim(rng, 4, 80 * d) / 2
    return (
        f"A solid sphere of radius {r} mm.",
        f"shape = Manifold.sphere({r}, {SEG})",
        {"volume": 4 / 3 * math.pi * r**3, "vol_tol": 0.04, "bbox": [2 * r] * 3, "parts": 1, "genus": 0},
    )


def box_hole(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    x, y, z = _dim(rng, 12, 20 * d + 10), _dim(rng, 12, 20 * d + 10), _dim(rng, 3, 8 * d)
    r = _dim(rng, 2, min(x, y) // 2 - 2)
    body = (
        f"shape = Manifold.cube([{x}, {y}, {z}]) - "
        f"Manifold.cylinder({z + 2}, {r}, {r}, {SEG}).translate([{x / 2}, {y / 2}, -1])"
    )
    return (
        f"A block {x} x {y} x {z} mm with one round through-hole of radius {r} mm along z, centred in the {x} x {y} "
        "face.",
        body,
        {"volume": x * y * z - _cyl_vol(r, z), "vol_tol": 0.02, "bbox": [x, y, z], "parts": 1, "genus": 1},
    )


def tube(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    ro, h = _dim(rng, 5, 8 * d + 4), _dim(rng, 4, 15 * d)
    ri = _dim(rng, 2, ro - 2)
    body = (
        f"shape = Manifold.cylinder({h}, {ro}, {ro}, {SEG}) - Manifold.cylinder({h + 2}, {ri}, {ri}, "
        f"{SEG}).translate([0, 0, -1])"
    )
    return (
        f"A tube (hollow cylinder) of outer radius {ro} mm, inner radius {ri} mm and height {h} mm, axis along z.",
        body,
        {
            "volume": _cyl_vol(ro, h) - _cyl_vol(ri, h),
            "vol_tol": 0.03,
            "bbox": [2 * ro, 2 * ro, h],
            "parts": 1,
            "genus": 1,
        },
    )


def plate_holes(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    n = 1 + d
    pitch, t, r = _dim(rng, 8, 14), _dim(rng, 2, 5), _dim(rng, 1, 3)
    x, y = pitch * (n + 1), _dim(rng, 2 * r + 6, 20)
    holes = " + ".join(
        f"Manifold.cylinder({t + 2}, {r}, {r}, {SEG}).translate([{pitch * (i + 1)}, {y / 2}, -1])" for i in range(n)
    )
    return (
        f"A plate {x} x {y} x {t} mm with {n} round through-holes of radius {r} mm along z, centred on the plate's "
        f"long mid-line at x = {', '.join(str(pitch * (i + 1)) for i in range(n))} mm (plate corner at the origin).",
        f"shape = Manifold.cube([{x}, {y}, {t}]) - ({holes})",
        {"volume": x * y * t - n * _cyl_vol(r, t), "vol_tol": 0.02, "bbox": [x, y, t], "parts": 1, "genus": n},
    )


def two_blocks(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    a, b, h, gap = _dim(rng, 4, 10 * d), _dim(rng, 4, 10 * d), _dim(rng, 3, 8), _dim(rng, 2, 4 + 2 * d)
    body = f"shape = Manifold.cube([{a}, {a}, {h}]) + Manifold.cube([{b}, {b}, {h}]).translate([{a + gap}, 0, 0])"
    return (
        f"Two separate cubes-based blocks side by side along x, both {h} mm tall: the first {a} x {a} mm, the second "
        f"{b} x {b} mm, with a clearance of exactly {gap} mm between them, both starting at y = 0.",
        body,
        {
            "volume": (a * a + b * b) * h,
            "vol_tol": 0.01,
            "bbox": [a + gap + b, max(a, b), h],
            "parts": 2,
            "genus": 0,
            "clearance": gap,
        },
    )


def l_bracket(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    L, W, T, H = _dim(rng, 20, 20 + 20 * d), _dim(rng, 8, 20), _dim(rng, 2, 5), _dim(rng, 10, 10 + 15 * d)
    body = f"shape = Manifold.cube([{L}, {W}, {T}]) + Manifold.cube([{T}, {W}, {H}])"
    return (
        f"An L-shaped bracket: a base plate {L} x {W} x {T} mm and an upright plate {T} x {W} x {H} mm rising from "
        f"the base's x = 0 edge, joined into one solid {H} mm tall.",
        body,
        {"volume": L * W * T + T * W * (H - T), "vol_tol": 0.01, "bbox": [L, W, H], "parts": 1, "genus": 0},
    )


def frame(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    X, Y, w, t = _dim(rng, 20, 20 + 15 * d), _dim(rng, 20, 20 + 15 * d), _dim(rng, 2, 6), _dim(rng, 2, 6)
    body = (
        f"shape = Manifold.cube([{X}, {Y}, {t}]) - Manifold.cube([{X - 2 * w}, {Y - 2 * w}, {t + 2}]).translate([{w}, "
        f"{w}, -1])"
    )
    return (
        f"A rectangular picture frame: outer size {X} x {Y} mm, border width {w} mm, thickness {t} mm.",
        body,
        {"volume": (X * Y - (X - 2 * w) * (Y - 2 * w)) * t, "vol_tol": 0.01, "bbox": [X, Y, t], "parts": 1, "genus": 1},
    )


def stacked(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    s, h1, r, h2 = _dim(rng, 10, 10 + 10 * d), _dim(rng, 3, 10), 0, _dim(rng, 3, 12)
    r = _dim(rng, 2, s // 2 - 1)
    body = (
        f"shape = Manifold.cube([{s}, {s}, {h1}]) + Manifold.cylinder({h2}, {r}, {r}, {SEG}).translate([{s / 2}, "
        f"{s / 2}, {h1}])"
    )
    return (
        f"A square base {s} x {s} x {h1} mm with a cylinder of radius {r} mm and height {h2} mm standing on the centre "
        f"of its top face, as one solid.",
        body,
        {"volume": s * s * h1 + _cyl_vol(r, h2), "vol_tol": 0.02, "bbox": [s, s, h1 + h2], "parts": 1, "genus": 0},
    )


def pegs(rng: random.Random, d: int) -> tuple[str, str, dict[str, Any]]:
    n, r, h, gap = 1 + d, _dim(rng, 1, 3), _dim(rng, 4, 30), _dim(rng, 2, 6)
    pitch = 2 * r + gap
    body = "shape = " + " + ".join(
        f"Manifold.cylinder({h}, {r}, {r}, {SEG}).translate([{i * pitch}, 0, 0])" for i in range(n)
    )
    return (
        f"A row of {n} separate upright pins (cylinders of radius {r} mm, height {h} mm, axes along z) along x, "
        f"with a clearance of {gap} mm between neighbouring pins.",
        body,
        {
            "volume": n * _cyl_vol(r, h),
            "vol_tol": 0.03,
            "bbox": [(n - 1) * pitch + 2 * r, 2 * r, h],
            "parts": n,
            "genus": 0,
            "clearance": gap,
        },
    )


SHAPES: dict[str, tuple[Shape, str]] = {
    "box": (box, "a rectangular block"),
    "cylinder": (cylinder, "a cylinder"),
    "sphere": (sphere, "a sphere"),
    "box_hole": (box_hole, "a block with a through-hole (genus 1)"),
    "tube": (tube, "a hollow cylinder"),
    "plate_holes": (plate_holes, "a plate with several holes"),
    "two_blocks": (two_blocks, "two parts with a clearance"),
    "l_bracket": (l_bracket, "an L bracket (union)"),
    "frame": (frame, "a frame (box minus box)"),
    "stacked": (stacked, "a cylinder on a base (union)"),
    "pegs": (pegs, "a row of separate pins with clearances"),
}


# ---- the verifier ---------------------------------------------------------------------


def load_mesh(files: dict[str, bytes]) -> tuple[Any, Any] | None:
    """(vertices n x 3, faces m x 3) from the first output file present, or None."""
    import numpy as np

    for name in OUTPUTS:
        data = files.get(name)
        if not data:
            continue
        try:
            if name.endswith(".npz"):
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    v, f = np.asarray(z["vertices"], dtype=np.float64), np.asarray(z["faces"], dtype=np.int64)
            else:
                import trimesh

                mesh = trimesh.load(io.BytesIO(data), file_type=name.rsplit(".", 1)[1], force="mesh", process=True)
                v, f = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int64)
        except Exception:  # noqa: BLE001 - an unreadable file is the model's failure
            return None
        if v.ndim != 2 or v.shape[1] != 3 or f.ndim != 2 or f.shape[1] != 3 or not len(f) or len(f) > MAX_FACES:
            return None
        if f.min() < 0 or f.max() >= len(v) or not np.isfinite(v).all():
            return None
        return v, f
    return None


def measure(v: Any, f: Any) -> dict[str, Any]:
    """Watertightness, volume, extents, parts, genus and min gap between parts."""
    import numpy as np
    import trimesh
    from manifold3d import Error, Manifold, Mesh

    tm = trimesh.Trimesh(vertices=v, faces=f, process=True)
    mesh = Mesh(
        vert_properties=np.asarray(tm.vertices, dtype=np.float32), tri_verts=np.asarray(tm.faces, dtype=np.uint32)
    )
    solid = Manifold(mesh)
    manifold_ok = solid.status() == Error.NoError and not solid.is_empty()
    out = {"watertight": bool(tm.is_watertight and manifold_ok), "extents": [float(x) for x in tm.extents]}
    if not out["watertight"]:
        return out
    parts = solid.decompose()
    out.update(volume=float(solid.volume()), parts=len(parts), genus=int(sum(p.genus() for p in parts)))
    if len(parts) > 1:
        gaps = [parts[i].min_gap(parts[j], 1000.0) for i in range(len(parts)) for j in range(i + 1, len(parts))]
        out["clearance"] = float(min(gaps))
    return out


def check(checks: dict[str, Any], m: dict[str, Any]) -> dict[str, float]:
    results = {"watertight": float(m["watertight"])}
    if not m["watertight"]:
        return results
    results["volume"] = float(abs(m["volume"] - checks["volume"]) <= checks["vol_tol"] * checks["volume"])
    results["bbox"] = float(
        all(abs(a - b) <= 0.05 * max(b, 1) + 0.1 for a, b in zip(sorted(m["extents"]), sorted(checks["bbox"])))
    )
    results["parts"] = float(m["parts"] == checks["parts"])
    results["genus"] = float(m["genus"] == checks["genus"])
    if "clearance" in checks:
        results["clearance"] = float(
            abs(m.get("clearance", 0.0) - checks["clearance"]) <= 0.05 * checks["clearance"] + 0.05
        )
    return results


@dataclass(frozen=True)
class GeoRun:
    """The execute step's result: how the script ran and the constraint report of
    the mesh it wrote (`measures`: watertight, extents, volume, parts, genus,
    clearance), measured on the host from the returned file as data; None with
    `note` when the script failed or wrote no readable mesh."""

    status: str  # the sandbox status of the script (ok, failed, timeout, oom, killed)
    exit_code: int | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    stderr: str = ""  # the script's stderr, its last STDERR_CHARS characters
    measures: dict[str, Any] | None = None
    note: str = ""
    program: str = ""  # the script that ran, truncated to PROGRAM_CHARS

    def summary(self) -> dict[str, Any]:
        return run_summary(self, report=self.measures, note=self.note)


PROGRAM_CHARS = 4000
STDERR_CHARS = 2000


def run_script(source: str, run: Callable[[Any], Any] | None = None) -> GeoRun:
    """Run a mesh script in the sandbox and measure what it wrote; SandboxError on an infra error."""
    from posttrain import sandbox

    req = sandbox.ExecRequest(
        files={"main.py": source},
        python_main="main.py",
        collect=OUTPUTS,
        limits=sandbox.Limits(wall_s=WALL_S, cpu_s=WALL_S, memory_bytes=1024 << 20),
    )
    result = run(req) if run else sandbox.run(req)
    if result.status == "infra_error":
        raise SandboxError(f"geo sandbox run failed: {result.error}")
    stderr = result.stderr.decode("utf-8", "replace")[-STDERR_CHARS:]
    base = dict(
        status=result.status,
        exit_code=result.exit_code,
        cpu_s=result.cpu_s,
        wall_s=result.wall_s,
        stderr=stderr,
        program=source[:PROGRAM_CHARS],
    )
    if not result.ok:
        return GeoRun(**base, note=f"script {result.status}")
    mesh = load_mesh(dict(result.files))
    if mesh is None:
        return GeoRun(**base, note=f"no readable mesh in {', '.join(OUTPUTS)}")
    return GeoRun(**base, measures=measure(*mesh))


NOTHING_MET = {"outcome": 0.0, "process": 0.0, "efficiency": 0.0}


def report(checks: dict[str, Any], m: dict[str, Any], results: dict[str, float]) -> str:
    """The constraint report the model reads after a run: each measure, its target
    (the task's stated constraints) and ok / FAIL."""
    mark = {1.0: "ok", 0.0: "FAIL"}
    if not m["watertight"]:
        return (
            "watertight: no (not a closed, valid manifold): FAIL; volume, parts and holes need a "
            "watertight mesh; bounding box " + " x ".join(f"{x:.2f}" for x in m["extents"]) + " mm"
        )
    lines = [
        "watertight: yes",
        f"volume: {m['volume']:.2f} mm^3 (target {checks['volume']:.2f} +- {checks['vol_tol']:.0%}): "
        f"{mark[results['volume']]}",
        "bounding box: "
        + " x ".join(f"{x:.2f}" for x in m["extents"])
        + " mm (target "
        + " x ".join(f"{x:g}" for x in checks["bbox"])
        + f", any order): {mark[results['bbox']]}",
        f"parts: {m['parts']} (target {checks['parts']}): {mark[results['parts']]}",
        f"through-holes (genus): {m['genus']} (target {checks['genus']}): {mark[results['genus']]}",
    ]
    if "clearance" in checks:
        lines.append(
            f"clearance between parts: {m.get('clearance', 0.0):.2f} mm (target {checks['clearance']:g}): "
            f"{mark[results['clearance']]}"
        )
    return "\n".join(lines)


class GeoEnv:
    """Build, read the constraint report, adjust (the Environment contract): each
    action is a script; `step` runs it in the sandbox (SandboxError on an infra
    failure) and answers with the report of the mesh it wrote (or why there is
    none); the episode is done when every constraint holds. Turn parts:
    {"process": the share of constraints met}; the turn's exec_result is the GeoRun.
    The reward is not decided here: the pipeline's execute step runs the last
    script again and the verifier checks that mesh."""

    def __init__(self) -> None:
        self.checks: dict[str, Any] = {}

    def reset(self, task: Task) -> str:
        self.checks = task.reference["checks"]
        return ""  # the solid's description is in the prompt

    def step(self, action: str) -> StepResult:
        source = extract_script(action)
        if not source.strip():
            return StepResult("no script: send the script in a ```python block", False, {"process": 0.0})
        run = run_script(source)
        if run.measures is None:
            code = f" (exit code {run.exit_code})" if run.exit_code not in (None, 0) else ""
            tail = f"\n{run.stderr[-600:]}" if run.stderr.strip() else ""
            return StepResult(f"{run.note}{code}{tail}", False, {"process": 0.0}, run)
        results = check(self.checks, run.measures)
        share = sum(results.values()) / len(results) if results["watertight"] else 0.0
        return StepResult(report(self.checks, run.measures, results), all(results.values()), {"process": share}, run)

    def close(self) -> None:
        self.checks = {}


class MeshVerifier:
    """The share of the task's constraints the mesh meets. `execute` runs the
    script in the sandbox (the pipeline's execute stage calls it); `score`
    reads the GeoRun in Episode.exec_result and makes no sandbox call (a direct
    `score` without one runs the script itself)."""

    name = "mesh_constraints"
    version = "1"

    def execute(self, task: Task, completion: str, run: Callable[[Any], Any] | None = None) -> GeoRun | None:
        source = extract_script(completion)
        return run_script(source, run) if source.strip() else None

    def score(self, task: Task, episode: Episode) -> Score:
        got = episode.exec_result
        if not isinstance(got, GeoRun):
            got = self.execute(task, episode.completion)
        if got is None:
            return Score(0.0, dict(NOTHING_MET), False, "no script")
        if got.measures is None:
            reason = f"{got.note}: {got.stderr[-300:]}" if got.status != "ok" else got.note
            return Score(0.0, dict(NOTHING_MET), False, reason)
        results = check(task.reference["checks"], got.measures)
        passed = all(results.values())
        value = sum(results.values()) / len(results) if results["watertight"] else 0.0
        failed = [k for k, v in results.items() if not v]
        loop = {"process": value, "efficiency": float(passed) / max(1, len(episode.turns))}
        return Score(
            value,
            {"outcome": float(passed), **loop, **results},
            passed,
            "" if passed else "failed: " + ", ".join(failed),
        )


class GeoDomain(ProceduralDomain):
    """One shape family, multi-turn: build, read the constraint report, adjust (GeoEnv)."""

    category = "geometry3d"
    version = "3"
    levels = 3
    cost_class = "long"
    budget = Budget(turns=3, tokens=512, seconds=60.0)
    partial_credit = True

    def __init__(self, shape: str) -> None:
        self.name = f"geo_{shape}"
        self.shape, self.description = SHAPES[shape]
        self.verifier = MeshVerifier()

    def environment(self) -> type[GeoEnv]:
        return GeoEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the gold script, every constraint met at the first run."""
        return [self.gold(task)]

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:
        text, body, checks = self.shape(rng, difficulty)
        return HEADER + text + "\n" + FEEDBACK + "\n" + ANSWER_INSTRUCTION.replace("final answer", "script"), {
            "script": script(body),
            "checks": checks,
        }

    def gold(self, task: Task) -> str:
        return f"```python\n{task.reference['script']}```"

    def wrong(self, task: Task) -> str:
        scaled = task.reference["script"].replace(SAVE_NPZ, "shape = shape.scale([1.25, 1.25, 1.25])\n" + SAVE_NPZ)
        return f"```python\n{scaled}```"

    def cheats(self, task: Task) -> list[str]:
        """No script, a script that writes nothing, or prints the target numbers: never accepted."""
        c = task.reference["checks"]
        return ["", "```python\nprint('done')\n```", f"```python\nprint({c['volume']!r}, {c['bbox']!r})\n```"]


for _shape in SHAPES:
    register(GeoDomain(_shape))
