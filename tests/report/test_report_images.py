"""The report's sample table shows an image task's image (issue 40 item 5): eval_samples.jsonl
names it by sha256, the report draws it again from the task id (report/taskimages.py) and shows
it inline, small, beside the model's answer and the gold; an image the family no longer draws as
recorded is named, never shown in its place."""

from __future__ import annotations

import base64
import html
import json

from test_report_dashboard import _item, _run, no_plots  # noqa: F401 - no_plots is a fixture

from posttrain.domains.registry import get
from posttrain.report import dashboard, write_report
from posttrain.report.data import load_run


def _src(image) -> str:
    return 'src="data:image/png;base64,' + base64.b64encode(image.png).decode() + '"'


def _image_run(tmp_path, task_id: str, digests: list[str], completion: str = "<answer>3</answer>", name="vision"):
    run = _run(tmp_path, name)
    item = _item(task_id, 0.0, False, completion) | {"images": digests}
    line = {"step": 0, "eval": "full", "domains": {task_id.split(":")[0]: [item]}}
    (run / "eval_samples.jsonl").write_text(json.dumps(line) + "\n")
    return run


def test_a_vision_sample_shows_its_tasks_image_beside_the_answer_and_the_gold(tmp_path, no_plots):  # noqa: F811
    domain = get("ui")
    task = domain.sample(4, "eval", 2)
    (image,) = task.prompt[0].images
    page = write_report(_image_run(tmp_path, task.id, [image.sha256])).read_text()
    alt = f"{task.id} image 1 ({image.width}x{image.height})"
    assert f'<img class="task" {_src(image)} width="160" alt="{alt}">' in page
    assert f"gold <code>{html.escape(domain.gold(task))}</code>" in page
    assert "&lt;answer&gt;3&lt;/answer&gt;" in page  # the model's answer, in the same cell


def test_a_text_sample_has_no_image_and_no_gold(tmp_path):
    run = _run(tmp_path, "text")
    line = {"step": 0, "eval": "full", "domains": {"add": [_item("add:eval:1:0", 0.0, False, "5")]}}
    (run / "eval_samples.jsonl").write_text(json.dumps(line) + "\n")
    page = dashboard.samples_section(load_run(run))
    assert "<img" not in page and "gold" not in page


def test_an_image_not_drawn_as_recorded_is_named_never_shown(tmp_path):
    task = get("chart").sample(0, "eval", 1)
    page = dashboard.samples_section(load_run(_image_run(tmp_path, task.id, ["0" * 64])))
    assert "<img" not in page
    assert f"no image shown: the chart family now draws other images for {task.id} (recorded 000000000000;" in page
    assert "gold <code>" in page  # the task itself was drawn: its gold is still the gold


def test_a_sample_whose_id_names_no_task_says_why(tmp_path):
    page = dashboard.samples_section(load_run(_image_run(tmp_path, "nosuchfamily:eval:1:0", ["0" * 64])))
    assert "<img" not in page
    assert "no image shown: task nosuchfamily:eval:1:0 cannot be drawn again: unknown domain" in page
    page = dashboard.samples_section(load_run(_image_run(tmp_path, "chart-7", ["0" * 64], name="b")))
    assert "task id &#x27;chart-7&#x27; is not domain:split:level:index" in page


def test_an_evaluation_of_the_vision_model_records_digests_and_its_report_shows_the_images(
    tmp_path,
    tiny_vlm,
    no_plots,  # noqa: F811
):
    """The whole path: the hf engine over a tiny VLM evaluates two held-out drawing items, the
    run's evaluator writes eval_samples.jsonl (digests, no image bytes), the report shows the
    image of each item its table picks."""
    from posttrain.engine.hf import HFEngine
    from posttrain.evaluate.core import EvalOptions, evaluate_heldout
    from posttrain.evaluate.heldout import build_heldout
    from posttrain.evaluate.run import append_samples

    run = _run(tmp_path, "eval")
    heldout = build_heldout({"drawing": 1}, 2, seed=0)
    table = evaluate_heldout(HFEngine.from_pretrained(tiny_vlm, seed=0), heldout, EvalOptions(max_tokens=4))
    append_samples(run / "eval_samples.jsonl", 0, "full", table)
    raw = (run / "eval_samples.jsonl").read_text()
    tasks = [get("drawing").sample(i, "eval", 1) for i in heldout.sets["core:drawing"].indices]
    images = [t.prompt[0].images[0] for t in tasks]
    assert [i["images"] for i in json.loads(raw)["domains"]["drawing"]] == [[i.sha256] for i in images]
    assert base64.b64encode(images[0].png).decode()[:200] not in raw and len(raw) < 2000
    page = write_report(run).read_text()
    p = dashboard.pick(json.loads(raw)["domains"]["drawing"])  # the items the table shows
    shown = {i["task"] for i in (p["best"], p["worst"], p["failure"] and p["failure"]["item"]) if i}
    assert shown and all(_src(i) in page for t, i in zip(tasks, images) if t.id in shown)


def test_a_multi_turn_image_family_evaluates_through_its_episodes_and_its_report_shows_the_chart(
    tmp_path,
    tiny_vlm,
    no_plots,  # noqa: F811
):
    """chart_zoom evaluated multi-turn by the hf engine over the tiny VLM: every turn's request
    carries the task's chart (a request without it would be refused and the item masked), each
    item is scored with its turns counted, eval_samples.jsonl names the prompt's chart by digest,
    and the report draws it again from the task id."""
    from posttrain.engine.hf import HFEngine
    from posttrain.evaluate.core import EvalOptions, evaluate_heldout
    from posttrain.evaluate.heldout import build_heldout
    from posttrain.evaluate.run import append_samples

    run = _run(tmp_path, "zoom")
    heldout = build_heldout({"chart_zoom": 1}, 2, seed=0)
    table = evaluate_heldout(HFEngine.from_pretrained(tiny_vlm, seed=0), heldout, EvalOptions(max_tokens=6))
    result = table.results["chart_zoom"]
    assert result.n == 2 and result.infra_errors == 0 and all(ok is not None for _, ok, _ in result.items)
    assert result.turn_budget == 3 and all(1 <= n <= 3 for n in result.turns)
    append_samples(run / "eval_samples.jsonl", 0, "full", table)
    items = json.loads((run / "eval_samples.jsonl").read_text())["domains"]["chart_zoom"]
    tasks = [get("chart_zoom").sample(i, "eval", 1) for i in heldout.sets["core:chart_zoom"].indices]
    assert [i["images"] for i in items] == [[t.images[0].sha256] for t in tasks]
    assert not any(i.get("reason", "").startswith("config") for i in items), items
    page = write_report(run).read_text()
    assert any(_src(t.images[0]) in page for t in tasks)
