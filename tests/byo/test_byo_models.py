"""Model-based rewards: a reward model trained here in seconds, and a judge served by `posttrain serve`
over HTTP; both run training steps; judge scores are cached and every call is logged; a judge that is
down is an infra error on every rollout, never reward 0."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from byo_testlib import FakeJudge, rows, train_cfg, write_jsonl

from posttrain.byo.domain import RowRef
from posttrain.byo.verifiers import build_verifier
from posttrain.configs.byo import VerifierSpec
from posttrain.errors import VerifierError
from posttrain.trace import TraceStore
from posttrain.types import Episode, Message, Task, TaskMeta


def _task(answer="7", prompt="10-3=") -> Task:
    return Task("t:1", "t", (Message("user", prompt),), RowRef(answer), TaskMeta("train", 1, "test", "v"))


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory) -> str:
    """A micro Qwen2 sequence classifier trained for a few seconds: completions of digits are good, letters bad."""
    import random

    import torch
    from transformers import Qwen2ForSequenceClassification

    from posttrain.model.arch import make_config
    from posttrain.model.tokenizer import build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    cfg = make_config("micro", len(tok), tok.pad_token_id, tok.eos_token_id)
    cfg.num_labels = 1
    model = Qwen2ForSequenceClassification(cfg)
    rng = random.Random(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        good = ["10-3=\n" + "".join(rng.choices("0123456789", k=rng.randint(1, 3))) for _ in range(8)]
        bad = ["10-3=\n" + "".join(rng.choices("abcdefgh", k=rng.randint(1, 3))) for _ in range(8)]
        enc = tok(good + bad, return_tensors="pt", padding=True)
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([1.0] * 8 + [0.0] * 8))
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = tmp_path_factory.mktemp("rm") / "rm"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_reward_model_scores_and_trains(tmp_path, micro_base, reward_model):
    from posttrain.loop import train

    v = build_verifier(VerifierSpec.model_validate({"name": "reward_model", "path": reward_model}))
    assert v.score(_task(), Episode("42")).value > 0.7 > 0.3 > v.score(_task(), Episode("abc")).value
    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    domains = (
        f"{{rm: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}, "
        f"verifier: {{name: reward_model, path: {reward_model}}}}}}}"
    )
    result = train(train_cfg(tmp_path, micro_base, "rm", domains, "run.steps=2"), log=lambda *_: None)
    got = TraceStore(result.run_dir / "trace.db").recent(100)
    assert len(got) == 2 * 4 * 4 and all(r["reward"] is not None and 0 < r["reward"] < 1 for r in got)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server(micro_base):
    """`posttrain serve` on the micro base, as a user would start it."""
    import httpx

    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "posttrain.cli",
        "serve",
        "--model",
        micro_base,
        "--port",
        str(port),
        "--set",
        "canary.probe_domains=[]",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("posttrain serve exited")
            time.sleep(0.1)
        yield url + "/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


RUBRIC = (
    "{prompt}{completion}"  # the micro model answers arithmetic with digits (sampled): its first digit is the grade
)


def _judge(url, cache) -> dict:
    return {
        "name": "judge",
        "base_url": url,
        "rubric": RUBRIC,
        "score_pattern": r"(\d)",
        "scale": 9,
        "max_tokens": 4,
        "temperature": 1.0,
        "cache": cache,
    }


def test_judge_caches_and_logs(judge_server, tmp_path):
    from posttrain.byo.models import JudgeCache

    db = tmp_path / "judge.sqlite"
    v = build_verifier(VerifierSpec.model_validate(_judge(judge_server, str(db))))
    outcomes = []
    for completion in ("7", "7", "12"):
        try:
            outcomes.append(v.score(_task(), Episode(completion)))
        except VerifierError as exc:  # the judge down: infra (a reply without a verdict is an abstention, scored 0)
            outcomes.append(exc)
    calls = JudgeCache(db).calls()
    assert len(calls) == 3 and [c["cached"] for c in calls][:2] in ([0, 1], [0, 0])
    if not isinstance(outcomes[0], Exception):
        assert outcomes[1].value == outcomes[0].value and "cached" in outcomes[1].reason
        assert calls[0]["key"] == calls[1]["key"] and calls[0]["key"] in outcomes[0].reason
    off = build_verifier(VerifierSpec.model_validate(_judge(judge_server, False)))
    assert off.cache is None


def test_judge_domain_trains_over_http(tmp_path, micro_base):
    """Two training steps judged over HTTP by a judge that grades with a verdict tag
    (the micro model cannot write one: with it every call is a judge failure)."""
    from posttrain.byo.models import JudgeCache
    from posttrain.loop import train

    judge = FakeJudge()
    judge.policy = lambda request, nonce: f'<verdict id="{nonce}">{len(request) % 10}</verdict>'
    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    db = tmp_path / "j.sqlite"
    domains = (
        f"{{judged: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}, "
        f"verifier: {{name: judge, base_url: '{judge.url}', rubric: '{RUBRIC}', score_pattern: '(\\d)', "
        f"scale: 9, max_tokens: 4, temperature: 1.0, cache: '{db}'}}}}}}"
    )
    try:
        result = train(train_cfg(tmp_path, micro_base, "judge", domains, "run.steps=2"), log=lambda *_: None)
    finally:
        judge.close()
    got = TraceStore(result.run_dir / "trace.db").recent(100)
    assert len(got) == 32 and judge.requests
    assert all(r["reward"] is not None and r["error_kind"] is None for r in got)
    keys = {c["key"] for c in JudgeCache(db).calls()}
    assert all(r["reason"].split(" key ")[1].split()[0] in keys for r in got)


@pytest.mark.heavy
def test_judge_down_is_an_infra_error_in_training(tmp_path, micro_base):
    from posttrain.loop import train

    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens here
    v = build_verifier(VerifierSpec.model_validate({**_judge(url, False), "retries": 0}))
    with pytest.raises(VerifierError, match="judge .*failed"):
        v.score(_task(), Episode("1"))
    path = write_jsonl(tmp_path / "q.jsonl", rows(60))
    domains = (
        f"{{judged: {{source: {{path: {path}, fields: {{prompt: q, answer: a}}, eval_percent: 20}}, "
        f"verifier: {{name: judge, base_url: '{url}', rubric: '{RUBRIC}', retries: 0, cache: false}}}}, "
        f"add: {{difficulty: 1}}}}"
    )
    result = train(train_cfg(tmp_path, micro_base, "down", domains, "run.steps=1"), log=lambda *_: None)
    got = [r for r in TraceStore(result.run_dir / "trace.db").recent(100) if r["domain"] == "judged"]
    assert got and all(r["reward"] is None and r["error_kind"] == "verifier" for r in got)
