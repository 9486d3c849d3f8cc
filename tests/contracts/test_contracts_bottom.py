"""The contracts at the bottom (posttrain/contracts): what they require, and what the parts read
from them instead of sniffing (issue 36)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from posttrain.configs.engine import EngineConfig
from posttrain.configs.pipeline import PipelineConfig
from posttrain.contracts import Engine, check_label, label
from posttrain.domains import registry
from posttrain.domains.base import ProceduralDomain
from posttrain.engine.sync import WeightSync
from posttrain.errors import ConfigError
from posttrain.types import Completion, GenerationRequest, Message, Score


class _Counting(Engine):
    """A remote-like engine: declares counters and a close, and no in-process weights."""

    def __init__(self) -> None:
        self.version, self.eos_token_id, self.closed = 0, 0, 0

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        if not messages:
            raise ValueError("no messages")
        return tuple(len(m.content) for m in messages)

    def decode(self, token_ids: Sequence[int]) -> str:
        return ""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return []

    def update_weights(self, source: object) -> int:
        self.version += 1
        return self.version

    def counters(self) -> dict[str, int]:
        return {"restarts": 2}

    def close(self) -> None:
        self.closed += 1


class _Bare(_Counting):
    """An engine that declares none of the optional capabilities: it inherits the contract's."""

    counters = Engine.counters  # type: ignore[assignment]
    close = Engine.close  # type: ignore[assignment]


def test_optional_engine_capabilities_have_the_contracts_defaults():
    bare = _Bare()
    assert bare.in_process is False
    assert bare.counters() == {} and bare.close() is None and bare.end_sessions(["k"]) is None
    out = bare.encode_chats([(Message("user", "abc"),), (), (Message("user", "de"),)])
    assert out[0] == (3,) and out[2] == (2,)
    assert isinstance(out[1], ValueError)  # one prompt's error is its own


def test_weight_sync_reads_declared_counters_and_closes_a_remote_engine(tmp_path):
    engine = _Counting()
    sync = WeightSync(EngineConfig(kind="openai", url="http://127.0.0.1:9", verify_sync="off"), engine, None, tmp_path)
    assert sync.stats() == {"engine_restarts": 2}  # read from Engine.counters, whatever the kind
    sync.close()
    assert engine.closed == 1
    hf_like = _Counting()
    WeightSync(EngineConfig(verify_sync="off"), hf_like, None, tmp_path).close()
    assert hf_like.closed == 0  # an in-process engine lives on with the trainer's module


def test_the_async_mode_detaches_only_an_engine_that_declares_in_process():
    from posttrain.pipeline.step import make_workers

    remote = _Counting()
    workers = make_workers("embedded", PipelineConfig(mode="async"), remote)
    try:
        assert workers.engine is remote and workers.source is None  # generates in its own process: no copy
    finally:
        workers.close()

    class Claims(_Counting):
        in_process = True  # declares in-process weights but is no hf engine: the copy is refused, said

    with pytest.raises(ConfigError, match="in-process hf engine"):
        make_workers("embedded", PipelineConfig(mode="async"), Claims())


class _Unlabelled:
    name = "unlabelled"

    def score(self, task, episode):
        return Score(1.0, passed=True)


