"""The Engine contract: chat messages to token ids, token ids to sampled completions.

Invariant: every Completion carries the behaviour policy's per-token
log-probs and the `version` of the weights that produced it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from posttrain.types import Completion, GenerationRequest, Message


class Engine(Protocol):
    version: int
    """Weight version; bumped by every `update_weights`."""

    eos_token_id: int

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """Render chat messages with the model's chat template, ending with
        the assistant's turn opened, as token ids."""

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """For each request, `request.params.n` completions (a group)."""

    def update_weights(self, source: Any) -> int:
        """Load new weights (a state dict or a checkpoint directory);
        returns the new version."""
