"""The base of the root config's own sections.

Invariant: a section rejects unknown fields and is frozen once built.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """ "; did you mean X?" for the closest of `names` to an unknown `name` (difflib), else ""."""
    close = difflib.get_close_matches(name, sorted(names), n=2)
    return f"; did you mean {' or '.join(close)}?" if close else ""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
