"""The base of the root config's own sections.

Invariant: a section rejects unknown fields and is frozen once built.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
