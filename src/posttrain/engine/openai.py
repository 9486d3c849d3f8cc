"""The `openai` engine: the Engine contract over any OpenAI-compatible server.

Invariant: every Completion carries the server's own token ids and per-token
log-probs of the sampled tokens (never re-tokenised text when the server
returns ids), and `model_version` as the server reported it. Requests go to
`/v1/completions` with the prompt as token ids, `logprobs: 1` and
`return_token_ids: true` (a posttrain extension, also understood by vLLM);
where a server returns no ids, the logprob token strings are mapped back
through the local tokenizer, and a string that is not exactly one token is a
GenerationError, never a silent guess. Every completion is screened
(engine/validate.py) before it is returned, and its text is then decoded here
from its ids (cut before the first stop string), never the server's own text.
Transport failures and 5xx answers are retried, then raised as
GenerationError (infra, never reward 0); every call is bounded in all by
`timeout_s` (engine/http.py). Weight
updates carry the admin token (`admin_token`, else POSTTRAIN_ADMIN_TOKEN) as
their bearer token, every other request `api_key`.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from posttrain.engine.base import Engine, chat_ids, text_only
from posttrain.engine.validate import screen
from posttrain.errors import ConfigError, GenerationError, ServerUnavailable
from posttrain.progress import each_reported
from posttrain.types import Completion, GenerationRequest, Message

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class OpenAIEngine(Engine):
    """Engine over `base_url` (e.g. http://host:8000/v1); `tokenizer` renders chats locally."""

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        api_key: str = "none",
        timeout_s: float = 120.0,
        retries: int = 2,
        concurrency: int = 16,
        admin_token: str | None = None,
    ) -> None:
        from posttrain.configs.serve import admin_token as env_admin_token
        from posttrain.engine import http

        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"openai engine: base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model, self.tokenizer, self.retries = model, tokenizer, retries
        self.eos_token_id = int(tokenizer.eos_token_id) if tokenizer is not None else -1  # None: chat() only
        self.version = 0
        self._admin_token = admin_token or env_admin_token(None) or api_key
        self._client = http.client(timeout_s, concurrency, headers={"Authorization": f"Bearer {api_key}"})
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai-engine")

    @classmethod
    def from_model_dir(cls, base_url: str, model: str, model_dir: str | Path, **kw: Any) -> OpenAIEngine:
        """An engine whose tokenizer is loaded from a local model directory."""
        from posttrain.model.arch import load_tokenizer

        return cls(base_url, model, load_tokenizer(model_dir), **kw)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._client.close()

    # -- Engine contract --------------------------------------------------
    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return chat_ids(self.tokenizer, messages)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Each request's completions, screened (engine/validate.py): the server's ids, vocabulary
        and weight version checked against what this engine knows; a request with images refused."""
        for i, req in enumerate(requests):
            text_only(i, req)
        version = self.version
        outs = each_reported(self._pool.map(self._one, requests), [r.params.n for r in requests])
        return decoded(requests, screen(requests, outs, len(self.tokenizer), (version, self.version)), self.decode)

    def chat(
        self, messages: Sequence[Message], max_tokens: int = 16, temperature: float = 0.0, seed: int | None = None
    ) -> str:
        """The text of one `/chat/completions` answer (judges and other text-only callers; no tokenizer needed)."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
        }
        if seed is not None:
            body["seed"] = seed
        choices = self._post("/chat/completions", body).get("choices") or []
        if not choices or not isinstance(choices[0].get("message"), dict):
            raise GenerationError("openai engine: /chat/completions returned no message")
        return str(choices[0]["message"].get("content") or "")

    def update_weights(self, source: Any) -> int:
        """Ask the server to load a checkpoint directory it can read; returns the new version."""
        if not isinstance(source, (str, Path)):
            raise ConfigError(
                "openai engine: update_weights takes a checkpoint directory path the server can read, "
                f"got {type(source).__name__}"
            )
        auth = {"Authorization": f"Bearer {self._admin_token}"}
        data = self._post("/update_weights", {"path": str(source)}, headers=auth)
        self.version = int(data.get("weights", self.version + 1))
        return self.version

    # -- wire -------------------------------------------------------------
    def _one(self, req: GenerationRequest) -> list[Completion]:
        data = self._post("/completions", completion_body(self.model, req))
        return parse_choices(req, data, _weights_version(data, self.version), self._token_id)

    def _token_id(self, token: str) -> int:
        m = _TOKEN_ID.match(token)
        if m:
            return int(m.group(1))
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise GenerationError(
                f"openai engine: server returned no token ids and token {token!r} "
                f"is {len(ids)} local tokens; serve with return_token_ids support"
            )
        return int(ids[0])

    def _post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        last: str = ""
        for attempt in range(self.retries + 1):
            try:
                return post_json(self._client, self.base_url + path, body, headers=headers)
            except ServerUnavailable as exc:
                last = str(exc)
            time.sleep(0.2 * 2**attempt)
        raise GenerationError(f"openai engine: {path} failed after {self.retries + 1} attempts: {last}")


