"""geo_*: model scripts run in the sandbox; the mesh is checked, never the text."""

from __future__ import annotations

import pytest

from posttrain.domains import geo3d
from posttrain.domains.registry import get
from posttrain.types import Episode


def _score(name: str, body: str, level: int = 1):
    d = get(name)
    task = d.sample(0, "train", level)
    return task, d.score(task, Episode(f"```python\n{body}\n```"))


def test_trimesh_stl_output_is_accepted():
    d = get("geo_box")
    task = d.sample(0, "train", 1)
    x, y, z = task.reference["checks"]["bbox"]
    body = f"import trimesh\ntrimesh.creation.box(extents=[{x}, {y}, {z}]).export('out.stl')"
    assert d.score(task, Episode(f"```python\n{body}\n```")).value == 1.0


def test_non_watertight_mesh_scores_zero():
    body = (
        "import numpy as np\nnp.savez('out.npz', vertices=np.array([[0,0,0],[1,0,0],[0,1,0]], float), "
        "faces=np.array([[0,1,2]]))"
    )
    _, s = _score("geo_box", body)
    assert s.value == 0.0 and s.parts["watertight"] == 0.0


def test_failing_script_and_missing_mesh_score_zero():
    _, s = _score("geo_box", "raise SystemExit(3)")
    assert s.value == 0.0 and "failed" in s.reason
    _, s = _score("geo_box", "print('no mesh written')")
    assert s.value == 0.0 and "no readable mesh" in s.reason
    _, s = _score(
        "geo_box", "import numpy as np\nnp.savez('out.npz', vertices=np.zeros((3, 2)), faces=np.zeros((1, 3), int))"
    )
    assert s.value == 0.0


def test_missing_hole_fails_genus_but_keeps_partial_credit():
    d = get("geo_box_hole")
    task = d.sample(0, "train", 1)
    x, y, z = task.reference["checks"]["bbox"]
    body = (
        f"import numpy as np\nfrom manifold3d import Manifold\nshape = Manifold.cube([{x}, {y}, {z}])\n"
        + "mesh = shape.to_mesh()\nnp.savez('out.npz', vertices=np.asarray(mesh.vert_properties)[:, :3], "
        "faces=np.asarray(mesh.tri_verts))"
    )
    s = d.score(task, Episode(f"```python\n{body}\n```"))
    assert s.parts["genus"] == 0.0 and s.parts["bbox"] == 1.0 and 0.0 < s.value < 1.0 and not s.passed


def test_clearance_is_measured_between_parts():
    import re

    d = get("geo_two_blocks")
    task = d.sample(0, "train", 1)
    gold = d.score(task, Episode(d.gold(task)))
    assert gold.passed and gold.parts["clearance"] == 1.0
    wider = re.sub(
        r"translate\(\[(\d+), 0, 0\]\)", lambda m: f"translate([{int(m.group(1)) + 1}, 0, 0])", task.reference["script"]
    )
    assert wider != task.reference["script"]
    s = d.score(task, Episode(f"```python\n{wider}```"))
    assert s.parts["clearance"] == 0.0 and s.parts["parts"] == 1.0 and not s.passed


@pytest.mark.parametrize("name", ["geo_plate_holes", "geo_pegs"])
def test_hardest_level_gold_passes(name):
    d = get(name)
    task = d.sample(0, "eval", d.levels)
    assert d.score(task, Episode(d.gold(task))).passed


# ---- the shape itself, not only its scalars ------------------------------------------

SCALARS = ("watertight", "volume", "bbox", "parts", "genus", "clearance")


@pytest.mark.parametrize("shape", sorted(geo3d.SHAPES))
def test_a_different_shape_meeting_every_scalar_check_scores_below_the_gold(shape):
    """The declared proxy (an off-centre hole, a T for an L, a pocketed square for a
    cylinder, ...) meets volume, extents, parts, genus and clearance; only the shape
    check tells it apart, so it scores below the gold and does not pass."""
    d = get(f"geo_{shape}")
    for level in sorted({1, d.levels}):
        task = d.sample(0, "train", level)
        proxy = d.proxy_script(task)
        if proxy is None:  # two_blocks of near-equal sizes: only mirror images meet the scalars
            continue
        assert proxy in d.cheats(task)
        s = d.score(task, Episode(proxy))
        gold = d.score(task, Episode(d.gold(task)))
        assert all(s.parts[k] == 1.0 for k in SCALARS if k in s.parts), (task.id, s.parts)
        assert s.parts["shape"] == 0.0 and s.value < gold.value == 1.0 and not s.passed, (task.id, s)


def _manifold_script(expr: str) -> str:
    return (
        "```python\nimport numpy as np\nfrom manifold3d import Manifold\n"
        f"shape = {expr}\nmesh = shape.to_mesh()\n"
        "np.savez('out.npz', vertices=np.asarray(mesh.vert_properties)[:, :3], faces=np.asarray(mesh.tri_verts))\n```"
    )


