"""`posttrain sft` end to end on the micro base: the assistant-token loss falls, the weights
change, the loss is the mean over assistant tokens only (padding and prompts left out), the
checkpoint is one `posttrain train` reads, and `posttrain train` starts RL from it."""

from __future__ import annotations

import json
import statistics

import pytest
from loopcfg import tiny

from posttrain.cli import main
from posttrain.metrics_log import read_metrics
from posttrain.sft.run import loss_window


def _demos(path, n=96):
    """Demonstrations of `reverse` from its own train-split tasks and gold answers."""
    from posttrain.domains.registry import get

    dom = get("reverse")
    with open(path, "w") as fh:
        for i in range(n):
            task = dom.sample(i, "train", 1)
            chat = [{"role": m.role, "content": m.content} for m in task.prompt]
            fh.write(json.dumps({"messages": [*chat, {"role": "assistant", "content": dom.gold(task)}]}) + "\n")
        for i in range(3):  # three held-out items leak in: the overlap check must count them
            task = dom.sample(i, "eval", 1)
            chat = [{"role": m.role, "content": m.content} for m in task.prompt]
            fh.write(json.dumps({"messages": [*chat, {"role": "assistant", "content": dom.gold(task)}]}) + "\n")
        fh.write("not json\n")  # reported with its line; the rest still train
    return str(path)


SFT = [
    "sft.epochs=4",
    "sft.lr=3e-3",
    "sft.batch_tokens=256",
    "tasks.domains={reverse: {difficulty: 1}}",
    "eval.tasks_per_domain=8",
    "eval.samples=0",
    "eval.above_tasks=0",
    "eval.max_tokens=6",
    "run.threads=1",
    "run.progress=false",
]


