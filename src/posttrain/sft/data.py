"""Demonstrations for supervised fine-tuning: read, rendered through the model's chat template,
masked to the assistant's tokens, batched by length.

Invariant: a demonstration's tokens are exactly the model's chat template applied to its
messages (the template rollouts are rendered with, `engine.base.chat_ids`), and its loss mask
is true on the tokens of its assistant turns only (their content and the end-of-turn token the
template closes them with), never on a system, user or tool token, nor on the `<|assistant|>`
opener a rollout's prompt already ends with, nor on an assistant turn of `"weight": 0`. A row
that cannot train (not JSON, no messages, a bad role or weight, no assistant turn to learn
from, too long, a lone surrogate, a special token spelled in its text) is reported with its
line and reason, and every other row is kept: one bad line never costs a good one. Before any
row is tokenized, its text is bounded (`RowGuard`): a row whose messages hold more bytes than
`max_length` tokens of this tokenizer could ever cover is refused unrendered, and a row whose
text spells one of the tokenizer's special tokens (the chat template's role and end-of-turn
tokens among them) is refused, so a role or end-of-turn token under the loss is only ever one
the template put there, never one that came from data.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.byo.sources import open_source
from posttrain.configs.byo import FieldMap, SourceConfig
from posttrain.configs.sft import SftSection
from posttrain.engine.base import chat_ids
from posttrain.errors import ConfigError, TaskError
from posttrain.types import Message

ROLES = ("system", "user", "assistant", "tool")
MAX_SOURCE_ROW_BYTES = 1 << 28
"""The most `source.max_row_bytes` allows."""
NORMALISER_SLACK = 4
"""How many bytes of text one byte of a token's string may stand for after the tokenizer's
normaliser (NFKC folds a 3-byte fullwidth letter to 1 byte); the pre-tokenization bound allows it."""


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
    limit = min(cfg.max_length, max_positions) if max_positions else cfg.max_length
    guard = RowGuard.of(tokenizer, limit)
    fields = FieldMap(prompt=None, messages=cfg.messages_field)
    bound = min(guard.max_row_bytes, MAX_SOURCE_ROW_BYTES)
    source = SourceConfig(path=cfg.data, format=cfg.format, fields=fields, max_row_bytes=bound)
    try:
        path, reader = open_source(source)
    except TaskError as exc:
        hint = ""
        if not Path(cfg.data).exists():
            hint = (
                "; make demonstrations from a registered domain's own train-split tasks and gold answers with "
                f"`.venv/bin/python scripts/sft_demos.py DOMAIN --n 1000 --out {cfg.data}` "
                "(configs/sft.yaml: DOMAIN rg_basic_arithmetic)"
            )
        raise ConfigError(f"sft.data: {exc}{hint}") from None
    demos: list[Demo] = []
    bad: list[BadRow] = []
    for raw in reader.scan():
        if raw.data is None:
            bad.append(BadRow(raw.line, raw.error or "unreadable row"))
            continue
        try:
            messages, untrained = parse_messages(raw.data, cfg.messages_field)
            guard.check(messages)
            demos.append(render(tokenizer, messages, raw.line, limit, untrained))
        except ValueError as exc:
            bad.append(BadRow(raw.line, str(exc)))
    found = Demos(path, tuple(demos), tuple(bad), reader.unit)
    if bad and cfg.strict:
        raise ConfigError(f"sft.data: {path}: {len(bad)} bad {reader.unit}s (sft.strict): " + "; ".join(map(str, bad)))
    if not demos:
        why = "; ".join(map(str, bad[:10])) or "it is empty"
        raise ConfigError(f"sft.data: {path}: no demonstration can train: {why}")
    return found


@dataclass(frozen=True)
class RowGuard:
    """What a row's text must keep to before it is tokenized: at most `max_text_bytes` bytes of
    message content (`max_length` tokens times the longest token's bytes times NORMALISER_SLACK:
    more cannot render within `max_length`), and none of the tokenizer's special-token strings."""

    max_length: int
    max_text_bytes: int
    specials: re.Pattern[str] | None

    @property
    def max_row_bytes(self) -> int:
        """The reader's bound on one row: its text bound, room for JSON escapes (6 bytes per
        character at most) and the row's structure."""
        return 6 * self.max_text_bytes + 65536

    @classmethod
    def of(cls, tokenizer: Any, max_length: int) -> RowGuard:
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        longest = max((len(str(t).encode("utf-8")) for t in tokens if t is not None), default=1)
        names = set(tokenizer.all_special_tokens)
        names |= {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
        names = {n for n in names if n}
        pattern = re.compile("|".join(map(re.escape, sorted(names, key=len, reverse=True)))) if names else None
        return cls(max_length, max_length * max(1, longest) * NORMALISER_SLACK, pattern)

    def check(self, messages: Sequence[Message]) -> None:
        """A ValueError naming the message when the row is over the text bound or spells a
        special token."""
        size = sum(len(m.content.encode("utf-8")) for m in messages)
        if size > self.max_text_bytes:
            raise ValueError(
                f"too long: {size:,} bytes of text, more than {self.max_length} tokens (sft.max_length or the "
                f"model's positions) can hold with this tokenizer ({self.max_text_bytes:,}); refused untokenized"
            )
        if self.specials is None:
            return
        for i, m in enumerate(messages):
            found = self.specials.search(m.content)
            if found is not None:
                raise ValueError(
                    f"message {i} ({m.role}): its text spells the special token {found.group()!r} of the tokenizer "
                    "(a chat-template role or control token): data may not open or close turns"
                )


def parse_messages(row: dict[str, Any], field: str) -> tuple[list[Message], frozenset[int]]:
    """The row's chat as Messages, and the indices of its assistant messages of `"weight": 0`
    (OpenAI's fine-tuning format: context the later turns see, with no loss of their own, e.g. a
    failed attempt a revision answers); a ValueError naming what is wrong (missing column, a
    message that is not {role, content}, an unknown role, a weight other than 0 or 1 or on another
    role, no assistant turn of weight 1)."""
    from posttrain.byo.sources import json_cell

    if field not in row:
        raise ValueError(f"no {field!r} column (columns: {', '.join(sorted(map(str, row))) or 'none'})")
    value = json_cell(row[field], field)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{field!r} must be a non-empty list of {{role, content}} messages, got {_kind(value)}")
    messages = [_message(i, m) for i, m in enumerate(value)]
    untrained = frozenset(i for i, m in enumerate(value) if m.get("weight", 1) == 0)  # _message checked it
    if not any(m.role == "assistant" and i not in untrained for i, m in enumerate(messages)):
        raise ValueError("no assistant turn to learn from: a demonstration needs an assistant message of weight 1")
    if messages[0].role == "assistant":
        raise ValueError("message 0 is an assistant turn with no prompt before it")
    return messages, untrained


def _message(i: int, m: Any) -> Message:
    if not isinstance(m, dict):
        raise ValueError(f"message {i} must be an object {{role, content}}, got {_kind(m)}")
    role, content = m.get("role"), m.get("content")
    if role not in ROLES:
        raise ValueError(f"message {i}: role {role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ValueError(f"message {i} ({role}): content must be a string, got {_kind(content)}")
    if "weight" in m:
        weight = m["weight"]
        if role != "assistant" or type(weight) is not int or weight not in (0, 1):
            raise ValueError(
                f"message {i} ({role}): weight must be 0 or 1 and only on an assistant message, got {weight!r}"
            )
    return Message(role, content)


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else type(value).__name__


def render(
    tokenizer: Any, messages: Sequence[Message], line: int, max_length: int, skip: frozenset[int] = frozenset()
) -> Demo:
    """`messages` through the chat template, the loss mask on each assistant turn's tokens: those
    the conversation up to and including that turn adds after the turn's prompt (`chat_ids` of the
    messages before it, which ends with the assistant's turn opened, as a rollout's prompt does).
    The assistant turns whose indices are in `skip` (weight 0) stay in the text, off the mask."""
    ids = _template(tokenizer, messages)
    if len(ids) > max_length:
        raise ValueError(f"too long: {len(ids)} tokens rendered, the limit is {max_length} (sft.max_length)")
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m.role != "assistant" or i in skip:
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
