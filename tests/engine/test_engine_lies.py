"""An engine that lies is an engine fault, never the model's sample (engine/validate.py, engine/guard.py).

Against a real local HTTP server that posttrain attaches to (the openai engine), which answers
one sample of a group with something no model can produce: that sample alone is refused
(empty, finish "error", the reason named), masked with kind "engine" and counted, never scored
or trained on, while its group-mates are scored; a server that keeps doing it stops the run.
Before engine/validate.py each of these was scored and trained on.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from posttrain.configs.engine import EngineConfig
from posttrain.configs.pipeline import PipelineConfig
from posttrain.configs.trainer import MismatchConfig
from posttrain.domains.registry import get
from posttrain.engine.guard import EngineGuard
from posttrain.engine.openai import OpenAIEngine
from posttrain.errors import EngineFault
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.types import GenerationRequest, SamplingParams

HONEST = "12"
"""What every honest sample answers (its ids encoded by the model's tokenizer)."""
MAX_TOKENS = 8
LIE_AT = 1
"""The sample of each group that lies."""


def _lies(vocab: int) -> dict[str, Callable[[dict[str, Any]], None]]:
    """Each lie: how it changes one choice of a `/v1/completions` answer."""

    def logprob(x: float | None) -> Callable[[dict[str, Any]], None]:
        return lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, x)

    def token(t: int) -> Callable[[dict[str, Any]], None]:
        return lambda c: c["token_ids"].__setitem__(0, t)

    def longer(c: dict[str, Any]) -> None:
        c["token_ids"] = c["token_ids"] * (MAX_TOKENS + 1)
        c["logprobs"]["token_logprobs"] = c["logprobs"]["token_logprobs"] * (MAX_TOKENS + 1)

    return {
        "positive log-prob": logprob(0.7),
        "+inf log-prob": logprob(math.inf),
        "-inf log-prob": logprob(-math.inf),
        "NaN log-prob": logprob(math.nan),
        "null log-prob": logprob(None),
        "id at the vocabulary size": token(vocab),
        "id far past the vocabulary": token(vocab + 10**6),
        "negative id": token(-1),
        "fewer log-probs than ids": lambda c: c["logprobs"]["token_logprobs"].pop(),
        "more tokens than max_tokens": longer,
    }


_EXPECT = {
    "positive log-prob": "impossible log-probs",
    "+inf log-prob": "impossible log-probs",
    "-inf log-prob": "impossible log-probs",
    "NaN log-prob": "impossible log-probs",
    "null log-prob": "impossible log-probs",
    "id at the vocabulary size": "outside the vocabulary",
    "id far past the vocabulary": "outside the vocabulary",
    "negative id": "outside the vocabulary",
    "fewer log-probs than ids": "log-probs",
    "more tokens than max_tokens": "max_tokens",
}


