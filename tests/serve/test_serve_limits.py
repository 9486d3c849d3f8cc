"""Request bounds on a real uvicorn server on loopback: body size, nesting depth, prompt
characters and tokens, messages, prompts, n, max_tokens and requests in flight; each
refusal is an OpenAI-shaped 4xx naming its limit, and tokenizing runs off the event loop."""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlparse

import httpx
import pytest
from serve_helpers import running, save_model

from posttrain.configs.serve import ServeConfig
from posttrain.serve.limits import json_depth
from posttrain.serve.server import build_server

LIMITS = {
    "max_body_bytes": 64 * 1024,
    "max_json_depth": 16,
    "max_prompt_chars": 2000,
    "max_prompt_tokens": 100,
    "max_messages": 4,
    "max_prompts": 3,
    "max_n": 2,
    "max_choices": 4,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_model(tmp_path_factory.mktemp("model") / "m", "micro", seed=1)
    app = build_server(ServeConfig(model=str(path), canary={"probe_domains": []}, limits=LIMITS))
    with running(app) as url:
        yield url, app


def _post(url: str, path: str, body: object | bytes, **kw: object) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=raw, headers={"content-type": "application/json"}, timeout=30, **kw)


def _refused(r: httpx.Response, status: int, code: str, field: str, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and f"serve.limits.{field}" in err["message"], err
    if param is not None:
        assert err["param"] == param


def _text(prompt: object, **kw: object) -> dict[str, object]:
    return {"model": "posttrain", "prompt": prompt, "max_tokens": 2, **kw}


def _chat(messages: list[dict[str, object]], **kw: object) -> dict[str, object]:
    return {"model": "posttrain", "messages": messages, "max_tokens": 2, **kw}


def test_json_depth_skips_strings_and_escapes():
    assert json_depth(b"") == 0 and json_depth(b'"x"') == 0
    assert json_depth(b'{"a": [1, [2, {"b": []}]]}') == 5
    assert json_depth(b'{"a": "[[[[{{{{"}') == 1  # brackets in a string are text
    assert json_depth(b'{"a": "\\"[[[", "b": [[]]}') == 3  # an escaped quote does not end the string
    assert json_depth(b'{"a": "\\\\", "b": [[]]}') == 3  # an escaped backslash does not escape the quote
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000


def test_within_limits_is_served(server):
    url, _ = server
    assert _post(url, "/v1/completions", _text("rev ab=", n=2)).status_code == 200
    r = _post(url, "/v1/chat/completions", _chat([{"role": "user", "content": "rev ab="}] * 4))
    assert r.status_code == 200, r.text


def test_body_over_the_limit_by_header_and_by_stream(server):
    url, _ = server
    big = json.dumps(_text("a" * 100_000)).encode()
    _refused(_post(url, "/v1/completions", big), 413, "request_too_large", "max_body_bytes")

    def chunks():  # no Content-Length: the server counts what arrives
        for _ in range(40):
            yield b"x" * 4096

    r = httpx.post(url + "/v1/completions", content=chunks(), timeout=30)
    _refused(r, 413, "request_too_large", "max_body_bytes")
    r = _post(url, "/v1/update_weights", big)  # the admin guard answers before any body is read
    assert r.status_code == 403


def test_deep_nesting_is_a_clean_400(server):
    url, _ = server
    for body in (
        b'{"model": "posttrain", "prompt": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
        b"[" * 60_000,  # unbalanced, deeper than the limit
        b'{"model": "posttrain", "messages": [{"role": "user", "content": ' + b'{"a":' * 20 + b"1" + b"}" * 21 + b"]}",
    ):
        _refused(_post(url, "/v1/completions", body), 400, "nesting_too_deep", "max_json_depth")
    nested_text = _text("[" * 1000 + "]" * 1000)  # the same brackets inside a string are only text
    r = _post(url, "/v1/completions", nested_text)
    _refused(r, 400, "limit_exceeded", "max_prompt_tokens", "prompt")


def test_a_huge_integer_or_a_lone_surrogate_is_a_clean_400(server):
    """Python's json refuses integers of over 4,300 digits with a plain ValueError, and a lone
    surrogate escape decodes to a string the tokenizer cannot take: both are the client's
    mistake, never a 500."""
    url, _ = server
    huge_int = b'{"model": "posttrain", "prompt": "ab", "max_tokens": 2, "seed": ' + b"7" * 5000 + b"}"
    r = _post(url, "/v1/completions", huge_int)
    assert r.status_code == 400 and "4300 digits" in r.json()["error"]["message"], r.text
    lone = b'"x\\ud800y"'
    for path, body in (
        ("/v1/completions", b'{"model": "posttrain", "max_tokens": 2, "prompt": ' + lone + b"}"),
        ("/v1/chat/completions", b'{"model": "posttrain", "messages": [{"role": "user", "content": ' + lone + b"}]}"),
        ("/v1/completions", b'{"model": "posttrain", "max_tokens": 2, "prompt": "ab", "stop": [' + lone + b"]}"),
    ):
        r = _post(url, path, body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text", r.text
    paired = b'{"model": "posttrain", "max_tokens": 2, "prompt": "\\ud83d\\ude00"}'  # an emoji, escaped
    assert _post(url, "/v1/completions", paired).status_code == 200


def test_prompt_characters_tokens_messages_prompts_and_n(server):
    url, _ = server
    comp, chat = "/v1/completions", "/v1/chat/completions"
    _refused(_post(url, comp, _text("a" * 2001)), 400, "limit_exceeded", "max_prompt_chars", "prompt")
    _refused(_post(url, comp, _text(["a" * 500] * 3)), 400, "limit_exceeded", "max_prompt_tokens", "prompt")
    _refused(_post(url, comp, _text(["a" * 800] * 3)), 400, "limit_exceeded", "max_prompt_chars", "prompt")
    _refused(_post(url, comp, _text([4] * 101)), 400, "limit_exceeded", "max_prompt_tokens", "prompt")
    _refused(_post(url, comp, _text([[4, 5]] * 4)), 400, "limit_exceeded", "max_prompts", "prompt")
    _refused(_post(url, comp, _text("rev ab=", n=3)), 400, "limit_exceeded", "max_n", "n")
    _refused(_post(url, comp, _text(["ab", "cd", "ef"], n=2)), 400, "limit_exceeded", "max_choices", "n")
    assert _post(url, comp, _text(["ab", "cd"], n=2)).status_code == 200
    many = [{"role": "user", "content": "x"}] * 5
    _refused(_post(url, chat, _chat(many)), 400, "limit_exceeded", "max_messages", "messages")
    parts = [{"role": "user", "content": [{"type": "text", "text": "x"}] * 5}]
    _refused(_post(url, chat, _chat(parts)), 400, "limit_exceeded", "max_messages", "messages")
    long = [{"role": "user", "content": "y" * 1500}, {"role": "user", "content": "y" * 501}]
    _refused(_post(url, chat, _chat(long)), 400, "limit_exceeded", "max_prompt_chars", "messages")
    tokens = [{"role": "user", "content": "y" * 150}]  # within the characters, over the tokens after the template
    _refused(_post(url, chat, _chat(tokens)), 400, "limit_exceeded", "max_prompt_tokens", "prompt")
    r = _post(url, comp, _text("rev ab=", max_tokens=10_000))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_tokenizing_runs_in_a_worker_thread(server, monkeypatch):
    url, app = server
    tok = app.state.server.router.deployments["v0"].tokenizer
    threads: list[str] = []
    original = tok.encode

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(tok, "encode", spy)
    assert _post(url, "/v1/completions", _text("rev abc=")).status_code == 200
    assert threads and all(name.startswith("serve-work") for name in threads), threads


def test_requests_beyond_max_inflight_get_429_at_once():
    """The Admission middleware around an app that holds its request until released: with
    max_inflight 1, a second request whose body has arrived gets 429 at once; after the first
    ends, the slot is free again. (A body still arriving holds no slot: tests/serve/
    test_serve_connections.py, against the real server process.)"""
    import asyncio

    from posttrain.configs.serve import LimitsConfig
    from posttrain.serve.limits import Admission
    from posttrain.serve.metrics import Counter

    async def scenario() -> list[int]:
        release = asyncio.Event()

        async def inner(scope, receive, send):
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        refused = Counter("refused", "test")
        app = Admission(inner, 1, frozenset({"/v1/completions"}), refused, LimitsConfig.model_validate({}))
        statuses: list[int] = []

        async def call() -> None:
            sent = False

            async def receive():
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": b"{}", "more_body": False}
                await asyncio.Event().wait()

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            scope = {"type": "http", "path": "/v1/completions", "headers": [(b"content-length", b"2")]}
            await app(scope, receive, send)

        first = asyncio.create_task(call())
        while app.inflight == 0:
            await asyncio.sleep(0)
        await call()  # refused at once: the slot is held
        release.set()
        await first
        await call()  # the slot is free again
        assert refused.get(endpoint="/v1/completions", status=429, code="too_many_requests") == 1
        return statuses

    assert asyncio.run(scenario()) == [429, 200, 200]


def test_a_slow_body_gets_408_and_gives_its_place_back(tmp_path):
    path = save_model(tmp_path / "m", "micro", seed=1)
    limits = {"max_inflight": 1, "body_timeout_s": 0.5}
    app = build_server(ServeConfig(model=str(path), canary={"probe_domains": []}, limits=limits))
    with running(app) as url:
        host = urlparse(url)
        with socket.create_connection((host.hostname, host.port), timeout=30) as slow:
            slow.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 1000\r\n\r\n{"
            )
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                part = slow.recv(65536)
                if not part:
                    break
                reply += part
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), reply[:200]
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert _post(url, "/v1/completions", _text("rev ab=")).status_code == 200  # the place is free again
