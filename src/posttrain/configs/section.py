"""The base of the root config's own sections.

Invariant: a section rejects unknown fields and is frozen once built.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """ "; did you mean X?" for the closest of `names` to an unknown `name` (difflib), else ""."""
    close = difflib.get_close_matches(name, sorted(names), n=2)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the section holding the (unknown) field at `loc` under `model`, sorted
    ([] when a step of `loc` is not a nested section)."""
    node: Any = model
    for part in loc[:-1]:
        field = getattr(node, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return []
        node = field.annotation
    return sorted(getattr(node, "model_fields", {}))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
