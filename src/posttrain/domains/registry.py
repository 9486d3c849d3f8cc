"""The domain registry: one name, one domain.

Invariant: a name is registered once (a duplicate raises ValueError), and
every module in `posttrain.domains` is imported before the registry is read,
so a domain exists as soon as its module file does.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil

from posttrain.domains.base import Domain
from posttrain.errors import TaskError

_REGISTRY: dict[str, Domain] = {}
_LOADED = False
_NOT_DOMAINS = {"base", "registry"}


def register(domain: Domain) -> Domain:
    if domain.name in _REGISTRY:
        raise ValueError(f"domain {domain.name!r} is registered twice")
    _REGISTRY[domain.name] = domain
    return domain


def _load_builtin() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import posttrain.domains as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _NOT_DOMAINS and not info.name.startswith("_"):
            importlib.import_module(f"posttrain.domains.{info.name}")


def get(name: str) -> Domain:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {len(_REGISTRY)} domains (posttrain domains)"
        raise TaskError(f"unknown domain {name!r}{hint}") from None


def all_domains() -> dict[str, Domain]:
    _load_builtin()
    return dict(sorted(_REGISTRY.items()))
