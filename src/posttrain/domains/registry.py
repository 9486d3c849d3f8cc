"""The domain registry: one name, one domain, each with its origin.

Invariant: a name is registered once (a duplicate raises TaskError naming
both origins), and every module in `posttrain.domains` is imported, then
every installed plugin's `posttrain.domains` entry points loaded, before the
registry is read, so a domain exists as soon as its module file (or its
plugin) does. A name `NAME@SPEC` is registered NAME's variant (`Domain.variant`: a
long-context family at another context length), made on first `get` and not listed by
`all_domains`. Domains read from files (`tasks.domains.NAME.source`) are
registered by the task pool (through byo); one may replace an earlier file domain
of the same name (a new config in the same process), never a module or plugin one.
Every registered domain's verifier has its label (`contracts.verifier.check_label`).
Their specs are also kept in the environment with the import path of what builds
them (`remember_source`), so a worker process started later (a verification
process pool, a Ray actor) rebuilds them by name; the registry itself imports
nothing above the domains.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import pkgutil

from posttrain.contracts.verifier import check_label, label
from posttrain.domains.base import Domain
from posttrain.errors import TaskError

_REGISTRY: dict[str, Domain] = {}
_VARIANTS: dict[str, Domain] = {}
"""Domains named `NAME@SPEC` (`Domain.variant`), made on first use; not listed by `all_domains`."""
_ORIGINS: dict[str, str] = {}
_LOADED = False
_NOT_DOMAINS = {"base", "registry", "plugins", "hygiene"}
SOURCE_ENV = "POSTTRAIN_SOURCE_DOMAINS"


def _default_origin(domain: Domain) -> str:
    module = type(domain).__module__
    return f"builtin ({module})" if module.startswith("posttrain.domains.") else f"module {module}"


def register(domain: Domain, origin: str | None = None) -> Domain:
    """Register `domain` under its name. TaskError for a name registered twice; TypeError, naming
    the domain and what is missing, for a verifier without its label (`check_label`: a
    non-empty string name and version, and a score)."""
    origin = origin or _default_origin(domain)
    check_label(domain.verifier, f"domain {domain.name!r} ({origin})")
    if domain.name in _REGISTRY:
        old = _ORIGINS.get(domain.name, "?")
        if not (old.startswith("file ") and origin.startswith("file ")):
            raise TaskError(f"domain {domain.name!r} is registered twice: by {old} and by {origin}")
    _REGISTRY[domain.name] = domain
    _ORIGINS[domain.name] = origin
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
    from posttrain.domains.plugins import plugin_domains

    for domain, origin in plugin_domains():
        register(domain, origin)


def origin(name: str) -> str:
    """Where a registered domain comes from: builtin (module), plugin (distribution), file (path)."""
    _load_builtin()
    return _ORIGINS.get(name, "?")


def remember_source(name: str, builder: str, spec_json: str, base_dir: str | None) -> None:
    """Keep a file domain's spec in the environment for worker processes started later, with
    `builder`, the import path (`module:function`) of `function(name, spec_json, base_dir) -> Domain`
    that rebuilds it there."""
    known = json.loads(os.environ.get(SOURCE_ENV, "{}"))
    known[name] = {"builder": builder, "spec": spec_json, "base_dir": base_dir}
    os.environ[SOURCE_ENV] = json.dumps(known)


def sources() -> str:
    """The file domains' specs this process keeps (`remember_source`), as `adopt_sources` takes them."""
    return os.environ.get(SOURCE_ENV, "{}")


def adopt_sources(specs: str) -> None:
    """A worker process's initializer: keep the parent's file-domain specs (`sources()`), so the
    worker rebuilds them whatever environment it inherited (a forkserver started before a run
    set them holds an older one)."""
    os.environ[SOURCE_ENV] = specs


def _from_environment(name: str) -> Domain | None:
    entry = json.loads(os.environ.get(SOURCE_ENV, "{}")).get(name)
    if entry is None:
        return None
    module, _, function = entry["builder"].partition(":")
    domain = getattr(importlib.import_module(module), function)(name, entry["spec"], entry["base_dir"])
    return register(domain, getattr(domain, "origin", None))  # built once per process


def get(name: str) -> Domain:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        found = _from_environment(name) or _variant(name)
        if found is not None:
            return found
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = (
            f"; did you mean {', '.join(close)}?" if close else f"; known: {len(_REGISTRY)} domains (posttrain domains)"
        )
        raise TaskError(f"unknown domain {name!r}{hint}") from None


def _variant(name: str) -> Domain | None:
    """Domain `NAME@SPEC`: registered NAME's `variant(SPEC)`, made once per process (None when
    NAME is not registered or has no variants; its TaskError for a malformed SPEC)."""
    base, at, spec = name.partition("@")
    if not at or base not in _REGISTRY:
        return None
    if name not in _VARIANTS:
        made = _REGISTRY[base].variant(spec)
        if made is None:
            return None
        if made.name != name:
            raise TaskError(f"domain {base!r}: variant({spec!r}) is named {made.name!r}, not {name!r}")
        check_label(made.verifier, f"domain {name!r} (variant of {base})")
        _VARIANTS[name] = made
        _ORIGINS[name] = f"variant of {base}: {_ORIGINS.get(base, '?')}"
    return _VARIANTS[name]


def all_domains() -> dict[str, Domain]:
    _load_builtin()
    return dict(sorted(_REGISTRY.items()))


def verifier_label(name: str) -> str:
    """The label of domain `name`'s verifier, `name@version` (the trace row's `verifier`)."""
    return label(get(name).verifier)