@pytest.mark.heavy
def test_sft_then_train(tmp_path, micro_base, capsys):
    from safetensors.torch import load_file

    from posttrain.model.arch import load_model
    from posttrain.trainer.checkpoint import intact_checkpoint

    data = _demos(tmp_path / "demos.jsonl")
    args = [f"sft.data={data}", f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=sft", *SFT]
    assert main(["sft", *args]) == 0
    out = capsys.readouterr().out
    assert "line 100: not valid JSON" in out and "99 demonstrations" in out
    assert "OVERLAP in reverse (3/8)" in out
    run = tmp_path / "sft"
    rows = read_metrics(run / "metrics.jsonl", "sft")
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 8
    first, last = statistics.mean(r["loss"] for r in rows[:3]), statistics.mean(r["loss"] for r in rows[-3:])
    assert last < 0.7 * first, (first, last)
    assert all(r["loss_tokens"] < r["padded_tokens"] for r in rows)  # prompts and padding are out of the loss
    assert (run / "rejected.txt").read_text().count("\n") == 1
    first, last, n = loss_window(rows)
    assert f"loss {first:.4f} -> {last:.4f} (mean over the first and the last {n} step" in out

    ckpt = intact_checkpoint(run, print)  # the format train's resume checks: manifest, sizes, sha256
    assert ckpt.name == f"step_{len(rows):08d}"
    start, tuned = load_file(f"{micro_base}/model.safetensors"), load_file(str(ckpt / "model.safetensors"))
    assert any((start[k] != tuned[k]).any() for k in start), "sft never changed the weights"
    load_model(ckpt)  # a model directory as it stands
    table = json.loads((run / "eval.json").read_text())
    assert set(table["before"]["domains"]) == {"reverse"} and table["after"] is not None
    assert table["sft_overlap"] == {"reverse": {"overlap": 3, "eval_tasks": 8}}

    # the documented path: `posttrain train ... model.path=<the sft checkpoint>`
    train = [*tiny("{reverse: {difficulty: 1}}"), f"model.path={ckpt}", f"run.out_dir={tmp_path}", "run.name=rl"]
    assert main(["train", *train, "run.steps=2"]) == 0
    rl = read_metrics(tmp_path / "rl" / "metrics.jsonl", "train")
    assert [r["step"] for r in rl] == [1, 2]
    config = (tmp_path / "rl" / "config.yaml").read_text()
    assert str(ckpt) in config


def test_the_closing_loss_is_a_token_weighted_mean_over_a_tenth_of_the_steps():
    rows = [{"loss": 4.0, "loss_tokens": 10}, {"loss": 1.0, "loss_tokens": 30}] + [{"loss": 2.0, "loss_tokens": 5}] * 16
    rows += [{"loss": 0.5, "loss_tokens": 2}, {"loss": 0.1, "loss_tokens": 8}]  # 20 steps: windows of 2
    assert loss_window(rows) == pytest.approx(((40 + 30) / 40, (1.0 + 0.8) / 10, 2))
    assert loss_window(rows[:3]) == pytest.approx((4.0, 2.0, 1))  # under 10 steps: the first and the last step
    assert loss_window(rows[:1]) == pytest.approx((4.0, 4.0, 1))


@pytest.mark.parametrize("split", [False, True], ids=["whole-logits", "head-in-chunks"])
def test_loss_is_the_mean_over_assistant_tokens(micro_base, split):
    """The batched, padded step's loss equals the mean negative log-likelihood of the assistant
    tokens computed row by row without padding (worked out here from the logits), whether the
    step takes the model's whole logits or sends only the assistant positions through the LM
    head, 3 at a time; and the two paths give the same gradient."""
    import copy

    import torch

    from posttrain.model.arch import load_model
    from posttrain.sft.data import render
    from posttrain.sft.run import _step
    from posttrain.trainer.trainer import split_head
    from posttrain.types import Message

    model, tok = load_model(micro_base)
    chats = [
        [Message("user", "rev abc="), Message("assistant", "cba")],
        [Message("user", "sort 3142="), Message("assistant", "1234"), Message("user", "x"), Message("assistant", "y")],
    ]
    demos = [render(tok, c, i, 512) for i, c in enumerate(chats)]
    total, count = 0.0, 0
    with torch.no_grad():
        for d in demos:
            logp = torch.log_softmax(model(input_ids=torch.tensor([d.ids])).logits[0].float(), -1)
            for t in range(1, len(d.ids)):
                if d.mask[t]:
                    total, count = total - float(logp[t - 1, d.ids[t]]), count + 1
    assert count == len("cba") + len("1234") + len("y") + 3  # each turn's <|end|> too
    trained = copy.deepcopy(model)
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    head = split_head(trained) if split else None
    assert (head is not None) == split, "the micro base's head splits from its decoder"
    row = _step(trained, opt, demos, 1e-3, 1.0, tok.pad_token_id, head, 3 if split else None)
    assert row["loss_tokens"] == count
    assert row["loss"] == pytest.approx(total / count, rel=1e-5)
    changed = [n for (n, p), q in zip(model.named_parameters(), trained.parameters()) if not torch.equal(p, q)]
    assert changed, "the step changed no weight"
    if split:  # the same gradient as the whole logits' (an SGD step of rate 1 moves by it)
        moved = []
        for split_it in (False, True):
            sgd = copy.deepcopy(model)
            sgd_head = split_head(sgd) if split_it else None
            _step(sgd, torch.optim.SGD(sgd.parameters()), demos, 1.0, 1e9, tok.pad_token_id, sgd_head, 3)
            moved.append([q.detach() - p for p, q in zip(model.parameters(), sgd.parameters())])
        for name, whole, chunked in zip(dict(model.named_parameters()), *moved):
            assert torch.allclose(whole, chunked, rtol=1e-4, atol=1e-6), name
        assert any(d.abs().max() > 1e-3 for d in moved[0])


def test_bad_data_is_exit_2_and_leaves_no_run(tmp_path, micro_base, capsys):
    missing = tmp_path / "missing.jsonl"
    args = [f"sft.data={missing}", f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=bad", *SFT]
    assert main(["sft", *args]) == 2
    assert "sft.data: task source" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_gradient_checkpointing_is_read_and_leaves_the_losses(tmp_path, micro_base, monkeypatch):
    """`trainer.gradient_checkpointing: true` makes `posttrain sft` recompute the decoder layers
    in backward (the trainer's own switch, called once) and leaves every step's loss and
    gradient norm as without it, up to float rounding."""
    import posttrain.trainer.memory as memory

    calls = []
    real = memory.enable_gradient_checkpointing
    monkeypatch.setattr(memory, "enable_gradient_checkpointing", lambda m: (calls.append(m), real(m)))
    data = _demos(tmp_path / "demos.jsonl", n=24)
    rows = {}
    for ckpt in (False, True):
        name = f"gc-{ckpt}"
        args = [f"sft.data={data}", f"model.path={micro_base}", f"run.out_dir={tmp_path}", f"run.name={name}"]
        more = ["sft.epochs=1", "sft.max_steps=3", "sft.evaluate=false", f"trainer.gradient_checkpointing={ckpt}"]
        assert main(["sft", *args, *SFT, *more]) == 0
        rows[ckpt] = read_metrics(tmp_path / name / "metrics.jsonl", "sft")
    assert len(calls) == 1 and calls[0].is_activation_checkpointing
    assert len(rows[True]) == len(rows[False]) >= 2
    for plain, recomputed in zip(rows[False], rows[True]):
        assert recomputed["loss"] == pytest.approx(plain["loss"], rel=1e-5)
        assert recomputed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)


@pytest.mark.heavy
def test_train_takes_its_before_from_the_sft_run_and_it_is_what_measuring_gives(tmp_path, micro_base, capsys):
    """`eval.before_from=SFT_RUN` with `model.path` its checkpoint: the train run's before is the sft
    run's after, equal item for item to what evaluating the start measures; its step-0 row and
    samples are there. A model.path other than that checkpoint, or other evaluation options, is
    exit 2 naming what differs, and leaves no run directory."""
    from posttrain.trainer.checkpoint import latest_checkpoint

    data = _demos(tmp_path / "demos.jsonl", n=24)
    sft_args = [f"sft.data={data}", f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=sft", *SFT]
    assert main(["sft", *sft_args, "sft.epochs=1"]) == 0
    src, ckpt = tmp_path / "sft", latest_checkpoint(tmp_path / "sft")
    same = [*tiny("{reverse: {difficulty: 1}}"), "eval.samples=0", "eval.above_tasks=0", "run.steps=1"]
    same += [f"run.out_dir={tmp_path}", f"model.path={ckpt}"]
    assert main(["train", *same, "run.name=reused", f"eval.before_from={src}"]) == 0
    assert main(["train", *same, "run.name=measured"]) == 0
    after = json.loads((src / "eval.json").read_text())["after"]
    reused = json.loads((tmp_path / "reused" / "eval.json").read_text())["before"]
    measured = json.loads((tmp_path / "measured" / "eval.json").read_text())["before"]
    assert reused == after
    assert reused["domains"] == measured["domains"] and reused["heldout_version"] == measured["heldout_version"]
    assert "final table of" in capsys.readouterr().out
    row = read_metrics(tmp_path / "reused" / "metrics.jsonl", "eval")[0]
    assert row["step"] == 0 and row["seconds"] == 0.0 and row["domains"] == {"reverse": after["mean_accuracy"]}
    first = json.loads((tmp_path / "reused" / "eval_samples.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["from"] == str(src) and len(first["domains"]["reverse"]) == 8

    bad = {
        "wrong-model": ([f"model.path={micro_base}"], f"set model.path={ckpt}"),
        "wrong-options": (["eval.max_tokens=5"], "max_tokens (6 there, 5 here)"),
    }
    for name, (more, said) in bad.items():
        assert main(["train", *same, *more, f"run.name={name}", f"eval.before_from={src}"]) == 2
        got = capsys.readouterr()
        assert said in got.out + got.err, name
        assert not (tmp_path / name).exists(), name


def test_a_bad_before_from_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """`eval.before_from` naming no run, or a run with no final table, is exit 2 naming it, said
    before the policy is loaded (a planted loader fails the test if reached), no run directory left."""
    import posttrain.loop as loop

    def loaded(cfg):
        raise AssertionError("the model was loaded before eval.before_from was checked")

    monkeypatch.setattr(loop, "_policy", loaded)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "eval.json").write_text(json.dumps({"before": None, "after": None}))
    (unfinished / "config.yaml").write_text("run: {steps: 1}\n")
    cases = {
        "absent": (tmp_path / "absent", "is not a run directory with eval.json and config.yaml"),
        "unfinished": (unfinished, "has no final table (the run did not finish)"),
    }
    for name, (source, said) in cases.items():
        args = [*tiny("{reverse: {difficulty: 1}}"), f"run.out_dir={tmp_path}", f"run.name={name}-run"]
        assert main(["train", *args, f"eval.before_from={source}"]) == 2, name
        got = capsys.readouterr()
        assert said in got.out + got.err, name
        assert not (tmp_path / f"{name}-run").exists(), name
