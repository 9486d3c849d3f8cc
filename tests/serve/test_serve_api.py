"""The server through the official openai client on a real uvicorn server on loopback."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_helpers import running, save_model

from posttrain.configs.serve import ServeConfig
from posttrain.serve.server import build_server

PROMPT = [{"role": "user", "content": "rev abcd="}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_model(tmp_path_factory.mktemp("model") / "m", "micro", seed=1)
    app = build_server(ServeConfig(model=str(path), canary={"probe_domains": []}))
    with running(app) as url:
        yield url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_chat_names_version_and_tier(server):
    _, client = server
    r = client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=6, temperature=0)
    assert r.model == "posttrain@v0:standard" and r.service_tier == "standard"
    assert r.system_fingerprint == "v0-w0"
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0
    assert r.choices[0].finish_reason in ("stop", "length")


def test_fast_tier_greedy_equals_standard(server):
    _, client = server
    outs = {}
    for name, tier in (("posttrain", None), ("posttrain:fast", None), ("posttrain", "fast")):
        r = client.completions.create(
            model=name,
            prompt=[4, 34, 21, 38, 20, 5],
            max_tokens=24,
            temperature=0,
            extra_body={"return_token_ids": True, **({"service_tier": tier} if tier else {})},
        )
        outs[(name, tier)] = (r.service_tier, r.choices[0].model_extra["token_ids"])
    assert outs[("posttrain", None)][0] == "standard"
    assert outs[("posttrain:fast", None)][0] == outs[("posttrain", "fast")][0] == "fast"
    assert len({tuple(ids) for _, ids in outs.values()}) == 1


def test_seeded_sampling_identical_across_tiers(server):
    _, client = server
    ids = [
        client.completions.create(
            model=m,
            prompt=[4, 34, 21, 5],
            max_tokens=16,
            temperature=1.0,
            seed=7,
            extra_body={"return_token_ids": True},
        )
        .choices[0]
        .model_extra["token_ids"]
        for m in ("posttrain", "posttrain:fast")
    ]
    assert ids[0] == ids[1]


def test_completions_logprobs_and_token_ids(server):
    _, client = server
    r = client.completions.create(
        model="posttrain",
        prompt="rev ab=",
        max_tokens=5,
        logprobs=1,
        n=2,
        seed=3,
        extra_body={"return_token_ids": True},
    )
    assert len(r.choices) == 2
    for c in r.choices:
        assert 1 <= len(c.logprobs.token_logprobs) == len(c.model_extra["token_ids"]) <= 5
        assert all(lp <= 0 for lp in c.logprobs.token_logprobs)


def test_streaming_chat_with_final_usage_chunk(server):
    _, client = server
    full = client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="posttrain",
            messages=PROMPT,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.model == "posttrain@v0:standard" for c in chunks)


def test_streaming_completions_fast_tier(server):
    _, client = server
    chunks = list(
        client.completions.create(model="posttrain:fast", prompt="rev abc=", max_tokens=8, temperature=0, stream=True)
    )
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.service_tier == "fast" for c in chunks)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": PROMPT, "temperature": 5}, "temperature"),
        ({"messages": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"messages": PROMPT, "max_tokens": 100000}, "max_tokens"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"messages": PROMPT, "service_tier": "turbo"}, "service_tier"),
    ],
)
def test_bad_requests_get_openai_shaped_400(server, kwargs, param):
    _, client = server
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="posttrain", **kwargs)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == param


def test_unknown_model_is_404(server):
    _, client = server
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=PROMPT)
    assert info.value.body["code"] == "model_not_found"


def test_out_of_vocab_prompt_is_400_and_server_stays_healthy(server):
    url, client = server
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="posttrain", prompt=[1, 2, 99999], max_tokens=3)
    assert httpx.get(url + "/health").status_code == 200


def test_models_health_metrics(server):
    url, client = server
    assert {"posttrain", "posttrain:fast", "posttrain@v0"} <= {m.id for m in client.models.list()}
    h = httpx.get(url + "/health")
    assert h.status_code == 200 and h.json()["stable"] == "v0"
    client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=3)
    text = httpx.get(url + "/metrics").text
    assert "# TYPE posttrain_request_latency_seconds histogram" in text
    assert 'posttrain_requests_total{endpoint="chat",status="200",tier="standard",version="v0"}' in text
    assert 'posttrain_time_to_first_token_seconds_count{tier="standard",version="v0"}' in text
    assert 'posttrain_output_tokens_total{tier="standard",version="v0"}' in text


def test_malformed_json_is_400(server):
    url, _ = server
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_health_503_when_engine_dead(tmp_path):
    path = save_model(tmp_path / "m", "micro")
    app = build_server(ServeConfig(model=str(path), canary={"probe_domains": []}))
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        dep = app.state.server.router.deployments["v0"]

        def dead(*a, **k):
            raise RuntimeError("engine crashed")

        dep.engines["standard"].generate = dead
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=3)
        assert info.value.body["type"] == "server_error"
        h = httpx.get(url + "/health")
        assert h.status_code == 503 and "standard" in h.json()["problems"]
        assert 'posttrain_errors_total{kind="infra",tier="standard",version="v0"} 1' in httpx.get(url + "/metrics").text


def test_streamed_text_respects_stop_strings(server):
    _, client = server
    free = client.completions.create(model="posttrain", prompt="sort 4312=", max_tokens=20, temperature=0)
    text = free.choices[0].text
    if len(text) < 6:
        pytest.skip("the random model ended too early to place a stop string")
    stop = text[3:5]
    full = client.completions.create(model="posttrain", prompt="sort 4312=", max_tokens=20, temperature=0, stop=[stop])
    for model in ("posttrain", "posttrain:fast"):
        chunks = list(
            client.completions.create(
                model=model, prompt="sort 4312=", max_tokens=20, temperature=0, stop=[stop], stream=True
            )
        )
        assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text == text[: text.find(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_logprobs(server):
    _, client = server
    r = client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=5, logprobs=True, seed=1)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(t.logprob <= 0 for t in content)


@pytest.mark.parametrize("damage", ["config.json", "tokenizer_config.json"])
def test_serve_on_a_model_dir_that_does_not_load_is_one_error_line(tmp_path, capsys, damage):
    """Loaded before the server starts: before, the error came out of uvicorn's lifespan as a
    traceback of an exception group."""
    from posttrain.cli import main

    path = save_model(tmp_path / "m", "micro")
    (path / damage).write_text('{"model_type": ')
    capsys.readouterr()  # the save's progress bar
    assert main(["serve", "--model", str(path), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("posttrain serve: error: "), err
    assert err.count("\n") == 1, err
