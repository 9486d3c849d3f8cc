"""geo_*: 3D modelling. The model writes a short Python script (manifold3d,
trimesh, numpy) that builds a solid and writes it to `out.stl`, `out.obj` or
`out.npz` (arrays `vertices` n x 3 and `faces` m x 3); the execute step
(`MeshVerifier.execute`, run by the pipeline's execute stage) runs the script
in the sandbox and measures the mesh it wrote (a GeoRun: the constraint
report), and the verifier checks that report against the task's
constraints with manifold3d and trimesh: watertight (a valid manifold),
volume, bounding box, number of parts, genus (through-holes), the
clearance between parts, and the shape itself: the mesh must lie in the
described solid's tolerance band (`match_shape`), so a different solid that
meets every scalar check still fails. Never by string matching.

Invariant: model code runs only in `posttrain.sandbox` (no network, limits
enforced); this process only parses the returned mesh file as data (binary
or ASCII STL/OBJ through trimesh, npz with allow_pickle=False). A sandbox
infra_error raises SandboxError (never a score); a script that fails, times
out or writes no mesh scores 0. Host work over the mesh is bounded by size
before it starts: MAX_FACES faces and vertices, MAX_PARTS parts for the
pairwise clearance, at most 48 placements of the shape match. Value is the share of constraints met, gated
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
MAX_FACES = 50_000
"""Most faces (and vertices) of a mesh read on the host; a larger one is refused unread."""
MAX_PARTS = 16
"""Most separate parts whose pairwise clearance is measured (MAX_PARTS^2 / 2 gap queries)."""
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


# ---- shapes: (rng, difficulty) -> (description, solid, checks) ------------------------
# A solid is a small CSG tree of JSON lists, the one source of both the gold script
# (`solid_code`) and the host's reference shape (`build`):
#   ["cube", [x, y, z], [tx, ty, tz]]     Manifold.cube([x, y, z]).translate(...)
#   ["cylinder", h, r, [tx, ty, tz]]      Manifold.cylinder(h, r, r, SEG).translate(...)
#   ["sphere", r, [tx, ty, tz]]           Manifold.sphere(r, SEG).translate(...)
#   ["cone", h, r_low, r_high, [t...]]    Manifold.cylinder(h, r_low, r_high, SEG) (proxies only)
#   ["union", [a, b, ...]]                a + b + ...
#   ["difference", a, [b, ...]]           a - (b + ...)
# checks: volume (mm^3) with relative tolerance, bbox extents with absolute
# tolerance, parts, genus, clearance (min gap between parts), and the solid itself.

Solid = list[Any]
Shape = Callable[[random.Random, int], tuple[str, Solid, dict[str, Any]]]
SEG = 64  # circle segments in gold scripts; volume tolerances allow coarser ones
ORIGIN = [0, 0, 0]


def _dim(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def _cyl_vol(r: float, h: float) -> float:
    return math.pi * r * r * h


def _cube(x: float, y: float, z: float, at: list[float] = ORIGIN) -> Solid:
    return ["cube", [x, y, z], list(at)]


def _cyl(h: float, r: float, at: list[float] = ORIGIN) -> Solid:
    return ["cylinder", h, r, list(at)]


def box(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    x, y, z = _dim(rng, 5, 20 * d), _dim(rng, 5, 20 * d), _dim(rng, 2, 10 * d)
    return (
        f"A solid rectangular block {x} x {y} x {z} mm.",
        _cube(x, y, z),
        {"volume": x * y * z, "vol_tol": 0.01, "bbox": [x, y, z], "parts": 1, "genus": 0},
    )


def cylinder(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    r, h = _dim(rng, 2, 8 * d), _dim(rng, 3, 25 * d)
    return (
        f"A solid cylinder of radius {r} mm and height {h} mm, axis along z.",
        _cyl(h, r),
        {"volume": _cyl_vol(r, h), "vol_tol": 0.03, "bbox": [2 * r, 2 * r, h], "parts": 1, "genus": 0},
    )


def sphere(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    r = _dim(rng, 4, 80 * d) / 2
    return (
        f"A solid sphere of radius {r} mm.",
        ["sphere", r, ORIGIN],
        {"volume": 4 / 3 * math.pi * r**3, "vol_tol": 0.04, "bbox": [2 * r] * 3, "parts": 1, "genus": 0},
    )


def box_hole(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    x, y, z = _dim(rng, 12, 20 * d + 10), _dim(rng, 12, 20 * d + 10), _dim(rng, 3, 8 * d)
    r = _dim(rng, 2, min(x, y) // 2 - 2)
    return (
        f"A block {x} x {y} x {z} mm with one round through-hole of radius {r} mm along z, centred in the {x} x {y} "
        "face.",
        ["difference", _cube(x, y, z), [_cyl(z + 2, r, [x / 2, y / 2, -1])]],
        {"volume": x * y * z - _cyl_vol(r, z), "vol_tol": 0.02, "bbox": [x, y, z], "parts": 1, "genus": 1},
    )


def tube(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    ro, h = _dim(rng, 5, 8 * d + 4), _dim(rng, 4, 15 * d)
    ri = _dim(rng, 2, ro - 2)
    return (
        f"A tube (hollow cylinder) of outer radius {ro} mm, inner radius {ri} mm and height {h} mm, axis along z.",
        ["difference", _cyl(h, ro), [_cyl(h + 2, ri, [0, 0, -1])]],
        {
            "volume": _cyl_vol(ro, h) - _cyl_vol(ri, h),
            "vol_tol": 0.03,
            "bbox": [2 * ro, 2 * ro, h],
            "parts": 1,
            "genus": 1,
        },
    )


def plate_holes(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    n = 1 + d
    pitch, t, r = _dim(rng, 8, 14), _dim(rng, 2, 5), _dim(rng, 1, 3)
    x, y = pitch * (n + 1), _dim(rng, 2 * r + 6, 20)
    holes = [_cyl(t + 2, r, [pitch * (i + 1), y / 2, -1]) for i in range(n)]
    return (
        f"A plate {x} x {y} x {t} mm with {n} round through-holes of radius {r} mm along z, centred on the plate's "
        f"long mid-line at x = {', '.join(str(pitch * (i + 1)) for i in range(n))} mm (plate corner at the origin).",
        ["difference", _cube(x, y, t), holes],
        {"volume": x * y * t - n * _cyl_vol(r, t), "vol_tol": 0.02, "bbox": [x, y, t], "parts": 1, "genus": n},
    )


def two_blocks(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    a, b, h, gap = _dim(rng, 4, 10 * d), _dim(rng, 4, 10 * d), _dim(rng, 3, 8), _dim(rng, 2, 4 + 2 * d)
    return (
        f"Two separate cubes-based blocks side by side along x, both {h} mm tall: the first {a} x {a} mm, the second "
        f"{b} x {b} mm, with a clearance of exactly {gap} mm between them, both starting at y = 0.",
        ["union", [_cube(a, a, h), _cube(b, b, h, [a + gap, 0, 0])]],
        {
            "volume": (a * a + b * b) * h,
            "vol_tol": 0.01,
            "bbox": [a + gap + b, max(a, b), h],
            "parts": 2,
            "genus": 0,
            "clearance": gap,
        },
    )


def l_bracket(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    L, W, T, H = _dim(rng, 20, 20 + 20 * d), _dim(rng, 8, 20), _dim(rng, 2, 5), _dim(rng, 10, 10 + 15 * d)
    return (
        f"An L-shaped bracket: a base plate {L} x {W} x {T} mm and an upright plate {T} x {W} x {H} mm rising from "
        f"the base's x = 0 edge, joined into one solid {H} mm tall.",
        ["union", [_cube(L, W, T), _cube(T, W, H)]],
        {"volume": L * W * T + T * W * (H - T), "vol_tol": 0.01, "bbox": [L, W, H], "parts": 1, "genus": 0},
    )


def frame(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    X, Y, w, t = _dim(rng, 20, 20 + 15 * d), _dim(rng, 20, 20 + 15 * d), _dim(rng, 2, 6), _dim(rng, 2, 6)
    return (
        f"A rectangular picture frame: outer size {X} x {Y} mm, border width {w} mm, thickness {t} mm.",
        ["difference", _cube(X, Y, t), [_cube(X - 2 * w, Y - 2 * w, t + 2, [w, w, -1])]],
        {"volume": (X * Y - (X - 2 * w) * (Y - 2 * w)) * t, "vol_tol": 0.01, "bbox": [X, Y, t], "parts": 1, "genus": 1},
    )


def stacked(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    s, h1, r, h2 = _dim(rng, 10, 10 + 10 * d), _dim(rng, 3, 10), 0, _dim(rng, 3, 12)
    r = _dim(rng, 2, s // 2 - 1)
    return (
        f"A square base {s} x {s} x {h1} mm with a cylinder of radius {r} mm and height {h2} mm standing on the centre "
        f"of its top face, as one solid.",
        ["union", [_cube(s, s, h1), _cyl(h2, r, [s / 2, s / 2, h1])]],
        {"volume": s * s * h1 + _cyl_vol(r, h2), "vol_tol": 0.02, "bbox": [s, s, h1 + h2], "parts": 1, "genus": 0},
    )


def pegs(rng: random.Random, d: int) -> tuple[str, Solid, dict[str, Any]]:
    n, r, h, gap = 1 + d, _dim(rng, 1, 3), _dim(rng, 4, 30), _dim(rng, 2, 6)
    pitch = 2 * r + gap
    return (
        f"A row of {n} separate upright pins (cylinders of radius {r} mm, height {h} mm, axes along z) along x, "
        f"with a clearance of {gap} mm between neighbouring pins.",
        ["union", [_cyl(h, r, [i * pitch, 0, 0]) for i in range(n)]],
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


# ---- proxies: other shapes that meet the scalar checks (the cheat list's hard part) ----


def _pocketed_square(h: float, r: float, x: float, y: float) -> Solid:
    """A 2r x 2r x h square prism centred at (x, y) minus a blind axial pocket of radius
    0.8 r, sized so the volume equals the cylinder's (pi r^2 h): same extents, no hole."""
    depth = (4 - math.pi) * h / (0.64 * math.pi)
    return ["difference", _cube(2 * r, 2 * r, h, [x - r, y - r, 0]), [_cyl(depth + 1, 0.8 * r, [x, y, h - depth])]]


