"""Plugin domains: installed packages that add domains through `posttrain.domains` entry points.

Invariant: entry points are read once per process (by the registry, before it is
read). An entry point loads a Domain instance, a Domain subclass (instantiated with
no arguments) or a callable returning an iterable of Domains; each comes with the
origin `plugin <distribution> (<module:attr>)`. A plugin that fails to load, or gives
something that is not a Domain, is a TaskError naming its origin. Plugin verifiers
(`posttrain.verifiers` entry points) are byo's (`byo/plugins.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from posttrain.domains.base import Domain
from posttrain.errors import TaskError

DOMAINS_GROUP = "posttrain.domains"


def origin_of(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = f"{dist.name} {dist.version}" if dist is not None else "?"
    return f"plugin {name} ({ep.value})"


def load(ep: EntryPoint) -> Any:
    """What an entry point names; TaskError naming the plugin when its import fails."""
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - a plugin's import is user code
        raise TaskError(
            f"{origin_of(ep)}: entry point {ep.group}:{ep.name} fails to load: {type(exc).__name__}: {exc}"
        ) from None


def plugin_domains() -> Iterable[tuple[Domain, str]]:
    """(domain, origin) for every domain that installed plugins declare."""
    for ep in sorted(entry_points(group=DOMAINS_GROUP), key=lambda e: e.name):
        obj, origin = load(ep), origin_of(ep)
        if inspect.isclass(obj) and issubclass(obj, Domain):
            obj = obj()
        items = [obj] if isinstance(obj, Domain) else obj() if callable(obj) else obj
        try:
            items = list(items)
        except TypeError:
            raise TaskError(
                f"{origin}: entry point {ep.name} gives a {type(obj).__name__}, not a Domain "
                "(or a class or callable giving Domains)"
            ) from None
        for d in items:
            if not isinstance(d, Domain):
                raise TaskError(f"{origin}: entry point {ep.name} gives a {type(d).__name__}, not a Domain")
            yield d, origin