def test_a_domain_whose_verifier_has_no_label_is_refused_at_registration(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ORIGINS", dict(registry._ORIGINS))

    class NoLabel(ProceduralDomain):
        name, category = "test_no_label", "test"
        verifier = _Unlabelled()  # type: ignore[assignment]

        def generate(self, rng, difficulty):
            return "1+1=", "2"

    with pytest.raises(TypeError, match=r"domain 'test_no_label'.*has no version"):
        registry.register(NoLabel())
    assert "test_no_label" not in registry._REGISTRY
    NoLabel.verifier = type("Labelled", (_Unlabelled,), {"version": "3"})()  # type: ignore[assignment]
    registry.register(NoLabel())
    assert label(registry._REGISTRY["test_no_label"].verifier) == "unlabelled@3"


@pytest.mark.parametrize(
    ("attrs", "missing"),
    [({"name": "", "version": "1"}, "name"), ({"name": "x", "version": 1}, "version"), ({"name": "x"}, "version")],
)
def test_check_label_names_what_is_missing(attrs, missing):
    verifier = type("V", (), {**attrs, "score": lambda self, t, e: None})()
    with pytest.raises(TypeError, match=rf"domain d: its verifier V has no {missing}\b"):
        check_label(verifier, "domain d")
    check_label(type("W", (), {"name": "w", "version": "1", "score": lambda self, t, e: None})(), "domain d")


def _task(i: int, domain: str = "add"):
    from posttrain.types import Task, TaskMeta

    return Task(f"{domain}:{i}", domain, (Message("user", f"{i}+0="),), str(i), TaskMeta("train", 1, "t", "v1"))


def _group(gid: str, rewards, domain: str = "add"):
    from posttrain.rollout import Rollout

    done = Completion((1,), (2, 3), "x", (-0.1, -0.2), "stop")
    task = _task(int(gid.split("/")[-1]), domain)
    return [
        Rollout(task, done, gid, None if v is None else Score(v, {"outcome": v}, v == 1.0), id=f"{gid}/{k}")
        for k, v in enumerate(rewards)
    ]


def test_the_ledger_accounts_each_returned_group_by_its_cause():
    """DrawLedger.account (moved out of loop.py): masked, filtered, stale, trained, guard, no_signal."""
    from posttrain.pipeline.draws import DrawLedger

    ledger = DrawLedger()
    groups = [
        _group("1:g/0", [None, None]),  # every sample masked
        _group("1:g/1", [1.0, 1.0]),  # uninformative, not kept: filtered
        _group("1:g/2", [1.0, 0.0]),  # informative, not kept: stale
        _group("1:g/3", [1.0, 0.0]),  # kept
    ]
    ids = ledger.drawn([g[0].task for g in groups], 1)
    for draw, g in zip(ids, groups):
        ledger.bind(draw, g[0].group_id)
    ledger.account(1, groups, [groups[3]], "applied")
    fates = {d.group_id: (d.fate, d.reason) for d in ledger._dirty.values()}
    assert fates == {
        "1:g/0": ("dropped", "masked"),
        "1:g/1": ("dropped", "filtered"),
        "1:g/2": ("dropped", "stale"),
        "1:g/3": ("trained", ""),
    }
    for outcome, reason in (("skipped", "guard: skipped (spike)"), ("coasted", "no_signal: coasted")):
        other = DrawLedger()
        other.bind(other.drawn([groups[3][0].task], 2)[0], "1:g/3")
        other.account(2, [groups[3]], [groups[3]], outcome, "spike")
        assert [(d.fate, d.reason) for d in other._dirty.values()] == [("dropped", reason)]
    with pytest.raises(RuntimeError, match="has no draw"):
        DrawLedger().account(1, [groups[0]], [], "applied")


def test_rollout_records_share_each_domains_sampling_and_label():
    from posttrain.contracts import Budget
    from posttrain.trace.rows import rollout_records
    from posttrain.types import SamplingParams

    asked: list[str] = []

    def labels(domain: str) -> str:
        asked.append(domain)
        return f"{domain}_check@2"

    groups = [_group("1:g/0", [1.0, None]), _group("1:g/1", [0.0], domain="sub")]
    rows = rollout_records(groups, SamplingParams(max_tokens=64, n=2), labels, {"add": Budget(tokens=8)})
    assert asked == ["add", "sub"]  # once per domain
    assert [r.verifier for r in rows] == ["add_check@2", "add_check@2", "sub_check@2"]
    assert rows[0].sampling is rows[1].sampling and rows[0].sampling["max_tokens"] == 8  # the domain's budget
    assert rows[2].sampling["max_tokens"] == 64
    assert rows[1].reward is None and rows[1].passed is None and rows[0].id == "1:g/0/0"