def _proxy_box(s: Solid) -> Solid:
    x, y, z = s[1]
    return ["difference", s, [_cube(0.1 * x, 0.1 * y, 0.9 * z + 1, [0.45 * x, 0.45 * y, 0.1 * z])]]


def _proxy_cylinder(s: Solid) -> Solid:
    return _pocketed_square(s[1], s[2], 0, 0)


def _proxy_sphere(s: Solid) -> Solid:
    r = s[1]
    cones = [["cone", r / 2, r, 0, [0, 0, r / 2]], ["cone", r / 2, 0, r, [0, 0, -r]]]
    return ["union", [_cyl(r, r, [0, 0, -r / 2]), *cones]]  # a cylinder capped by cones: same volume


def _moved_holes(s: Solid, move: Callable[[list[float], float], list[float]]) -> Solid:
    return ["difference", s[1], [_cyl(c[1], c[2], move(c[3], c[2])) for c in s[2]]]


def _proxy_box_hole(s: Solid) -> Solid:
    return _moved_holes(s, lambda at, r: [r + 1, at[1], at[2]])  # against the x = 0 wall


def _proxy_tube(s: Solid) -> Solid:
    ro = s[1][2]
    return _moved_holes(s, lambda at, r: [ro - r - 1, at[1], at[2]])  # a 1 mm wall on one side


