"""The hf engine's session cache: an episode's KV cache kept between its turns.

Invariant: a kept session holds the keys and values of exactly the tokens in
its `tokens`, computed under weight version `version` at positions 0..len-1;
the engine reuses one only for a prompt that starts with those tokens
(token-exact) on the same version, and takes it out of the cache when it
does (the turn's own context replaces it). The tokens held never exceed the
budget: storing past it evicts the least recently stored sessions first (and
a session larger than the whole budget is not kept); every eviction, end and
clear is counted. All methods take the cache's own lock for a moment only, so
`end` never waits for a running generation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Session:
    """One sequence's kept context: per layer, keys and values of shape (heads, len(tokens), head_dim)."""

    tokens: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    version: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(frozen=True)
class SessionStats:
    """What the session cache did since the engine was built."""

    hits: int
    """Prompts that started with their session's tokens: only the rest was computed."""
    misses: int
    """Prompts with a session key and no kept session (first turn, evicted, ended, or a new
    weight version)."""
    diverged: int
    """Prompts whose kept session's tokens were not a prefix of them: computed in full."""
    evicted: int
    """Sessions dropped to keep the tokens held within the budget (or larger than it)."""
    ended: int
    """Sessions dropped because their episode ended (`end`)."""
    held: int
    """Sessions held now."""
    tokens_held: int
    bytes_held: int


class SessionCache:
    """Kept sessions by key, least recently stored first, within `budget_tokens`."""

    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens < 0:
            raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
        self.budget_tokens = budget_tokens
        self._held: OrderedDict[str, Session] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._diverged = self._evicted = self._ended = 0

    def take(self, key: str, prompt: tuple[int, ...], version: int) -> Session | None:
        """The session kept under `key` if `prompt` starts with its tokens and it was computed on
        `version` (taken out of the cache); else None, and a session that does not fit is
        dropped (counted as diverged)."""
        with self._lock:
            got = self._held.pop(key, None)
            if got is None:
                self._misses += 1
                return None
            self._tokens -= len(got.tokens)
            if got.version != version:
                self._misses += 1
                return None
            if len(got.tokens) > len(prompt) or prompt[: len(got.tokens)] != got.tokens:
                self._diverged += 1
                return None
            self._hits += 1
            return got

    def put(self, key: str, session: Session) -> None:
        """Keep `session` under `key` (replacing what was there), evicting the least recently
        stored sessions until the tokens held fit the budget."""
        with self._lock:
            old = self._held.pop(key, None)
            if old is not None:
                self._tokens -= len(old.tokens)
            if len(session.tokens) > self.budget_tokens:
                self._evicted += 1
                return
            while self._held and self._tokens + len(session.tokens) > self.budget_tokens:
                _, out = self._held.popitem(last=False)
                self._tokens -= len(out.tokens)
                self._evicted += 1
            self._held[key] = session
            self._tokens += len(session.tokens)

    def end(self, keys: Iterable[str]) -> None:
        """Drop the sessions of episodes that ended (keys not held are ignored)."""
        with self._lock:
            for key in keys:
                got = self._held.pop(key, None)
                if got is not None:
                    self._tokens -= len(got.tokens)
                    self._ended += 1

    def clear(self) -> None:
        """Drop every session (the weights changed: their KV no longer holds)."""
        with self._lock:
            self._held.clear()
            self._tokens = 0

    def stats(self) -> SessionStats:
        with self._lock:
            nbytes = sum(s.nbytes for s in self._held.values())
            return SessionStats(
                self._hits,
                self._misses,
                self._diverged,
                self._evicted,
                self._ended,
                len(self._held),
                self._tokens,
                nbytes,
            )
