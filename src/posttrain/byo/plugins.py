"""Plugins: installed packages that add domains and verifiers through entry points.

Invariant: entry points are read once per process. A `posttrain.domains`
entry point loads a Domain instance, a Domain subclass (instantiated with no
arguments) or a callable returning an iterable of Domains; each is
registered with the origin `plugin <distribution> (<module:attr>)`. A
`posttrain.verifiers` entry point loads a verifier factory called with the
spec's parameters (validated first by its `Params` pydantic model, when it
has one); its entry point name is the verifier's name. A plugin that fails to
load, or a name that clashes, is a TaskError naming both origins.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from posttrain.errors import TaskError

DOMAINS_GROUP = "posttrain.domains"
VERIFIERS_GROUP = "posttrain.verifiers"


def origin_of(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = f"{dist.name} {dist.version}" if dist is not None else "?"
    return f"plugin {name} ({ep.value})"


def _load(ep: EntryPoint) -> Any:
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - a plugin's import is user code
        raise TaskError(
            f"{origin_of(ep)}: entry point {ep.group}:{ep.name} fails to load: {type(exc).__name__}: {exc}"
        ) from None


def plugin_domains() -> Iterable[tuple[Any, str]]:
    """(domain, origin) for every domain that installed plugins declare."""
    from posttrain.domains.base import Domain

    for ep in sorted(entry_points(group=DOMAINS_GROUP), key=lambda e: e.name):
        obj, origin = _load(ep), origin_of(ep)
        if inspect.isclass(obj) and issubclass(obj, Domain):
            obj = obj()
        items = [obj] if isinstance(obj, Domain) else obj() if callable(obj) else obj
        try:
            items = list(items)
        except TypeError:
            raise TaskError(f"{origin}: entry point {ep.name} gives a {type(obj).__name__}, not a Domain "
                            "(or a class or callable giving Domains)") from None
        for d in items:
            if not isinstance(d, Domain):
                raise TaskError(f"{origin}: entry point {ep.name} gives a {type(d).__name__}, not a Domain")
            yield d, origin


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
        factory = _load(ep)
        if not callable(factory):
            raise TaskError(f"{origin}: verifier {ep.name} is a {type(factory).__name__}, not a class or factory")
        out[ep.name] = (factory, origin)
    return out
