"""What every engine shares: the Engine contract (declared in contracts/engine.py, re-exported
here), rendering a chat with a local tokenizer (`chat_ids`), and the checks every engine makes
on a request before it samples (`check_request`).

A new engine: subclass `Engine`, implement its required members (`version`, `eos_token_id`,
`encode_chat`, `decode`, `generate`, `update_weights`), override the optional capabilities it
has (`in_process`, `encode_chats`, `end_sessions`, `counters`, `close`; `StreamingEngine` for
token callbacks), call `check_request` on each request, and add it to `make_engine`
(engine/sync.py) under a new `engine.kind`. It may import types, errors and configs; the
loop and the pipeline only see the contract. docs/extending.md has the steps.

Invariant: every Completion carries the behaviour policy's per-token
log-probs and the `version` of the weights that produced it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.contracts.engine import Engine as Engine  # the contract, re-exported where engines import it
from posttrain.contracts.engine import OnTokens as OnTokens
from posttrain.contracts.engine import StreamingEngine as StreamingEngine
from posttrain.errors import ConfigError, PromptTooLong
from posttrain.types import GenerationRequest, Message


def text_chat(messages: Sequence[Message]) -> list[dict[str, str]]:
    """`messages` as the role/content dicts a chat template renders; ConfigError for a message
    that carries images (`Message.images`): the text renderers read text only (a vision model's
    hf engine renders images itself, engine/hf.py), and an image refused loudly is never an
    image silently dropped between the task and the model."""
    for i, m in enumerate(messages):
        if m.images:
            raise ConfigError(
                f"messages[{i}] carries {len(m.images)} image(s) ({m.images[0].marker}): this engine reads "
                "text only and would drop them; image tasks need a vision model in the hf engine "
                "(docs/models.md, the vision model)"
            )
    return [{"role": m.role, "content": m.content} for m in messages]


def chat_ids(tokenizer: Any, messages: Sequence[Message]) -> tuple[int, ...]:
    """`messages` rendered by `tokenizer`'s chat template, the assistant's turn opened, as token ids
    (the encode_chat of every engine that holds a local tokenizer). ConfigError for no message, or
    one with images (`text_chat`)."""
    if not messages:
        raise ConfigError("messages is empty: encode_chat needs at least one message")
    out = tokenizer.apply_chat_template(text_chat(messages), add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return tuple(int(i) for i in ids)


def text_only(i: int, req: GenerationRequest) -> None:
    """ConfigError when `requests[i]` carries images: an engine that reads text only refuses
    them rather than drop them."""
    if req.images:
        raise ConfigError(
            f"requests[{i}] carries {len(req.images)} image(s) ({req.images[0].marker}): this engine reads "
            "text only and would drop them (the hf engine reads images with a vision model: docs/models.md)"
        )


def check_request(
    i: int, req: GenerationRequest, vocab: int, max_len: int | None, limit: str, images: bool = False
) -> None:
    """What every engine refuses in `requests[i]` before it samples: an empty prompt, ids outside
    [0, vocab), a prompt of `max_len` tokens or more (PromptTooLong, naming `limit`, what sets
    max_len; None: no limit known), sampling parameters out of range, and images unless the
    engine reads them (`images`: a vision model's hf engine) (ConfigError)."""
    p, where = req.params, f"requests[{i}]"
    if not images:
        text_only(i, req)
    if not req.prompt_ids:
        raise ConfigError(f"{where}.prompt_ids is empty: a prompt needs at least one token")
    bad = [t for t in req.prompt_ids if not (0 <= int(t) < vocab)]
    if bad:
        raise ConfigError(f"{where}.prompt_ids holds ids outside [0, {vocab}): {bad[:5]}")
    if max_len is not None and len(req.prompt_ids) >= max_len:
        raise PromptTooLong(
            f"{where}.prompt_ids has {len(req.prompt_ids)} tokens; {limit} is {max_len}, leaving no room to generate"
        )
    if req.sessions and len(req.sessions) != p.n:
        raise ConfigError(f"{where}.sessions has {len(req.sessions)} keys for n={p.n}: one per sample, or none")
    if p.max_tokens < 1:
        raise ConfigError(f"{where}.params.max_tokens must be >= 1, got {p.max_tokens}")
    if p.n < 1:
        raise ConfigError(f"{where}.params.n must be >= 1, got {p.n}")
    if not (p.temperature >= 0 and p.temperature != float("inf")):
        raise ConfigError(f"{where}.params.temperature must be a finite number >= 0, got {p.temperature}")
    if not (0 < p.top_p <= 1):
        raise ConfigError(f"{where}.params.top_p must be in (0, 1], got {p.top_p}")
    if isinstance(p.stop, str) or not all(isinstance(s, str) for s in p.stop):
        raise ConfigError(f"{where}.params.stop must be a tuple of strings, got {p.stop!r}")
    if any(not s for s in p.stop):
        raise ConfigError(f"{where}.params.stop holds an empty string")
