"""Sandbox configuration (pydantic): backend choice, pool shape, limits.

Invariant: a config names what it accepts. `backend="auto"` picks the
fork-server where posttrain is root and the probe finds every feature it
needs; anything weaker (bubblewrap, unsafe) is used only if named, either as
the backend or in `accept_weaker`. Bad values raise one error naming the field.
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

BackendName = Literal["forkserver", "bwrap", "unsafe"]

DEFAULT_PREIMPORT = (
    "json",
    "re",
    "math",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "random",
    "typing",
    "dataclasses",
    "fractions",
    "decimal",
    "datetime",
    "statistics",
    "copy",
    "operator",
    "array",
    "enum",
    "runpy",
    "traceback",
    "unittest",
)


class SandboxConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    backend: Literal["auto", "forkserver", "bwrap", "unsafe"] = "auto"
    """Which backend runs programs. auto = forkserver where root and fully supported, else an error unless `accept_weaker` names a fallback."""  # noqa: E501 (field docstring = its help text)

    accept_weaker: tuple[BackendName, ...] = ()
    """Backends `auto` may fall back to when the fork-server cannot enforce every limit (e.g. ("bwrap",) on a non-root machine)."""  # noqa: E501 (field docstring = its help text)

    workers: int = Field(2, ge=1, le=512)
    """Warm workers (fork-server) or concurrent one-shot slots (bwrap, unsafe)."""

    acquire_timeout_s: float = Field(120.0, gt=0, le=86_400)
    """How long `run` waits for a free worker (or a domain slot) before raising SandboxError."""

    domain_limits: dict[str, int] = Field(default_factory=dict)
    """Per-domain concurrency caps, e.g. {"code": 2}; domains not named share the pool freely."""

    cpu_weight: int = Field(100, ge=1, le=10_000)
    """CPU weight of the whole sandbox tree, which the scheduler treats as ONE entity next to the processes of posttrain's own cgroup: 100 = the share of one ordinary process (cpu.shares 1024 / cpu.weight 100); use about 100 x workers for the sandbox to keep pace with as many busy processes."""  # noqa: E501 (field docstring = its help text)

    uid_base: int = Field(61_000, ge=1_000, le=2**31 - 1_000_000)
    """Worker slot i runs its tasks as uid/gid uid_base + i (never root); unique per pool owner pid."""

    python: str = sys.executable
    """Interpreter of the fork-server workers and of one-shot Python runs; must live outside /root (mode 0700)."""

    ro_binds: tuple[str, ...] = ()
    """Extra host paths bound read-only at the same path inside the sandbox (the interpreter's prefix is always bound)."""  # noqa: E501 (field docstring = its help text)

    preimport: tuple[str, ...] = DEFAULT_PREIMPORT
    """Modules each fork-server worker imports once, so tasks start warm."""

    grace_s: float = Field(10.0, gt=0, le=600)
    """Parent-side slack over a request's wall limit before the worker is declared hung, killed and replaced."""

    start_timeout_s: float = Field(30.0, gt=0, le=600)
    """How long a new worker may take to become ready."""

    @field_validator("domain_limits")
    @classmethod
    def _positive_limits(cls, value: dict[str, int]) -> dict[str, int]:
        for name, n in value.items():
            if n < 1:
                raise ValueError(f"domain_limits[{name!r}] must be >= 1, got {n}")
        return value


class SandboxSection(SandboxConfig):
    """The sandbox pool the execute stage runs programs on: the pool's settings
    (backend, workers, per-domain caps, ...) and run-wide caps over the limits
    each domain asks for."""

    max_memory_mb: int | None = Field(None, ge=16, le=1_048_576)
    """Cap on any one program's memory, MiB (None: each domain's own limit)."""
    max_wall_s: float | None = Field(None, gt=0.0, le=86_400.0)
    """Cap on any one program's wall and CPU seconds (None: each domain's own limit)."""

    def pool_config(self) -> SandboxConfig:
        """The pool's part (what `posttrain.sandbox.Pool` takes)."""
        return SandboxConfig(**self.model_dump(exclude={"max_memory_mb", "max_wall_s"}))
