"""Plugin verifiers: installed packages that add verifiers through entry points.

Invariant: entry points are read once per process. (Plugin domains, the
`posttrain.domains` group, are loaded by the registry: `domains/plugins.py`.) A
`posttrain.verifiers` entry point loads a verifier factory called with the
spec's parameters (validated first by its `Params` pydantic model, when it
has one); its entry point name is the verifier's name. A plugin that fails to
load, or a name that clashes, is a TaskError naming both origins.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from posttrain.domains.plugins import load, origin_of
from posttrain.errors import TaskError

VERIFIERS_GROUP = "posttrain.verifiers"


@lru_cache(maxsize=1)
def plugin_verifiers() -> dict[str, tuple[Callable[[Any], Any], str]]:
    """name -> (factory, origin) for every verifier that installed plugins declare."""
    from posttrain.byo.verifiers import BUILTIN

    out: dict[str, tuple[Callable[[Any], Any], str]] = {}
    for ep in sorted(entry_points(group=VERIFIERS_GROUP), key=lambda e: e.name):
        origin = origin_of(ep)
        if ep.name in BUILTIN:
            raise TaskError(f"verifier name {ep.name!r} clashes: built-in (posttrain.byo.verifiers) and {origin}")
        if ep.name in out:
            raise TaskError(f"verifier name {ep.name!r} clashes: {out[ep.name][1]} and {origin}")
        factory = load(ep)
        if not callable(factory):
            raise TaskError(f"{origin}: verifier {ep.name} is a {type(factory).__name__}, not a class or factory")
        out[ep.name] = (factory, origin)
    return out