def _proxy_plate_holes(s: Solid) -> Solid:
    return _moved_holes(s, lambda at, r: [at[0], r + 1, at[2]])  # off the mid-line


def _proxy_two_blocks(s: Solid) -> Solid | None:
    first, second = s[1]
    a, b = first[1][0], second[1][0]
    if abs(a - b) < 2:
        return None  # no other arrangement with these scalars that is not a mirror image
    small, big = (first, second) if a < b else (second, first)
    lift = abs(a - b) / 2
    moved = _cube(*small[1], [small[2][0], lift, 0])
    return ["union", [big, moved]]


def _proxy_l_bracket(s: Solid) -> Solid:
    base, upright = s[1]
    L, T = base[1][0], upright[1][0]
    return ["union", [base, _cube(*upright[1], [(L - T) / 2, 0, 0])]]  # a T, not an L


def _proxy_frame(s: Solid) -> Solid:
    cut = s[2][0]
    w = cut[2][0]
    return ["difference", s[1], [_cube(*cut[1], [1, w, -1])]]  # borders of 1 and 2w - 1 mm


def _proxy_stacked(s: Solid) -> Solid:
    base, post = s[1]
    r = post[2]
    return ["union", [base, _cyl(post[1], r, [r, r, post[3][2]])]]  # in a corner of the top face