def test_the_gold_shape_placed_anywhere_in_any_axis_order_or_mirrored_passes():
    d = get("geo_l_bracket")
    task = d.sample(0, "train", 1)
    gold = geo3d.solid_code(task.reference["checks"]["solid"])
    for move in (".translate([40, -7, 3])", ".rotate([0, 0, 90])", ".mirror([1, 0, 0])", ".rotate([90, 0, 0])"):
        s = d.score(task, Episode(_manifold_script(f"({gold}){move}")))
        assert s.passed and s.parts["shape"] == 1.0, (move, s)


def test_coarser_circles_within_the_tolerance_pass_the_shape_check():
    d = get("geo_tube")
    task = d.sample(0, "train", 1)
    coarse = geo3d.solid_code(task.reference["checks"]["solid"]).replace(f", {geo3d.SEG})", ", 32)")
    assert ", 32)" in coarse
    s = d.score(task, Episode(_manifold_script(coarse)))
    assert s.parts["shape"] == 1.0 and s.passed, s


def test_a_feature_moved_beyond_the_tolerance_fails_the_shape_check():
    """The same hole, moved by 1.5 x the band's half-width: the shape check alone fails."""
    d = get("geo_box_hole")
    task = d.sample(0, "train", 1)
    solid = task.reference["checks"]["solid"]
    step = 1.5 * geo3d.shape_tolerance(solid)
    hole = solid[2][0]
    moved = ["difference", solid[1], [["cylinder", hole[1], hole[2], [hole[3][0] + step, hole[3][1], hole[3][2]]]]]
    s = d.score(task, Episode(_manifold_script(geo3d.solid_code(moved))))
    assert s.parts["shape"] == 0.0 and s.parts["genus"] == 1.0 and not s.passed, s


# ---- bounds on the host's work over the model's mesh ---------------------------------


def _cubes(n: int):
    import numpy as np
    from manifold3d import Manifold

    shape = Manifold()
    for i in range(n):
        shape = shape + Manifold.cube([1, 1, 1]).translate([3 * i, 0, 0])
    mesh = shape.to_mesh()
    return np.asarray(mesh.vert_properties)[:, :3].astype(float), np.asarray(mesh.tri_verts).astype(int)


def test_parts_over_the_cap_are_scored_without_the_pairwise_gaps():
    m = geo3d.measure(*_cubes(geo3d.MAX_PARTS + 1))
    assert m["parts"] == geo3d.MAX_PARTS + 1 and "clearance" not in m
    assert "over the limit" in m["clearance_note"]
    checks = {"volume": 17.0, "vol_tol": 0.01, "bbox": [49, 1, 1], "parts": 2, "genus": 0, "clearance": 2}
    results = geo3d.check(checks, m)
    assert results["clearance"] == 0.0 and results["parts"] == 0.0
    assert "over the limit" in geo3d.report(checks, m, results)
    assert "clearance" in geo3d.measure(*_cubes(geo3d.MAX_PARTS))  # at the cap: measured


def _npz(vertices_shape, faces_shape, descr: str = "<f8") -> bytes:
    """An npz whose .npy headers declare these shapes and dtype (the data after them is empty)."""
    import io
    import zipfile

    import numpy as np

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, shape in (("vertices.npy", vertices_shape), ("faces.npy", faces_shape)):
            buf = io.BytesIO()
            np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
            z.writestr(name, buf.getvalue())
    return out.getvalue()


def test_an_npz_over_the_face_cap_is_refused_from_its_header_before_reading(monkeypatch):
    import numpy as np

    loads = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    for shape in ((10**9, 3), (geo3d.MAX_FACES + 1, 3), (4, 3, 1)):
        assert geo3d.load_mesh({"out.npz": _npz((4, 3), shape)}) is None
        assert geo3d.load_mesh({"out.npz": _npz(shape, (4, 3))}) is None
    assert loads == []  # refused unread
    geo3d.load_mesh({"out.npz": _npz((4, 3), (4, 3))})
    assert loads == [1]  # within the caps the arrays are read


def test_an_npz_whose_dtype_is_not_a_plain_number_is_refused_unread(monkeypatch):
    """The row cap bounds bytes only for numbers: 50,000 x 3 `<U2000` strings are 1.1 GB, which
    a 1 MiB npz of zeros decompresses to (measured: the host's RSS grew by 1,144 MiB)."""
    import numpy as np

    loads = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    for descr in ("<U2000", "|V4096", "<c16", "|S64", "<f16"):
        assert geo3d.load_mesh({"out.npz": _npz((4, 3), (4, 3), descr)}) is None, descr
    assert loads == []
    geo3d.load_mesh({"out.npz": _npz((4, 3), (4, 3), "<i4")})
    assert loads == [1]