class LyingServer:
    """An OpenAI-compatible `/v1/completions` server on 127.0.0.1 answering every sample HONEST,
    but sample LIE_AT with `lie` applied (None: honest), every sample when `everyone`, and tagging
    the answer with weight version `claims`."""

    def __init__(self, tokenizer: Any) -> None:
        self.ids = list(tokenizer.encode(HONEST, add_special_tokens=False))
        self.lie: Callable[[dict[str, Any]], None] | None = None
        self.everyone = False
        self.claims = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                data = json.dumps(server.answer(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        choices = []
        for i in range(int(body["n"])):
            ids = list(self.ids)
            choice = {"index": i, "text": HONEST, "token_ids": ids, "finish_reason": "stop"}
            choice["logprobs"] = {"token_logprobs": [-0.5] * len(ids), "tokens": [f"token_id:{t}" for t in ids]}
            if self.lie is not None and (self.everyone or i == LIE_AT):
                self.lie(choice)
            choices.append(choice)
        return {"choices": choices, "system_fingerprint": f"posttrain-v1-w{self.claims}"}

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def liar(micro_base) -> Iterator[tuple[LyingServer, OpenAIEngine]]:
    from posttrain.model.arch import load_tokenizer

    tok = load_tokenizer(micro_base)
    server = LyingServer(tok)
    engine = OpenAIEngine(server.url, "posttrain", tok, timeout_s=10, retries=0)
    yield server, engine
    engine.close()
    server.close()


@pytest.fixture
def lie(liar):
    server, _ = liar
    yield server
    server.lie, server.everyone, server.claims = None, False, 0


def _request(n: int = 4) -> GenerationRequest:
    return GenerationRequest((5, 6, 7), SamplingParams(max_tokens=MAX_TOKENS, n=n, seed=0))


@pytest.mark.parametrize("kind", sorted(_EXPECT))
def test_each_lie_refuses_that_sample_alone(liar, lie, kind):
    server, engine = liar
    honest = engine.generate([_request()])[0]
    assert not any(c.fault for c in honest)
    lie.lie = _lies(len(engine.tokenizer))[kind]
    [group] = engine.generate([_request()])
    refused = group[LIE_AT]
    assert refused.fault.startswith("engine fault:") and _EXPECT[kind] in refused.fault, refused.fault
    assert (
        refused.token_ids == () and refused.logprobs == () and refused.text == "" and refused.finish_reason == "error"
    )
    assert [c for i, c in enumerate(group) if i != LIE_AT] == [c for i, c in enumerate(honest) if i != LIE_AT]


def test_a_weight_version_the_engine_never_acknowledged_is_refused(liar, lie):
    _, engine = liar
    lie.claims = 7  # the engine acknowledged version 0 only
    group = engine.generate([_request()])[0]
    assert all("claims weight version 7" in c.fault for c in group)


def _pipeline(engine: OpenAIEngine, tasks: list[Any], n: int = 4) -> tuple[list[Any], dict[str, int]]:
    cfg = PipelineConfig(backoff_s=0.0, max_retries=1)
    names = sorted({t.domain for t in tasks})
    sched = Scheduler(cfg, dict.fromkeys(names, 1.0), {x: get(x).cost_class for x in names})

    async def go() -> tuple[list[Any], dict[str, int]]:
        async with Pipeline(cfg, EmbeddedWorkers(engine), SamplingParams(n=n, max_tokens=MAX_TOKENS), sched) as pipe:
            return await pipe.run_groups(tasks), pipe.stats().counters

    return asyncio.run(go())


def test_a_lying_sample_is_masked_alone_counted_and_never_trained_on(liar, lie):
    from posttrain.trainer.batch import batch_of

    _, engine = liar
    lie.lie = _lies(len(engine.tokenizer))["positive log-prob"]
    task = get("add").sample(0, "train", 1)
    [group], counters = _pipeline(engine, [task])
    refused, mates = group.rollouts[LIE_AT], [r for i, r in enumerate(group.rollouts) if i != LIE_AT]
    assert refused.reward is None and refused.error_kind == "engine" and "impossible log-probs" in refused.error
    assert all(r.reward is not None and r.error_kind is None for r in mates)  # scored, not masked
    assert counters["engine_faults"] == 1 and counters["masked_rollouts"] == 1 and counters["masked_groups"] == 0
    rows = batch_of([list(group.rollouts)], 1.0).rows
    assert len(rows) == 3 and all(max(r.behaviour_logprobs) <= 0 for r in rows)


def test_an_engine_that_keeps_lying_stops_the_run_and_one_lie_does_not(liar, lie):
    _, engine = liar
    tasks = [get("add").sample(i, "train", 1) for i in range(4)]
    cfg = EngineConfig(fault_window=16, fault_stop_share=0.25)
    lie.lie = _lies(len(engine.tokenizer))["NaN log-prob"]
    groups, _ = _pipeline(engine, tasks)  # one lie in each group of 4: 4 of 16
    with pytest.raises(EngineFault, match="refused for 4 of the last 16") as err:
        EngineGuard(cfg, MismatchConfig()).after_step([g.rollouts for g in groups], None)
    assert "impossible log-probs" in str(err.value)
    EngineGuard(cfg, MismatchConfig()).after_step([g.rollouts for g in groups[:3]], None)  # 3 of 12: goes on
