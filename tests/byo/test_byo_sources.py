"""Task files and data sets as domains: every format gives the same tasks, splits never overlap,
order follows the seed, and bad files are clear errors with line numbers."""

from __future__ import annotations

import csv
import json

import pytest
from byo_testlib import rows, write_jsonl

from posttrain.byo.build import source_domain
from posttrain.configs import load_config
from posttrain.configs.tasks import DomainSpec
from posttrain.errors import ConfigError, TaskError
from posttrain.tasks.pool import TaskPool

FIELDS = {"prompt": "q", "answer": "a", "id": "id", "difficulty": "lvl"}


def _spec(path, **source):
    return DomainSpec.model_validate({"source": {"path": str(path), "fields": FIELDS, **source}, "verifier": "numeric"})


def _all(domain, split):
    return {domain.sample(i, split, lv).id for lv in range(1, domain.levels + 1) for i in range(domain.size(split, lv))}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    data = rows()
    out = {"jsonl": write_jsonl(root / "q.jsonl", data)}
    with open(root / "q.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    out["csv"] = root / "q.csv"
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(data), root / "q.parquet", row_group_size=16)  # several row groups
    out["parquet"] = root / "q.parquet"
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(data).save_to_disk(str(root / "ds"))
    out["datasets"] = root / "ds"
    return out


def test_every_format_gives_the_same_tasks(files):
    seen = {}
    for fmt, path in files.items():
        d = source_domain("same", _spec(path))
        assert d.levels == 2
        tasks = [d.sample(i, s, lv) for s in ("train", "eval") for lv in (1, 2) for i in range(5)]
        seen[fmt] = [(t.id, t.prompt, str(t.reference), t.meta.split, t.meta.difficulty) for t in tasks]
        train, held = _all(d, "train"), _all(d, "eval")
        assert train and held and not train & held and len(train) + len(held) == 120
    assert len({json.dumps(v, default=str) for v in seen.values()}) == 1, "formats disagree"


def test_gold_scores_one_wrong_scores_zero(files):
    from posttrain.types import Episode

    d = source_domain("gw", _spec(files["jsonl"]))
    for i in range(10):
        t = d.sample(i, "train", 1)
        assert d.score(t, Episode(d.gold(t))).value == 1.0
        assert d.score(t, Episode(d.wrong(t))).value == 0.0


def test_split_column_and_datasets_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = rows(40)
    for i, r in enumerate(data):
        r["part"] = "test" if i % 4 == 0 else "train" if i % 4 != 1 else "unused"
    d = source_domain(
        "col",
        DomainSpec.model_validate(
            {"source": {"path": str(write_jsonl(tmp_path / "s.jsonl", data)), "fields": {**FIELDS, "split": "part"}}}
        ),
    )
    assert d.size("eval") == 10 and d.size("train") == 20 and d.index.skipped == 10
    assert all(int(t.split(":r")[1]) % 4 == 0 for t in _all(d, "eval"))
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(data[:30]), "test": datasets.Dataset.from_list(data[30:])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    d2 = source_domain("dd", DomainSpec.model_validate({"source": {"path": str(tmp_path / "dd"), "fields": FIELDS}}))
    assert d2.size("train") == 30 and d2.size("eval") == 10


def test_one_prompt_never_in_both_splits(tmp_path):
    data = rows(20)
    data[1]["q"] = data[0]["q"]
    data[0]["part"], data[1]["part"] = "train", "test"
    for r in data[2:]:
        r["part"] = "train" if int(r["id"][1:]) % 2 else "test"
    d = source_domain(
        "ov",
        DomainSpec.model_validate(
            {"source": {"path": str(write_jsonl(tmp_path / "o.jsonl", data)), "fields": {**FIELDS, "split": "part"}}}
        ),
    )
    assert d.index.overlap == 1
    prompts = {s: {d.sample(i, s, lv).prompt for lv in (1, 2) for i in range(d.size(s, lv))} for s in ("train", "eval")}
    assert not prompts["train"] & prompts["eval"]