def _proxy_pegs(s: Solid) -> Solid:
    return ["union", [_pocketed_square(c[1], c[2], c[3][0], 0) for c in s[1]]]


PROXIES: dict[str, Callable[[Solid], Solid | None]] = {
    "box": _proxy_box,
    "cylinder": _proxy_cylinder,
    "sphere": _proxy_sphere,
    "box_hole": _proxy_box_hole,
    "tube": _proxy_tube,
    "plate_holes": _proxy_plate_holes,
    "two_blocks": _proxy_two_blocks,
    "l_bracket": _proxy_l_bracket,
    "frame": _proxy_frame,
    "stacked": _proxy_stacked,
    "pegs": _proxy_pegs,
}
"""For each shape, a different solid that meets its volume, extents, parts, genus and
clearance checks (None where these scalars leave only mirror images of the gold)."""


# ---- the solid: gold code and reference shape from one CSG tree ------------------------


def solid_code(solid: Solid) -> str:
    """The manifold3d expression that builds `solid` (the gold script's body)."""
    kind = solid[0]
    if kind == "union":
        return "(" + " + ".join(solid_code(s) for s in solid[1]) + ")"
    if kind == "difference":
        return f"{solid_code(solid[1])} - ({' + '.join(solid_code(s) for s in solid[2])})"
    at = solid[-1]
    move = "" if not any(at) else f".translate([{at[0]}, {at[1]}, {at[2]}])"
    if kind == "cube":
        x, y, z = solid[1]
        return f"Manifold.cube([{x}, {y}, {z}]){move}"
    if kind == "cylinder":
        return f"Manifold.cylinder({solid[1]}, {solid[2]}, {solid[2]}, {SEG}){move}"
    if kind == "cone":
        return f"Manifold.cylinder({solid[1]}, {solid[2]}, {solid[3]}, {SEG}){move}"
    return f"Manifold.sphere({solid[1]}, {SEG}){move}"


def build(solid: Solid, grow: float = 0.0) -> Any:
    """The Manifold of `solid` with every primitive grown by `grow` mm on each side
    (shrunk when negative; a primitive shrunk to nothing is empty). A difference grows
    its base and shrinks what it removes, so build(s, g) contains every point within g
    of build(s) (g > 0) and build(s, -g) only points at least g inside it."""
    from manifold3d import Manifold

    kind = solid[0]
    if kind in ("union", "difference"):
        parts = solid[1] if kind == "union" else solid[2]
        joined = Manifold()
        for part in parts:
            joined = joined + build(part, grow if kind == "union" else -grow)
        return joined if kind == "union" else build(solid[1], grow) - joined
    tx, ty, tz = solid[-1]
    if kind == "cube":
        dims = [float(v) + 2 * grow for v in solid[1]]
        return Manifold.cube(dims).translate([tx - grow, ty - grow, tz - grow]) if min(dims) > 0 else Manifold()
    if kind == "cylinder":
        h, r = float(solid[1]) + 2 * grow, float(solid[2]) + grow
        return Manifold.cylinder(h, r, r, SEG).translate([tx, ty, tz - grow]) if min(h, r) > 0 else Manifold()
    if kind != "sphere":
        raise ValueError(f"geo solid: {kind!r} is not a reference primitive (cones appear in proxies only)")
    r = float(solid[1]) + grow
    return Manifold.sphere(r, SEG).translate([tx, ty, tz]) if r > 0 else Manifold()


