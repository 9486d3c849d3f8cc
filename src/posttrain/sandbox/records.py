"""Records that cross the sandbox boundary: limits, a request, a result.

Invariant: every record is frozen and validated on construction (a bad field
raises ValueError naming it); `to_wire`/`from_wire` round-trip through plain
data, which is all the fork-server workers ever see.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Status = Literal["ok", "failed", "timeout", "oom", "killed", "infra_error"]
STATUSES: tuple[str, ...] = ("ok", "failed", "timeout", "oom", "killed", "infra_error")
MiB = 1 << 20
_PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


@dataclass(frozen=True)
class Limits:
    """Per-run limits. Every one is enforced by the fork-server backend; see
    `posttrain sandbox probe` for what the other backends enforce."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 256 * MiB
    pids: int = 64
    disk_bytes: int = 64 * MiB
    file_bytes: int = 32 * MiB
    output_bytes: int = 1 * MiB
    cpus: float = 1.0
    open_files: int = 256

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{f.name} must be a positive number, got {value!r}")
        if self.pids < 2:
            raise ValueError(f"Limits.pids must be at least 2, got {self.pids}")


def _check_rel(path: str, what: str) -> None:
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm.startswith("..") or norm != path or "\0" in path:
        raise ValueError(f"{what} must be a normalised relative path inside the work directory, got {path!r}")


@dataclass(frozen=True)
class ExecRequest:
    """One program run in a fresh sandbox.

    files: written into the work directory (/task) before the run.
    argv: a program and its arguments (looked up on PATH), or
    python_main: a path in `files` run as __main__ by the sandbox's Python
        (in the warm fork-server worker without a new interpreter).
    collect: work-directory paths whose contents come back in `ExecResult.files`.
    packages: what a python_main program may import beyond its work directory and the
        standard library: import or distribution names found in the sandbox
        interpreter's site-packages, each with what it requires (`sandbox.packages`);
        nothing else installed there is importable (`sandbox._imports`).
    """

    files: Mapping[str, bytes | str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    python_main: str | None = None
    stdin: bytes = b""
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = Limits()
    network: Literal["none"] = "none"
    collect: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "collect", tuple(self.collect))
        if isinstance(self.packages, str):
            raise ValueError("ExecRequest.packages must be a tuple of names, not a string")
        object.__setattr__(self, "packages", tuple(self.packages))
        if bool(self.argv) == bool(self.python_main):
            raise ValueError("ExecRequest needs exactly one of argv or python_main")
        if self.python_main is not None:
            _check_rel(self.python_main, "ExecRequest.python_main")
            if self.python_main not in self.files:
                raise ValueError(f"ExecRequest.python_main {self.python_main!r} is not in files")
        for path, data in self.files.items():
            _check_rel(path, "ExecRequest.files key")
            if not isinstance(data, (bytes, str)):
                raise ValueError(f"ExecRequest.files[{path!r}] must be bytes or str")
        for path in self.collect:
            _check_rel(path, "ExecRequest.collect entry")
        for name in self.packages:
            if not isinstance(name, str) or not _PACKAGE.match(name):
                raise ValueError(f"ExecRequest.packages entries must be package names, got {name!r}")
        if self.packages and not self.python_main:
            raise ValueError("ExecRequest.packages applies to python_main programs only")
        if not isinstance(self.stdin, bytes):
            raise ValueError("ExecRequest.stdin must be bytes")
        if self.network != "none":
            raise ValueError(f"ExecRequest.network must be 'none', got {self.network!r}")
        if not isinstance(self.limits, Limits):
            raise ValueError("ExecRequest.limits must be a Limits")

    def to_wire(self, session: str | None = None) -> dict:
        return {
            "files": dict(self.files),
            "argv": list(self.argv),
            "python_main": self.python_main,
            "stdin": self.stdin,
            "env": dict(self.env),
            "limits": dataclasses.asdict(self.limits),
            "collect": list(self.collect),
            "session": session,
        }


@dataclass(frozen=True)
class ExecResult:
    """What came back. `infra_error` means the sandbox failed, not the program:
    callers must never score it (verifiers raise SandboxError instead)."""

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_s: float = 0.0
    wall_s: float = 0.0
    files: Mapping[str, bytes] = field(default_factory=dict)
    error: str = ""
    backend: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"ExecResult.status must be one of {STATUSES}, got {self.status!r}")
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @classmethod
    def from_wire(cls, data: dict, backend: str) -> ExecResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and k != "backend"}, backend=backend)

    @classmethod
    def infra(cls, error: str, backend: str, wall_s: float = 0.0) -> ExecResult:
        return cls(status="infra_error", error=error, backend=backend, wall_s=wall_s)
