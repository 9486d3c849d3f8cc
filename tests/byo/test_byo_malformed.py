"""Malformed task files: bytes that are not UTF-8 (JSONL, CSV), a JSON row nested past the
bound, and duplicate task ids (JSONL, CSV, Parquet) are TaskErrors naming the line (both lines
for a duplicate), never a traceback and never accepted in silence; `posttrain train` exits 2."""

from __future__ import annotations

import csv
import json

import pytest
from byo_testlib import rows, write_jsonl

from posttrain.byo.build import source_domain
from posttrain.byo.sources import MAX_DEPTH
from posttrain.cli import main
from posttrain.configs import nests_deeper
from posttrain.configs.tasks import DomainSpec
from posttrain.errors import TaskError

FIELDS = {"prompt": "q", "answer": "a", "id": "id"}


def _spec(path, fields=FIELDS):
    return DomainSpec.model_validate({"source": {"path": str(path), "fields": fields}, "verifier": "numeric"})


def _jsonl_lines(data):
    return [json.dumps(r).encode() for r in data]


def test_jsonl_bad_utf8_and_deep_nesting_name_their_line(tmp_path):
    lines = _jsonl_lines(rows(30))
    lines[3] = b'{"id": "x", "q": "1-\xff=", "a": "1"}'  # line 4
    lines[7] = b'{"id": "y", "q": "1-1=", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # line 8
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TaskError) as got:
        source_domain("bad", _spec(path))
    said = str(got.value)
    assert "2 bad rows: line 4: not valid UTF-8 at byte 20 of the line" in said, said
    assert f"line 8: JSON nested deeper than {MAX_DEPTH} levels" in said, said
    assert "\n" not in said


def test_csv_bad_utf8_names_its_line(tmp_path):
    path = tmp_path / "bad.csv"
    data = rows(30)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    raw = path.read_bytes().split(b"\n")
    raw[5] = raw[5].replace(b"-", b"-\xfe", 1)  # line 6
    path.write_bytes(b"\n".join(raw))
    with pytest.raises(TaskError, match=r"1 bad rows: line 6: not valid UTF-8 \(line 6, byte \d+\)"):
        source_domain("badcsv", _spec(path))
    path.write_bytes(b"id,\xffq,a\n" + b"\n".join(raw[1:]))
    with pytest.raises(TaskError, match="line 1: the header is not valid UTF-8"):
        source_domain("badhead", _spec(path))


def _with_duplicates(data):
    data = [dict(r) for r in data]
    data[9]["id"] = data[2]["id"]  # line 10 (JSONL) repeats line 3's id
    return data


def test_duplicate_ids_name_both_lines_in_every_format(tmp_path):
    data = _with_duplicates(rows(30))
    first = data[2]["id"]
    path = write_jsonl(tmp_path / "dup.jsonl", data)
    with pytest.raises(TaskError, match=rf"line 10: duplicate id '{first}' \(first at line 3\)"):
        source_domain("dupj", _spec(path))
    path = tmp_path / "dup.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    with pytest.raises(TaskError, match=rf"line 11: duplicate id '{first}' \(first at line 4\)"):  # the header is 1
        source_domain("dupc", _spec(path))
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(data), tmp_path / "dup.parquet", row_group_size=4)
    with pytest.raises(TaskError, match=rf"row 10: duplicate id '{first}' \(first at row 3\)"):
        source_domain("dupp", _spec(tmp_path / "dup.parquet"))


def test_a_column_named_id_is_the_row_id_unless_fields_id_names_another(tmp_path):
    data = _with_duplicates(rows(30))
    first = data[2]["id"]
    path = write_jsonl(tmp_path / "noid.jsonl", data)
    with pytest.raises(TaskError, match=rf"line 10: duplicate id '{first}' \(first at line 3\)"):
        source_domain("noid", _spec(path, {"prompt": "q", "answer": "a"}))  # no fields.id: `id` is the id
    domain = source_domain("other", _spec(path, {"prompt": "q", "answer": "a", "id": "q"}))  # another column
    assert domain.size("train") + domain.size("eval") == 30
    assert domain.sample(0, "train", 1).id.startswith("other:") and "-" in domain.sample(0, "train", 1).id
    keyed = [{"key": r["id"], **{k: v for k, v in r.items() if k != "id"}} for r in data]
    path = write_jsonl(tmp_path / "key.jsonl", keyed)
    domain = source_domain("keyed", _spec(path, {"prompt": "q", "answer": "a"}))  # no `id` column: the line
    assert domain.size("train") + domain.size("eval") == 30
    assert domain.sample(0, "train", 1).id.split(":")[1].isdigit()


def _over(raw: bytes) -> bool:
    return nests_deeper(raw.decode(), MAX_DEPTH)


def test_json_depth_counts_brackets_outside_strings_only():
    assert not _over(b'{"a": "' + b"[" * 500 + b'"}')
    assert _over(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert not _over(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    assert not _over(b'["\\"' + b"[" * 100 + b'"]')  # an escaped quote does not end the string


def test_posttrain_train_exits_2_naming_both_lines(tmp_path, capsys):
    data = _with_duplicates(rows(30))
    path = write_jsonl(tmp_path / "dup.jsonl", data)
    cfg = tmp_path / "c.yaml"
    fields = "{prompt: q, answer: a, id: id}"
    cfg.write_text(f"tasks:\n  domains:\n    mine: {{source: {{path: {path}, fields: {fields}}}}}\n")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"line 10: duplicate id '{data[2]['id']}' (first at line 3)" in err


def test_a_lone_surrogate_and_a_row_over_the_bound_name_their_line_and_field(tmp_path):
    lines = _jsonl_lines(rows(30))
    lines[4] = b'{"id": "s", "q": "1-\\ud800=", "a": "1"}'  # line 5: a lone surrogate escape
    lines[6] = json.dumps({"id": "big", "q": "9-1=", "a": "8", "pad": "x" * 4_000_000}).encode()  # line 7: 4 MB
    lines[8] = b'{"id": "m", "q": "2-1=", "a": "1", "meta": [{"k": "\\udfff"}]}'  # line 9: in a nested value
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TaskError) as got:
        source_domain("hostile", _spec(path))
    said = str(got.value)
    assert "3 bad rows: line 5: field 'q' holds a lone surrogate \\ud800 at character 2: not text" in said, said
    assert "line 7: row too long: 4,000,0" in said and "over the bound of 1,048,576 per row" in said, said
    assert "line 9: field 'meta[0].k' holds a lone surrogate" in said, said
    bigger = DomainSpec.model_validate(
        {"source": {"path": str(path), "fields": FIELDS, "max_row_bytes": 8_000_000}, "verifier": "numeric"}
    )
    with pytest.raises(TaskError, match="2 bad rows: line 5: .*line 9: "):  # a larger bound takes the long row
        source_domain("hostile2", bigger)


def test_a_csv_record_over_the_bound_names_its_line_and_the_next_rows_read(tmp_path):
    path = tmp_path / "long.csv"
    data = rows(30)
    data[3]["q"] = "y" * 2_000_000  # line 5 (the header is 1)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    with pytest.raises(TaskError, match=r"1 bad rows: line 5: row too long: 2,000,0\d\d bytes"):
        source_domain("longcsv", _spec(path))