SHAPE_REL = 0.01
SHAPE_ABS = 0.1
"""The shape tolerance: the built surface must lie within SHAPE_REL x the largest
extent + SHAPE_ABS mm of the described solid's surface (after centring and an
axis-aligned rotation or mirroring)."""
SHAPE_SLACK = 1e-4
"""Volume, as a share of the solid's, allowed outside that band (boolean round-off)."""


def shape_tolerance(solid: Solid) -> float:
    """The band half-width in mm for `solid` (SHAPE_REL x its largest extent + SHAPE_ABS)."""
    lo, hi = _bounds(build(solid))
    return SHAPE_REL * float(max(hi - lo)) + SHAPE_ABS


def _bounds(m: Any) -> tuple[Any, Any]:
    import numpy as np

    b = np.asarray(m.bounding_box(), dtype=np.float64)
    return b[:3], b[3:]


def _orientations() -> list[Any]:
    """The 48 axis-aligned rotations and mirrorings (signed permutation matrices)."""
    import itertools

    import numpy as np

    out = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1.0, -1.0), repeat=3):
            m = np.zeros((3, 3))
            for row, (col, sign) in enumerate(zip(perm, signs)):
                m[row, col] = sign
            out.append(m)
    return out


def _placed(m: Any, centre: Any, rot: Any) -> Any:
    """`m` moved so `centre` is at the origin, then rotated/mirrored by `rot`."""
    import numpy as np

    moved = m.translate([float(-c) for c in centre])
    return moved.transform(np.hstack([rot, np.zeros((3, 1))]).tolist())


def _signature(m: Any) -> bytes:
    """The sorted, rounded vertex set of a mesh: equal for equal placements of one solid."""
    import numpy as np

    v = np.round(np.asarray(m.to_mesh().vert_properties)[:, :3], 4) + 0.0
    return np.unique(v, axis=0).tobytes()


def _placements(ref: Any, extents: Any, tol: float) -> list[Any]:
    """The axis-aligned rotations and mirrorings of `ref` (about its bounding-box centre)
    whose extents are within 2 x `tol` of `extents`, one per distinct placement."""
    import numpy as np

    lo, hi = _bounds(ref)
    out, seen = [], set()
    for rot in _orientations():
        if not np.all(np.abs(np.abs(rot) @ (hi - lo) - extents) <= 2 * tol):
            continue
        key = _signature(_placed(ref, (lo + hi) / 2, rot))
        if key not in seen:
            seen.add(key)
            out.append(rot)
    return out


def _fit(body: Any, outer: Any, inner: Any, slack: float) -> dict[str, float]:
    """The build's volume outside `outer` and `inner`'s volume the build lacks (not
    computed, reported as the whole of `inner`, when the first already fails)."""
    outside = float((body - outer).volume())
    missing = float((inner - body).volume()) if outside <= slack else float(inner.volume())
    return {"shape": float(outside <= slack and missing <= slack), "shape_outside": outside, "shape_missing": missing}


def match_shape(built: Any, solid: Solid) -> dict[str, float]:
    """How the built Manifold fits the described solid's tolerance band, in the
    axis-aligned placement that fits best: `shape_outside` (built volume outside the
    band's outer surface) and `shape_missing` (band-inner volume the build lacks), in
    mm^3; `shape` 1.0 when both are within SHAPE_SLACK of the solid's volume. Both are
    centred on their bounding boxes; at most 48 placements, each one or two booleans, over a
    mesh already capped at MAX_FACES faces."""
    ref = build(solid)
    tol, slack = shape_tolerance(solid), SHAPE_SLACK * float(ref.volume())
    ref_lo, ref_hi = _bounds(ref)
    lo, hi = _bounds(built)
    body = built.translate([float(-x) for x in (lo + hi) / 2])
    outer, inner = build(solid, tol), build(solid, -tol)
    # no placement with matching extents: all of the build is outside, all of the band missing
    best = {"shape": 0.0, "shape_outside": float(built.volume()), "shape_missing": float(inner.volume())}
    for i, rot in enumerate(_placements(ref, hi - lo, tol)):
        centre = (ref_lo + ref_hi) / 2
        fit = _fit(body, _placed(outer, centre, rot), _placed(inner, centre, rot), slack)
        if i == 0 or fit["shape_outside"] + fit["shape_missing"] < best["shape_outside"] + best["shape_missing"]:
            best = fit
        if best["shape"]:
            break
    return best


