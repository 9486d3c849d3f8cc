"""Demonstrations for supervised fine-tuning: read, rendered through the model's chat template,
masked to the assistant's tokens, batched by length.

Invariant: a demonstration's tokens are exactly the model's chat template applied to its
messages (the template rollouts are rendered with, `engine.base.chat_ids`), and its loss mask
is true on the tokens of its assistant turns only (their content and the end-of-turn token the
template closes them with), never on a system, user or tool token, nor on the `<|assistant|>`
opener a rollout's prompt already ends with. A row that cannot train (not JSON, no messages, a
bad role, no assistant turn, too long) is reported with its line and reason, and every other row
is kept: one bad line never costs a good one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.byo.sources import open_source
from posttrain.configs.byo import FieldMap, SourceConfig
from posttrain.configs.sft import SftSection
from posttrain.engine.base import chat_ids
from posttrain.errors import ConfigError, TaskError
from posttrain.types import Message

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Demo:
    """One rendered demonstration: its tokens, and which of them the loss is on."""

    line: int
    """The row's line in the file (row number for Parquet and `datasets`)."""
    ids: tuple[int, ...]
    mask: tuple[bool, ...]
    """True at the tokens of assistant turns (each is predicted from the position before it)."""

    @property
    def loss_tokens(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True)
class BadRow:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass(frozen=True)
class Demos:
    """What a demonstrations file gave: the rows that train, the rows that cannot, and the unit
    (line or row) their numbers count."""

    path: str
    demos: tuple[Demo, ...]
    bad: tuple[BadRow, ...]
    unit: str = "line"

    def summary(self) -> str:
        tokens = sum(len(d.ids) for d in self.demos)
        loss = sum(d.loss_tokens for d in self.demos)
        return (
            f"{self.path}: {len(self.demos)} demonstrations ({tokens} tokens, {loss} of them assistant tokens "
            f"under the loss), {len(self.bad)} {self.unit}s rejected"
        )


def load_demos(cfg: SftSection, tokenizer: Any, max_positions: int | None = None) -> Demos:
    """Every row of `cfg.data`, rendered, or rejected with its line. A missing file, or a file of
    which no row can train, is a ConfigError; so is any bad row under `cfg.strict`."""
    if cfg.data is None:
        raise ConfigError("sft.data: give the demonstrations file (JSONL of {'messages': [...]}, CSV, Parquet)")
    source = SourceConfig(path=cfg.data, format=cfg.format, fields=FieldMap(prompt=None, messages=cfg.messages_field))
    try:
        path, reader = open_source(source)
    except TaskError as exc:
        raise ConfigError(f"sft.data: {exc}") from None
    limit = min(cfg.max_length, max_positions) if max_positions else cfg.max_length
    demos: list[Demo] = []
    bad: list[BadRow] = []
    for raw in reader.scan():
        if raw.data is None:
            bad.append(BadRow(raw.line, raw.error or "unreadable row"))
            continue
        try:
            demos.append(render(tokenizer, parse_messages(raw.data, cfg.messages_field), raw.line, limit))
        except ValueError as exc:
            bad.append(BadRow(raw.line, str(exc)))
    found = Demos(path, tuple(demos), tuple(bad), reader.unit)
    if bad and cfg.strict:
        raise ConfigError(f"sft.data: {path}: {len(bad)} bad {reader.unit}s (sft.strict): " + "; ".join(map(str, bad)))
    if not demos:
        why = "; ".join(map(str, bad[:10])) or "it is empty"
        raise ConfigError(f"sft.data: {path}: no demonstration can train: {why}")
    return found


def parse_messages(row: dict[str, Any], field: str) -> list[Message]:
    """The row's chat as Messages; a ValueError naming what is wrong (missing column, a message
    that is not {role, content}, an unknown role, no assistant turn)."""
    from posttrain.byo.sources import json_cell

    if field not in row:
        raise ValueError(f"no {field!r} column (columns: {', '.join(sorted(map(str, row))) or 'none'})")
    value = json_cell(row[field])
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field!r} must be a non-empty list of {{role, content}} messages, got {_kind(value)}")
    messages = [_message(i, m) for i, m in enumerate(value)]
    if not any(m.role == "assistant" for m in messages):
        raise ValueError("no assistant turn: a demonstration needs at least one assistant message to learn from")
    if messages[0].role == "assistant":
        raise ValueError("message 0 is an assistant turn with no prompt before it")
    return messages


def _message(i: int, m: Any) -> Message:
    if not isinstance(m, dict):
        raise ValueError(f"message {i} must be an object {{role, content}}, got {_kind(m)}")
    role, content = m.get("role"), m.get("content")
    if role not in ROLES:
        raise ValueError(f"message {i}: role {role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ValueError(f"message {i} ({role}): content must be a string, got {_kind(content)}")
    return Message(role, content)


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else type(value).__name__


def render(tokenizer: Any, messages: Sequence[Message], line: int, max_length: int) -> Demo:
    """`messages` through the chat template, the loss mask on each assistant turn's tokens: those
    the conversation up to and including that turn adds after the turn's prompt (`chat_ids` of the
    messages before it, which ends with the assistant's turn opened, as a rollout's prompt does)."""
    ids = _template(tokenizer, messages)
    if len(ids) > max_length:
        raise ValueError(f"too long: {len(ids)} tokens rendered, the limit is {max_length} (sft.max_length)")
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        prompt, through = chat_ids(tokenizer, messages[:i]), _template(tokenizer, messages[: i + 1])
        if through[: len(prompt)] != prompt or ids[: len(through)] != through:
            raise ValueError(
                f"message {i}: the chat template does not render this turn's prompt as a prefix of the "
                "conversation, so its tokens cannot be told apart"
            )
        if len(through) == len(prompt):
            raise ValueError(f"message {i}: the assistant turn renders to no tokens")
        mask[len(prompt) : len(through)] = [True] * (len(through) - len(prompt))
    return Demo(line, ids, tuple(mask))


def _template(tokenizer: Any, messages: Sequence[Message]) -> tuple[int, ...]:
    out = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=False, tokenize=True
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return tuple(int(i) for i in ids)


def length_batches(demos: Sequence[Demo], batch_tokens: int, seed: int) -> list[list[Demo]]:
    """One epoch's batches: the demonstrations sorted by length (ties in a seeded order), cut into
    runs whose padded size (rows x longest) stays within `batch_tokens`, the batches in a seeded
    order. Every demonstration is in exactly one batch."""
    rng = random.Random(seed)
    order = list(demos)
    rng.shuffle(order)
    order.sort(key=lambda d: len(d.ids))
    batches = list(_cut(order, batch_tokens))
    rng.shuffle(batches)
    return batches


def _cut(order: Sequence[Demo], batch_tokens: int) -> Iterator[list[Demo]]:
    batch: list[Demo] = []
    for demo in order:  # ascending length: the newest row is the longest of its batch
        if batch and (len(batch) + 1) * len(demo.ids) > batch_tokens:
            yield batch
            batch = []
        batch.append(demo)
    if batch:
        yield batch
