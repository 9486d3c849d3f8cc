"""Held-out sets: distinct items, honest n, storage and rerun, rotation, strict verifiers, infra errors."""

from __future__ import annotations

import pytest

from posttrain.domains.hygiene import prompt_key
from posttrain.evaluate import EvalTable, HeldoutSet, build_heldout, format_table, rotation_slice
from posttrain.evaluate.core import _result, judge
from posttrain.pipeline.workers import verify_one
from posttrain.types import Episode


def test_n_counts_distinct_tasks_and_a_small_split_says_so():
    h = build_heldout({"add": 1, "reverse": 1}, 100, above_tasks=10)
    add = h.sets["core:add"]
    keys = [prompt_key(t) for t in add.tasks()]
    assert len(keys) == len(set(keys)) == add.n  # no repeated question
    assert add.n < 100 and add.short  # add at level 1 has fewer than 100 eval questions
    assert any("add" in w and "100 were asked" in w for w in h.warnings())
    assert h.sets["core:reverse"].n == 100 and not h.sets["core:reverse"].short
    assert h.sets["above:add"].level == 2 and h.sets["above:add"].n == 10


def test_stored_set_rebuilds_the_same_items(tmp_path):
    h = build_heldout({"sub": 1, "sort": 1}, 20, seed=3, transfer={"mul": 1})
    h.save(tmp_path / "heldout.json")
    again = HeldoutSet.load(tmp_path)
    assert again == h and again.version == h.version
    assert [t.id for t in again.sets["core:sub"].tasks()] == [t.id for t in h.sets["core:sub"].tasks()]
    assert again.sets["transfer:mul"].kind == "transfer"
    assert build_heldout({"sub": 1}, 20, seed=4).sets["core:sub"].indices != h.sets["core:sub"].indices


def test_a_changed_generator_refuses_to_rebuild(tmp_path):
    from posttrain.errors import TaskError

    h = build_heldout({"reverse": 1}, 5)
    data = h.to_json()
    data["sets"]["core:reverse"]["taskset_version"] = "000000000000"
    with pytest.raises(TaskError, match="task-set version"):
        HeldoutSet.from_json(data).sets["core:reverse"].tasks()


def test_rotation_slices_are_fresh_and_differ():
    core = build_heldout({"reverse": 2}, 30).sets["core:reverse"]
    core_keys = {prompt_key(t) for t in core.tasks()}
    one, two = rotation_slice(core, 10, 1), rotation_slice(core, 10, 2)
    assert one.n == 10 and two.n == 10 and one.indices != two.indices
    assert not core_keys & {prompt_key(t) for t in one.tasks() + two.tasks()}
    assert rotation_slice(core, 10, 1) == one  # seeded


def test_transfer_domain_must_be_untrained():
    from posttrain.errors import ConfigError

    with pytest.raises(ConfigError, match="trained on"):
        build_heldout({"add": 1}, 5, transfer={"add": 1})


def test_eval_verifier_is_stricter_than_the_training_one():
    task = build_heldout({"add": 2}, 1).sets["core:add"].tasks()[0]
    ref = str(task.reference)

    def verdicts(text):
        return judge(task, verify_one(task, Episode(text)), Episode(text))[:2]

    assert verdicts(ref) == (True, True)
    # the training verifier reads the last answer tag; the eval verifier also wants nothing else around it
    assert verdicts(f"junk <answer>{ref}</answer>") == (False, True)
    assert verdicts(ref + "1") == (False, False)


def test_all_infra_domain_is_not_zero(raising_domain):
    raising_domain("test_raising_eval")
    task_ids = [("a", None, None), ("b", None, None)]
    r = _result("test_raising_eval", 1, "core", 2, "boom", task_ids, [])
    assert r.accuracy is None and r.infra_errors == 2 and r.scored == 0
    ok = _result("add", 1, "core", 2, "exact_match", [("c", True, True), ("d", False, False)], [1.0, 0.0])
    table = EvalTable(0, {"test_raising_eval": r, "add": ok})
    assert table.accuracies == {"add": 0.5} and table.mean_accuracy == 0.5
    text = format_table(table)
    assert "infra (2 errors)" in text and "0.000" not in text.splitlines()[1]
    assert EvalTable.from_json(table.to_json()) == table


def test_the_demo_configs_held_out_sets_are_full():
    """configs/default.yaml asked for 100 tasks per domain; add and sub at level 1 hold 85 and 91,
    so every demo run printed two warnings."""
    from pathlib import Path

    from posttrain.configs import load_config
    from posttrain.evaluate.run import heldout_for

    cfg = load_config(Path(__file__).parents[2] / "configs" / "default.yaml", [])
    h = heldout_for(cfg.eval, {name: d.difficulty for name, d in cfg.tasks.domains.items()})
    assert h.warnings() == []
    assert {s.n for k, s in h.sets.items() if k.startswith("core:")} == {85}