# ---- the verifier ---------------------------------------------------------------------


def _npz_shapes_ok(data: bytes) -> bool:
    """Whether an npz's `vertices` and `faces` arrays are 2-D with at most MAX_FACES rows of
    3 plain numbers (an int or float dtype of at most 8 bytes: a `<U2000` header would make
    the same shape a gigabyte), read from their .npy headers before any array is decompressed."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for name in ("vertices.npy", "faces.npy"):
            with z.open(name) as fh:
                major, _ = np.lib.format.read_magic(fh)
                header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, _, dtype = header(fh)
            if len(shape) != 2 or shape[0] > MAX_FACES or shape[1] != 3:
                return False
            if dtype.kind not in "iuf" or dtype.itemsize > 8:
                return False
    return True


def _read(name: str, data: bytes) -> tuple[Any, Any] | None:
    """(vertices, faces) of one output file, or None when it is over the caps."""
    import numpy as np

    if name.endswith(".npz"):
        if not _npz_shapes_ok(data):
            return None
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return np.asarray(z["vertices"], dtype=np.float64), np.asarray(z["faces"], dtype=np.int64)
    import trimesh

    mesh = trimesh.load(io.BytesIO(data), file_type=name.rsplit(".", 1)[1], force="mesh", process=True)
    return np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int64)


def load_mesh(files: dict[str, bytes]) -> tuple[Any, Any] | None:
    """(vertices n x 3, faces m x 3) from the first output file present, or None when
    it does not parse, is not a triangle mesh or has over MAX_FACES faces or vertices
    (an npz is refused from its headers, before it is decompressed; STL and OBJ files
    are at most the sandbox's 1 MiB output limit)."""
    import numpy as np

    for name in OUTPUTS:
        data = files.get(name)
        if not data:
            continue
        try:
            read = _read(name, data)
        except Exception:  # noqa: BLE001 - an unreadable file is the model's failure
            return None
        if read is None:
            return None
        v, f = read
        if v.ndim != 2 or v.shape[1] != 3 or f.ndim != 2 or f.shape[1] != 3 or not len(f):
            return None
        if len(f) > MAX_FACES or len(v) > MAX_FACES or f.min() < 0 or f.max() >= len(v) or not np.isfinite(v).all():
            return None
        return v, f
    return None


def measure(v: Any, f: Any, solid: Solid | None = None) -> dict[str, Any]:
    """Watertightness, volume, extents, parts, genus, min gap between parts (for at
    most MAX_PARTS parts; over that, `clearance_note` says so and none is measured) and,
    given the described `solid`, how the mesh fits it (`match_shape`)."""
    import numpy as np
    import trimesh
    from manifold3d import Error, Manifold, Mesh

    tm = trimesh.Trimesh(vertices=v, faces=f, process=True)
    mesh = Mesh(
        vert_properties=np.asarray(tm.vertices, dtype=np.float32), tri_verts=np.asarray(tm.faces, dtype=np.uint32)
    )
    built = Manifold(mesh)
    manifold_ok = built.status() == Error.NoError and not built.is_empty()
    out = {"watertight": bool(tm.is_watertight and manifold_ok), "extents": [float(x) for x in tm.extents]}
    if not out["watertight"]:
        return out
    parts = built.decompose()
    out.update(volume=float(built.volume()), parts=len(parts), genus=int(sum(p.genus() for p in parts)))
    if solid is not None:
        out.update(match_shape(built, solid))
    if len(parts) > MAX_PARTS:
        out["clearance_note"] = f"{len(parts)} parts, over the limit of {MAX_PARTS}: clearance not measured"
    elif len(parts) > 1:
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
            "clearance" in m and abs(m["clearance"] - checks["clearance"]) <= 0.05 * checks["clearance"] + 0.05
        )
    if "solid" in checks:
        results["shape"] = float(m.get("shape", 0.0))
    return results