def test_order_follows_the_run_seed(files):
    spec = f"{{mine: {{source: {{path: {files['jsonl']}, fields: {{prompt: q, answer: a}}}}, verifier: numeric}}}}"
    cfg = load_config(None, [f"tasks.domains={spec}"]).tasks
    draw = lambda seed: [t.id for t in TaskPool(cfg, seed=seed).draw(12)]  # noqa: E731
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    assert all(t.startswith("mine:") for t in draw(1))


def test_jsonl_is_indexed_by_offset_not_loaded(tmp_path):
    path = write_jsonl(tmp_path / "big.jsonl", rows(400))
    d = source_domain("big", DomainSpec.model_validate({"source": {"path": str(path), "fields": FIELDS}}))
    assert len(d.index.locs) == 400 and d.index.locs.typecode == "q"  # 8 bytes per row, not the rows
    first = d.index.locs[0]
    assert first == 0 and d.index.locs[1] == len(open(path, "rb").readline())


def test_csv_quoted_field_spanning_lines(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text('q,a\n"two\nlines",1\nplain,2\n"x,y",3\n' + "".join(f"p{i},{i}\n" for i in range(30)))
    spec = DomainSpec.model_validate(
        {"source": {"path": str(path), "fields": {"prompt": "q", "answer": "a"}, "eval_percent": 50}}
    )
    d = source_domain("csvm", spec)
    prompts = {d.task_at(p, "train", 1).prompt[-1].content for p in range(len(d.index.locs))}
    assert {"two\nlines", "plain", "x,y"} <= prompts
    assert list(d.index.lines[:3]) == [2, 4, 5]


def test_malformed_rows_name_their_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = [json.dumps(r) for r in rows(30)]
    good[4] = '{"q": "1-1=", "a": '  # line 5: broken JSON
    good[9] = json.dumps({"q": "2-1="})  # line 10: no answer
    path.write_text("\n".join(good) + "\n")
    with pytest.raises(TaskError, match=r"2 bad rows: line 5: not valid JSON.*line 10: missing field 'a'"):
        source_domain("bad", _spec(path))


def test_missing_file_unknown_field_unknown_verifier(tmp_path):
    with pytest.raises(TaskError, match="does not exist"):
        source_domain("nofile", _spec(tmp_path / "nope.jsonl"))
    with pytest.raises(ConfigError, match=r"unknown field 'questoin'; allowed: .*prompt"):
        load_config(None, ["tasks.domains={x: {source: {path: a.jsonl, fields: {questoin: q}}}}"])
    with pytest.raises(ConfigError, match=r"tolerence.*allowed: .*tolerance"):
        load_config(None, ["tasks.domains={x: {source: {path: a.jsonl}, verifier: {name: numeric, tolerence: 1}}}"])
    path = write_jsonl(tmp_path / "q.jsonl", rows(30))
    spec = DomainSpec.model_validate({"source": {"path": str(path), "fields": FIELDS}, "verifier": {"name": "nosuch"}})
    with pytest.raises(ConfigError, match=r"unknown verifier 'nosuch'; known: .*numeric"):
        source_domain("nov", spec)
    with pytest.raises(ConfigError, match="verifier is only for a domain with a source"):
        load_config(None, ["tasks.domains={add: {verifier: exact}}"])


def test_name_taken_by_a_builtin_names_both_origins(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", rows(30))
    cfg = load_config(
        None, [f"tasks.domains={{add: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}}}}}}}"]
    ).tasks
    with pytest.raises(TaskError, match=r"taken by builtin \(posttrain.domains.add\)"):
        TaskPool(cfg)


def test_datasets_missing_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    (tmp_path / "ds").mkdir()
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the extra were not installed
    with pytest.raises(TaskError, match=r"pip install 'posttrain\[data\]'"):
        source_domain("nods", DomainSpec.model_validate({"source": {"path": str(tmp_path / "ds")}}))


def test_messages_system_prompt_and_template(tmp_path):
    data = [
        {"chat": [{"role": "user", "content": f"{i}+{i}="}], "gold": str(2 * i), "sys": "be brief" if i % 2 else ""}
        for i in range(10, 60)
    ]
    path = write_jsonl(tmp_path / "m.jsonl", data)
    spec = DomainSpec.model_validate(
        {
            "source": {
                "path": str(path),
                "fields": {"messages": "chat", "answer": "gold", "system": "sys"},
                "system_prompt": "answer with digits",
                "eval_percent": 30,
            }
        }
    )
    d = source_domain("chat", spec)
    roles = {tuple(m.role for m in d.sample(i, "train", 1).prompt) for i in range(d.size("train"))}
    assert roles == {("system", "user")}
    systems = {d.sample(i, "train", 1).prompt[0].content for i in range(d.size("train"))}
    assert systems == {"be brief", "answer with digits"}
    bad = write_jsonl(tmp_path / "b.jsonl", [{"chat": [{"role": "bot", "content": "x"}], "gold": "1"}] * 3)
    with pytest.raises(TaskError, match=r"line 1: messages\[0\] must be"):
        source_domain(
            "badchat",
            DomainSpec.model_validate({"source": {"path": str(bad), "fields": {"messages": "chat", "answer": "gold"}}}),
        )
    t = source_domain(
        "tpl",
        DomainSpec.model_validate(
            {
                "source": {
                    "path": str(write_jsonl(tmp_path / "t.jsonl", rows(40))),
                    "fields": FIELDS,
                    "template": "Compute: {prompt}",
                }
            }
        ),
    ).sample(0, "train", 1)
    assert t.prompt[-1].content.startswith("Compute: ") and t.prompt[-1].content.endswith("=")


def test_difficulty_column_drives_the_curriculum_levels(files):
    spec = (
        f"{{mine: {{source: {{path: {files['jsonl']}, "
        "fields: {prompt: q, answer: a, difficulty: lvl}}, verifier: numeric}}"
    )
    pool = TaskPool(load_config(None, [f"tasks.domains={spec}"]).tasks, seed=0)
    assert pool.domains["mine"].levels == 2
    for t in pool.draw(20):
        b = int(t.prompt[-1].content.split("-")[1].rstrip("="))
        assert (b >= 5) == (t.meta.difficulty == 2)  # level 2 rows are the ones with lvl 2 (b >= 5)
    for _ in range(40):
        for t in pool.draw(8):
            pool.observe(t, 1.0)
    assert pool.eval_difficulty("mine") == 2  # mastered level 1: the frontier moved up


def test_relative_source_path_is_stored_absolute(tmp_path, monkeypatch):
    # a run's config.yaml carries the absolute path, so `--resume` from another directory finds the file
    write_jsonl(tmp_path / "q.jsonl", rows(4))
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["tasks.domains={mine: {source: {path: q.jsonl}, verifier: exact}}"])
    assert cfg.tasks.domains["mine"].source.path == str(tmp_path / "q.jsonl")


def test_priority_column_sets_each_tasks_priority(tmp_path):
    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.pipeline.scheduler import Scheduler

    data = rows(40)
    for i, r in enumerate(data):
        r["prio"] = "" if i % 2 else str(i % 5)
    spec = DomainSpec.model_validate(
        {"source": {"path": str(write_jsonl(tmp_path / "p.jsonl", data)), "fields": {**FIELDS, "priority": "prio"}}}
    )
    d = source_domain("pri", spec.model_copy(update={"priority": 7}))
    by_id = {r["id"]: r["prio"] for r in data}
    sched = Scheduler(PipelineConfig(), {"pri": 1.0}, {"pri": "short"}, priorities={"pri": 7})
    for i in range(d.size("train", 1)):
        task = d.sample(i, "train", 1)
        cell = by_id[task.id.split(":")[1]]
        assert task.meta.priority == (int(cell) if cell else None)
        assert sched.priority(task) == (int(cell) if cell else 7)  # an empty cell keeps the domain's
    data[3]["prio"] = "high"
    bad = DomainSpec.model_validate(
        {"source": {"path": str(write_jsonl(tmp_path / "b.jsonl", data)), "fields": {**FIELDS, "priority": "prio"}}}
    )
    with pytest.raises((TaskError, ConfigError, ValueError), match="priority"):
        dom = source_domain("bad", bad)
        [dom.sample(i, "train", lv) for lv in (1, 2) for i in range(dom.size("train", lv))]
