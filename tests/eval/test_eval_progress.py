"""An evaluation shows its progress: the samples generated, batch by batch as the engine finishes
them (a long held-out set is not minutes of silence), on a bar that an episode's later turns
extend; a failed call counts nothing; nothing is counted from another thread or where no one listens."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
from pipeline_testlib import ScriptedEngine  # noqa: E402

from posttrain.engine.hf import HFEngine, HFEngineConfig  # noqa: E402
from posttrain.evaluate.core import EvalOptions, evaluate_sets  # noqa: E402
from posttrain.evaluate.heldout import domain_set  # noqa: E402
from posttrain.model.arch import random_model  # noqa: E402
from posttrain.pipeline.play import Play  # noqa: E402
from posttrain.progress import counting_rows, each_reported, rows_done  # noqa: E402
from posttrain.types import SamplingParams  # noqa: E402

ADD = domain_set("add", 1, 6, "core")


class Recorder:
    """The bar interface Play uses (n, total, update, refresh), every update kept."""

    def __init__(self, total: int) -> None:
        self.n, self.total, self.updates, self.totals = 0, total, [], [total]

    def update(self, n: int = 1) -> None:
        self.n += n
        self.updates.append(n)

    def refresh(self) -> None:
        self.totals.append(self.total)


def hf_engine(rows: int) -> HFEngine:
    model, tok = random_model("micro", 0)
    torch.manual_seed(0)
    return HFEngine(model.eval(), tok, seed=0, config=HFEngineConfig(max_batch_rows=rows))


def test_the_hf_engine_reports_each_packed_batch_inside_one_call():
    bar = Recorder(6)
    greedy = SamplingParams(max_tokens=4, temperature=0.0, n=1, seed=0)
    runs = Play(hf_engine(rows=2), greedy, progress=bar).run(ADD.tasks())
    assert len(runs) == 6
    assert bar.updates == [2, 2, 2]  # one engine call (a single token budget), three batches of 2 rows
    assert bar.n == bar.total == 6 and bar.totals == [6]


def test_an_engine_that_reports_nothing_is_counted_when_its_call_returns():
    bar = Recorder(6)
    engine = ScriptedEngine(lambda context, j: "1")
    Play(engine, SamplingParams(max_tokens=4, temperature=0.0, n=2, seed=0), progress=bar).run(ADD.tasks())
    assert bar.updates == [12] and bar.n == 12
    assert bar.total == 12  # 6 tasks x 2 samples: raised from the caller's 6


def test_episodes_later_turns_raise_the_total_and_it_ends_full():
    lookup = domain_set("lookup", 1, 4, "core")
    bar = Recorder(4)

    def agent(context: str, j: int) -> str:  # looks the key up, then answers with what it saw
        import re

        key = re.search(r"value_of:(\w+)\?", context).group(1)
        seen = re.findall(rf"{key}=(\d+)", context)
        return seen[-1] if seen else f"look:{key}"

    Play(ScriptedEngine(agent), SamplingParams(max_tokens=16, temperature=0.0, n=1, seed=0), progress=bar).run(
        lookup.tasks()
    )
    assert bar.updates == [4, 4]  # two turns of four episodes, one engine call each
    assert bar.n == bar.total == 8 and bar.totals[-1] == 8


def test_a_failed_call_is_not_counted():
    bar = Recorder(6)
    engine = ScriptedEngine(lambda context, j: "1", fail_first=1)
    Play(engine, SamplingParams(max_tokens=4, temperature=0.0, n=1, seed=0), progress=bar, sleep=lambda s: None).run(
        ADD.tasks()
    )
    assert engine.calls == 3  # the failed call of six, then its halves (generate_splits)
    assert bar.updates == [3, 3] and bar.n == bar.total == 6


def test_evaluate_sets_with_progress_writes_plain_lines_as_batches_finish(capsys):
    opts = EvalOptions(max_tokens=4, progress=True)
    evaluate_sets(hf_engine(rows=2), {"core:add": ADD}, opts)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("eval ")]
    # the first batch's line, then the closing one (plain lines at most one every 30 s between)
    assert lines[0].startswith("eval 2/6 samples") and lines[-1].startswith("eval 6/6 samples")
    evaluate_sets(hf_engine(rows=2), {"core:add": ADD}, EvalOptions(max_tokens=4))
    assert "eval " not in capsys.readouterr().err  # off by default


def test_rows_are_counted_only_in_the_listening_thread():
    got: list[int] = []
    rows_done(5)  # no listener: nothing happens
    with counting_rows(got.append):
        rows_done(2)
        other = threading.Thread(target=rows_done, args=(7,))  # a server's thread: not this listener's
        other.start()
        other.join()
        assert each_reported(iter("abc"), [1, 2, 3]) == ["a", "b", "c"]
    rows_done(9)
    assert got == [2, 1, 2, 3]
