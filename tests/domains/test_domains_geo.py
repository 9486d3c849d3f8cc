"""geo_*: model scripts run in the sandbox; the mesh is checked, never the text."""

from __future__ import annotations

import pytest

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
