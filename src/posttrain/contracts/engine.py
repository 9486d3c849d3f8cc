"""The Engine contract: chat messages to token ids, token ids to sampled completions.

Invariant: every Completion carries the behaviour policy's per-token log-probs and the
`version` of the weights that produced it.

An engine subclasses `Engine` (engine/hf.py, engine/vllm.py, engine/openai.py): the
required members have no default; the optional capabilities below do, so an engine that
lacks one inherits the answer "not supported" and the loop reads the declaration, never
the engine's class, module or function identity:

    in_process      True: it samples on the trainer's own module in this process (hf).
                    The async mode then generates on a detached copy; Ray builds its
                    generation actors from its model and tokenizer.
    encode_chats    many prompts at once (default: `encode_chat` one by one, each
                    prompt's error kept as its own).
    counters        integer counters for the metrics row (default: none).
    close           release what the engine holds (default: nothing).
    end_sessions    drop kept episode contexts (default: none are kept).

`StreamingEngine` is the token-callback capability: `generate(requests, on_tokens)` calls
`on_tokens(request index, sample index, new token ids)` as tokens are decoded (the
server's standard and fast tiers stream from it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from posttrain.types import Completion, GenerationRequest, Message

OnTokens = Callable[[int, int, Sequence[int]], None]
"""A token callback: (request index, sample index, new token ids), called in the engine's thread."""


class Engine(Protocol):
    version: int
    """Weight version; bumped by every `update_weights`."""

    eos_token_id: int

    in_process: ClassVar[bool] = False
    """Declared capability: the engine samples on the trainer's module in this process (hf),
    so an update is in place and a detached copy is possible; False: another process or
    server holds the weights (vllm, openai) and gets them by push."""

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """Render chat messages with the model's chat template, ending with
        the assistant's turn opened, as token ids."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """For each request, `request.params.n` completions (a group)."""
        ...

    def update_weights(self, source: Any) -> int:
        """Load new weights (a state dict or a checkpoint directory);
        returns the new version."""
        ...

    def encode_chats(self, prompts: Sequence[Sequence[Message]]) -> list[tuple[int, ...] | Exception]:
        """Each prompt's ids as `encode_chat` gives them, or the error encoding it raised (one
        prompt's error never fails the others). The default encodes prompt by prompt; an
        engine that can batch (hf: one chat-template call) overrides it with the same ids."""
        out: list[tuple[int, ...] | Exception] = []
        for p in prompts:
            try:
                out.append(self.encode_chat(p))
            except Exception as exc:  # noqa: BLE001 - the prompt's own error, returned in its place
                out.append(exc)
        return out

    def end_sessions(self, keys: Sequence[str]) -> None:
        """The episodes `keys` (`GenerationRequest.sessions`) ended: drop what the engine keeps
        for them. The default keeps nothing and does nothing (an engine that keeps contexts,
        hf with context_reuse, overrides it)."""
        return None

    def counters(self) -> Mapping[str, int]:
        """Integer counters the metrics row carries, prefixed `engine_` (vllm: request retries,
        server restarts, pushes, failed push attempts). The default has none."""
        return {}

    def close(self) -> None:
        """Release what the engine holds (a started server, HTTP clients). The default holds nothing."""
        return None


class StreamingEngine(Engine, Protocol):
    """The token-callback capability: an engine whose `generate` reports each decoded token."""

    def generate(
        self, requests: Sequence[GenerationRequest], on_tokens: OnTokens | None = None
    ) -> list[list[Completion]]:
        """As `Engine.generate`; with `on_tokens`, each new token of each sample is reported
        once, in order, as it is decoded (before the call returns)."""
        ...