@dataclass(frozen=True)
class GeoRun:
    """The execute step's result: how the script ran and the constraint report of
    the mesh it wrote (`measures`: watertight, extents, volume, parts, genus,
    clearance or clearance_note, shape, shape_outside, shape_missing), measured
    on the host from the returned file as data; None with `note` when the script
    failed or wrote no readable mesh."""

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
PACKAGES = ("manifold3d", "trimesh", "numpy")  # what the prompt says a script may import (with their requirements)
STDERR_CHARS = 2000


def run_script(source: str, run: Callable[[Any], Any] | None = None, solid: Solid | None = None) -> GeoRun:
    """Run a mesh script in the sandbox and measure what it wrote (against the described
    `solid` when given); SandboxError on an infra error."""
    from posttrain import sandbox

    req = sandbox.ExecRequest(
        files={"main.py": source},
        python_main="main.py",
        collect=OUTPUTS,
        packages=PACKAGES,
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
    return GeoRun(**base, measures=measure(*mesh, solid))


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
        got = m.get("clearance_note") or f"{m.get('clearance', 0.0):.2f} mm"
        lines.append(f"clearance between parts: {got} (target {checks['clearance']:g}): {mark[results['clearance']]}")
    if "solid" in checks:
        lines.append(
            f"shape: {m.get('shape_outside', 0.0):.2f} mm^3 outside the described solid, "
            f"{m.get('shape_missing', 0.0):.2f} mm^3 of it missing (within {shape_tolerance(checks['solid']):.2f} mm "
            f"of its surface, any placement and axis order): {mark[results['shape']]}"
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
        run = run_script(source, solid=self.checks.get("solid"))
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
        return run_script(source, run, task.reference["checks"].get("solid")) if source.strip() else None

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
    version = "4"
    levels = 3
    cost_class = "long"
    budget = Budget(turns=3, tokens=512, seconds=60.0)
    partial_credit = True

    def __init__(self, shape: str) -> None:
        self.name = f"geo_{shape}"
        self.shape, self.description = SHAPES[shape]
        self.proxy = PROXIES[shape]
        self.verifier = MeshVerifier()

    def environment(self) -> type[GeoEnv]:
        return GeoEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the gold script, every constraint met at the first run."""
        return [self.gold(task)]

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:
        text, solid, checks = self.shape(rng, difficulty)
        return HEADER + text + "\n" + FEEDBACK + "\n" + ANSWER_INSTRUCTION.replace("final answer", "script"), {
            "script": script("shape = " + solid_code(solid)),
            "checks": {**checks, "solid": solid},
        }

    def gold(self, task: Task) -> str:
        return f"```python\n{task.reference['script']}```"

    def wrong(self, task: Task) -> str:
        scaled = task.reference["script"].replace(SAVE_NPZ, "shape = shape.scale([1.25, 1.25, 1.25])\n" + SAVE_NPZ)
        return f"```python\n{scaled}```"

    def proxy_script(self, task: Task) -> str | None:
        """A gold-form script building a different solid that meets every scalar check
        (volume, extents, parts, genus, clearance): only the shape check tells it apart.
        None where the scalars leave no such solid but a mirror image."""
        proxy = self.proxy(task.reference["checks"]["solid"])
        return None if proxy is None else f"```python\n{script('shape = ' + solid_code(proxy))}```"

    def cheats(self, task: Task) -> list[str]:
        """No script, a script that writes nothing, prints the target numbers, or builds a
        different shape meeting every scalar check (`proxy_script`): never accepted."""
        c = task.reference["checks"]
        out = ["", "```python\nprint('done')\n```", f"```python\nprint({c['volume']!r}, {c['bbox']!r})\n```"]
        proxy = self.proxy_script(task)
        return out if proxy is None else [*out, proxy]


for _shape in SHAPES:
    register(GeoDomain(_shape))
