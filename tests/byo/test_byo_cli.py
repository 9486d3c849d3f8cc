"""`posttrain tasks validate|stats`: problems listed with their line, exit 1; unusable input exit 2."""

from __future__ import annotations

import json

from byo_testlib import rows, write_jsonl

from posttrain.cli import main


def test_validate_and_stats_on_a_clean_file(tmp_path, capsys):
    again = [{k: v for k, v in r.items() if k != "id"} for r in rows(80)[:3]]  # the same task, no id
    path = write_jsonl(tmp_path / "q.jsonl", rows(80) + again)  # 3 exact duplicates
    assert (
        main(["tasks", "validate", str(path), "--field", "prompt=q", "--field", "answer=a", "--verifier", "numeric"])
        == 0
    )
    out = capsys.readouterr().out
    assert "83 rows" in out and "3 exact" in out and "pass their verifier" in out and "ok" in out
    assert main(["tasks", "stats", str(path), "--field", "prompt=q", "--field", "answer=a"]) == 0
    # `a-b=` is 5 characters: 5 tokens of the embedded model, plus <|user|> and <|assistant|> of its chat template
    assert "prompt tokens: min 7 | p50 7" in capsys.readouterr().out


def test_validate_lists_bad_rows_and_rejected_gold(tmp_path, capsys):
    data = [json.dumps(r) for r in rows(60)]
    data[6] = "{oops"
    data[7] = json.dumps({"q": "9-1=", "a": "eight"})  # the numeric verifier rejects its own reference
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(data) + "\n")
    code = main(["tasks", "validate", str(path), "--field", "prompt=q", "--field", "answer=a", "--verifier", "numeric"])
    out = capsys.readouterr().out
    assert code == 1 and "line 7: not valid JSON" in out and "PROBLEMS FOUND" in out
    assert "line 8: gold answer" in out or "line 8: gold answer could not be scored" in out


def test_validate_catches_a_repeated_id_column_without_fields_id(tmp_path, capsys):
    """A column named `id` is the row id unless fields.id names another: a repeated value is a
    bad row naming both lines, with or without `--field id=...`."""
    data = rows(60)
    data[9]["id"] = data[2]["id"]
    path = write_jsonl(tmp_path / "q.jsonl", data)
    code = main(["tasks", "validate", str(path), "--field", "prompt=q", "--field", "answer=a", "--verifier", "numeric"])
    out = capsys.readouterr().out
    assert code == 1 and f"line 10: duplicate id '{data[2]['id']}' (first at line 3)" in out, out


def test_unusable_input_exits_2(tmp_path, capsys):
    assert main(["tasks", "validate", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    path = write_jsonl(tmp_path / "q.jsonl", rows(30))
    assert main(["tasks", "validate", str(path), "--field", "question=q"]) == 2
    assert "unknown field 'question'" in capsys.readouterr().err
    assert (
        main(["tasks", "validate", str(path), "--field", "prompt=q", "--field", "answer=a", "--verifier", "fuzzy"]) == 2
    )
    assert "unknown verifier 'fuzzy'" in capsys.readouterr().err
    assert (
        main(
            [
                "tasks",
                "validate",
                str(path),
                "--field",
                "prompt=q",
                "--field",
                "answer=a",
                "--verifier",
                "no_such_mod:f",
            ]
        )
        == 2
    )
    assert "ModuleNotFoundError" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"tasks:\n  domains:\n    x: {{source: {{path: {path}, fields: {{prompt: q, answr: a}}}}}}\n")
    assert main(["train", str(cfg)]) == 2
    assert "answr" in capsys.readouterr().err


def test_the_example_validates_and_its_data_is_reproducible(tmp_path, monkeypatch, capsys):
    import runpy
    from pathlib import Path

    root = Path(__file__).parents[2]
    monkeypatch.chdir(root)
    assert main(["tasks", "validate", "examples/byo.yaml"]) == 0
    assert "78 held-out" in capsys.readouterr().out
    committed = (root / "examples/data/subtraction.jsonl").read_bytes()
    script = runpy.run_path(str(root / "examples/make_byo_data.py"))
    monkeypatch.setitem(script["main"].__globals__, "OUT", tmp_path / "again.jsonl")
    script["main"]()
    assert (tmp_path / "again.jsonl").read_bytes() == committed


def test_domains_lists_shows_and_checks_a_configs_source_domains(tmp_path, capsys):
    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"tasks:\n  domains:\n    mine: {{source: {{path: {path}, "
        "fields: {prompt: q, answer: a}, eval_percent: 20}, verifier: numeric}\n"
    )
    assert main(["domains", "--config", str(cfg), "--json", "--no-sample"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "mine")
    assert row["origin"] == f"file {path}" and row["verifier"] == "numeric"
    assert main(["domains", "--config", str(cfg), "show", "mine"]) == 0
    assert f"origin file {path}" in capsys.readouterr().out
    assert main(["domains", "--config", str(cfg), "hygiene", "mine"]) == 0
    assert "mine" in capsys.readouterr().out