def completion_body(model: str, req: GenerationRequest, seed: int | None = None) -> dict[str, Any]:
    """The `/v1/completions` body of one request: its prompt as token ids, its sampling
    parameters, `logprobs: 1` and `return_token_ids`; `seed` (else the request's own) when set."""
    p = req.params
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(req.prompt_ids),
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "n": p.n,
        "logprobs": 1,
        "return_token_ids": True,
    }
    seed = p.seed if seed is None else seed
    if seed is not None:
        body["seed"] = seed
    if p.stop:
        body["stop"] = list(p.stop)
    return body


def parse_choices(
    req: GenerationRequest,
    data: Mapping[str, Any],
    version: int,
    token_id: Callable[[str], int],
    decode: Callable[[Sequence[int]], str] | None = None,
) -> list[Completion]:
    """The `params.n` Completions of a `/v1/completions` answer, in choice order, each tagged
    `version`. Token ids are the server's (`token_id` maps a logprob token string where it sent
    none); `decode`, when given, makes the text from the ids locally (else the server's text)."""
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != req.params.n:
        raise GenerationError(f"engine: asked for n={req.params.n} choices, server returned {len(choices)}")
    return [_completion(req, c, version, token_id, decode) for c in choices]


def _completion(
    req: GenerationRequest,
    choice: Mapping[str, Any],
    version: int,
    token_id: Callable[[str], int],
    decode: Callable[[Sequence[int]], str] | None,
) -> Completion:
    lp = choice.get("logprobs") or {}
    logprobs = [float(x) if x is not None else float("nan") for x in lp.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:
        ids = [token_id(t) for t in lp.get("tokens") or []]
    finish = choice.get("finish_reason") or "length"
    token_ids = tuple(int(i) for i in ids)
    return Completion(
        prompt_ids=tuple(req.prompt_ids),
        token_ids=token_ids,
        text=choice.get("text", "") if decode is None else decode(token_ids),
        logprobs=tuple(logprobs),
        finish_reason=finish if finish in ("stop", "length") else "error",
        model_version=version,
    )


def decoded(
    requests: Sequence[GenerationRequest], outs: Sequence[Sequence[Completion]], decode: Callable[[Sequence[int]], str]
) -> list[list[Completion]]:
    """Screened completions (engine/validate.py) with their text decoded here from their ids and
    cut before the first stop string, as the hf engine cuts it (the ids stay the server's, the stop
    string's tokens included); a refused one stays empty."""
    return [[c if c.fault else _trim_stop(c, decode(c.token_ids), req.params.stop) for c in group]
            for req, group in zip(requests, outs)]  # fmt: skip


def _trim_stop(c: Completion, text: str, stop: Sequence[str]) -> Completion:
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    return dataclasses.replace(c, text=text[:cut])


def post_json(
    client: Any,
    url: str,
    body: Mapping[str, Any],
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
    params: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One POST of `body` to `url` (query `params`); its JSON answer ({} for an empty body,
    {"text": ...} for a plain-text one). A transport failure, a timeout or a 5xx is
    ServerUnavailable (worth a retry); a 4xx is GenerationError (the same request fails again)."""
    import httpx

    kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if params:
        kw["params"] = dict(params)
    try:
        resp = client.post(url, json=body, headers=headers, **kw)
    except httpx.HTTPError as exc:
        raise ServerUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code < 400:
        try:
            return resp.json() if resp.content else {}
        except ValueError:  # a plain-text success (vLLM's adapter routes)
            return {"text": resp.text}
    last = f"HTTP {resp.status_code}: {_error_message(resp)}"
    if resp.status_code < 500:
        raise GenerationError(f"{url} rejected the request: {last}")
    raise ServerUnavailable(f"{url}: {last}")


def _error_message(resp: Any) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except Exception:  # noqa: BLE001 - any non-OpenAI body
        return resp.text[:200]


def _weights_version(data: Mapping[str, Any], default: int) -> int:
    """The weight version from a posttrain fingerprint `vN-wK`, else `default`."""
    fp = str(data.get("system_fingerprint") or "")
    m = re.search(r"-w(\d+)$", fp)
    return int(m.group(1)) if m else default
