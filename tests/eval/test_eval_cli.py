"""`posttrain eval` on a stored held-out set reruns to identical JSON; `posttrain compare` marks deltas."""

from __future__ import annotations

import json

from posttrain.cli import main

SMALL = [
    "tasks.domains={add: {difficulty: 1}, reverse: {difficulty: 1}}",
    "eval.tasks_per_domain=12",
    "eval.max_tokens=6",
    "eval.samples=4",
    "eval.k=[1,2,4]",
    "eval.above_tasks=4",
    "run.threads=1",
]


def test_eval_rerun_on_stored_set_gives_identical_json(tmp_path, micro_base, capsys):
    held = tmp_path / "heldout.json"
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["eval", *SMALL, "--model", micro_base, "--save-heldout", str(held), "--json", str(first)]) == 0
    # a different config size: the stored set wins, so the items (and the JSON) are the same
    assert (
        main(
            [
                "eval",
                *SMALL,
                "eval.tasks_per_domain=3",
                "--model",
                micro_base,
                "--heldout",
                str(held),
                "--json",
                str(second),
            ]
        )
        == 0
    )
    assert first.read_bytes() == second.read_bytes()
    data = json.loads(first.read_text())
    assert data["domains"]["add"]["n"] == len(data["domains"]["add"]["items"]) == 12
    assert set(data["domains"]["add"]["sampling"]) == {"pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"}
    assert "above:add" in data["probes"]
    out = capsys.readouterr().out
    assert "95% Wilson" in out and "[" in out
    # the probes are printed too, each with its n and accuracy as the JSON has them
    above = data["probes"]["above:add"]
    assert "held-out one level above the trained one:" in out
    assert any(
        line.split()[:3] == ["add", str(above["difficulty"]), str(above["n"])] and f"{above['accuracy']:.3f}" in line
        for line in out.splitlines()
    ), out


def test_eval_bad_input_is_exit_2(tmp_path, micro_base, capsys):
    assert main(["eval", *SMALL, "--model", micro_base, "--heldout", str(tmp_path / "missing.json")]) == 2
    assert main(["eval", *SMALL, "eval.k=[16]", "--model", micro_base]) == 2
    assert "eval.k" in capsys.readouterr().err


def test_compare_same_items_paired(tmp_path, micro_base, capsys):
    held = tmp_path / "heldout.json"
    assert main(["eval", *SMALL, "--model", micro_base, "--save-heldout", str(held)]) == 0
    out = tmp_path / "cmp"
    assert main(["compare", micro_base, micro_base, *SMALL, "--heldout", str(held), "--out", str(out)]) == 0
    data = json.loads((out / "compare.json").read_text())
    # a model against itself: every delta is 0 and nothing is called significant
    assert data["improved"] == [] and data["regressed"] == []
    assert all(d["delta"] == 0 for d in data["deltas"]["domains"].values())
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "compare.html").read_text()
    assert "data:image/png;base64," in page and "paired" in page
    assert main(["compare", micro_base, str(tmp_path / "nope")]) == 2


def test_eval_builds_its_engine_from_the_engine_section(micro_base, monkeypatch, capsys):
    """`engine.*` settings reach `posttrain eval`'s hf engine (before, it built one with the
    defaults whatever the config said, so `engine.kv_dtype=int8` evaluated float32)."""
    from posttrain.engine.hf import HFEngine

    built = []
    real = HFEngine.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        engine = real(cls, *args, **kwargs)
        built.append(engine.config)
        return engine

    monkeypatch.setattr(HFEngine, "from_pretrained", classmethod(recording))
    small = [*SMALL, "eval.samples=0", "eval.tasks_per_domain=2", "eval.above_tasks=0"]
    argv = ["eval", *small, "engine.kv_dtype=int8", "engine.prefill_chunk_tokens=64", "--model", micro_base]
    assert main(argv) == 0
    assert [(c.kv_dtype, c.prefill_chunk_tokens) for c in built] == [("int8", 64)]
