"""Fakes at the engine seam for pipeline tests (the real HF engine is tested in tests/engine)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from posttrain.engine.base import Engine
from posttrain.errors import GenerationError
from posttrain.types import Completion, GenerationRequest, Message


class ScriptedEngine(Engine):
    """Character-level engine whose samples come from `policy(context_text, sample_index)`.

    The chat rendering mirrors the embedded template (<|role|>content, assistant
    turns closed by <|end|>), so multi-turn token bookkeeping is exercised for real."""

    END = 3

    def __init__(
        self,
        policy: Callable[[str, int], str],
        delay_s: float = 0.0,
        fail_first: int = 0,
        hang_first: int = 0,
        hang_s: float = 0.0,
    ) -> None:
        self.policy = policy
        self.version = 0
        self.eos_token_id = self.END
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.hang_first, self.hang_s = hang_first, hang_s
        self.calls = 0
        self._lock = threading.Lock()

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        text = ""
        for m in messages:
            text += f"<|{m.role}|>{m.content}" + ("\x03" if m.role == "assistant" else "")
        return self.encode(text + "<|assistant|>")

    @staticmethod
    def encode(text: str) -> tuple[int, ...]:
        return tuple(ord(c) + 10 for c in text)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 10) for i in ids if i != self.END)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        with self._lock:
            self.calls += 1
            call = self.calls
        if call <= self.fail_first:
            raise GenerationError(f"scripted engine failure {call}")
        if call <= self.hang_first:
            time.sleep(self.hang_s)
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for req in requests:
            context = self.decode(req.prompt_ids)
            group = []
            for j in range(req.params.n):
                text = self.policy(context, j)
                ids = self.encode(text) + (self.END,)
                group.append(Completion(req.prompt_ids, ids, text, (-0.5,) * len(ids), "stop", self.version))
            out.append(group)
        return out

    def update_weights(self, source=None) -> int:
        self.version += 1
        return self.version
